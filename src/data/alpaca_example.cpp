// Alpaca prompt formatting and the parallel tokenization of a dataset (train.py's preprocess).
#include "alpaca/data/alpaca_example.h"

#include <algorithm>
#include <optional>

#include "alpaca/util/error.h"
#include "parallel_for.h"

namespace alpaca::data {
namespace {

// The templates of stanford_alpaca train.py PROMPT_DICT, byte for byte.
constexpr const char* kPromptInputHead =
    "Below is an instruction that describes a task, paired with an input that provides further "
    "context. Write a response that appropriately completes the request.\n\n### Instruction:\n";
constexpr const char* kPromptInputMid = "\n\n### Input:\n";
constexpr const char* kPromptNoInputHead =
    "Below is an instruction that describes a task. Write a response that appropriately "
    "completes the request.\n\n### Instruction:\n";
constexpr const char* kPromptTail = "\n\n### Response:";

}  // namespace

std::string format_alpaca_prompt(const AlpacaRecord& r) {
  if (!r.input.empty())
    return kPromptInputHead + r.instruction + kPromptInputMid + r.input + kPromptTail;
  return kPromptNoInputHead + r.instruction + kPromptTail;
}

std::vector<Example> tokenize_alpaca(const std::vector<AlpacaRecord>& records,
                                     const tokenizer::Tokenizer& tokenizer, int64_t model_max_length,
                                     int num_threads, TokenizeStats* stats) {
  ALPACA_CHECK(model_max_length > 0,
               "--model_max_length must be positive, got " << model_max_length);
  tokenizer.check_special_tokens();
  const int64_t n = static_cast<int64_t>(records.size());
  std::vector<Example> examples(records.size());
  std::vector<char> truncated(records.size(), 0);
  const std::string eos = tokenizer.eos_token();
  const std::optional<int64_t> pad = tokenizer.pad_id();

  auto work = [&](int64_t i) {
    const AlpacaRecord& r = records[i];
    std::string source = format_alpaca_prompt(r);
    // Truncation as HF's (max_length, truncation=True): the special tokens stay, the text is cut.
    bool cut = false;
    std::vector<int64_t> full = tokenizer.encode_truncated(source + r.output + eos, model_max_length, &cut);
    truncated[i] = cut ? 1 : 0;
    // The source is tokenized on its own and its (truncated) length masks the labels; the two
    // tokenizations are not checked against each other, as in train.py. Its length is train.py's
    // input_ids.ne(pad_token_id).sum(): a pad token inside the source is not counted (pad = bos: every
    // row's BOS; a "[PAD]" typed in an instruction), so as many more of the last prompt tokens train.
    const std::vector<int64_t> source_ids = tokenizer.encode_truncated(source, model_max_length);
    const int64_t source_len = pad ? std::count_if(source_ids.begin(), source_ids.end(),
                                                   [&](int64_t id) { return id != *pad; })
                                   : static_cast<int64_t>(source_ids.size());
    Example& ex = examples[i];
    ex.labels = full;
    std::fill(ex.labels.begin(),
              ex.labels.begin() + std::min<int64_t>(source_len, ex.labels.size()), kIgnoreIndex);
    ex.input_ids = std::move(full);
  };

  detail::parallel_for(n, num_threads, work);

  if (stats) {
    *stats = TokenizeStats{};
    for (int64_t i = 0; i < n; ++i) {
      stats->num_truncated += truncated[i];
      bool any = std::any_of(examples[i].labels.begin(), examples[i].labels.end(),
                             [](int64_t l) { return l != kIgnoreIndex; });
      stats->num_no_label_tokens += any ? 0 : 1;
    }
  }
  return examples;
}

}  // namespace alpaca::data
