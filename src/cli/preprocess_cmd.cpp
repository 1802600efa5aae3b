// `alpaca-train preprocess`: tokenizes an Alpaca dataset exactly as training does and writes
// one JSON line per example, then prints what the data looks like to the model: counts, length
// percentiles, truncations and examples left without label tokens. Useful to pick
// --model_max_length and to check a dataset before a long run.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "alpaca/cli/commands.h"
#include "alpaca/cli/subcommand_flags.h"
#include "alpaca/cli/usage_error.h"
#include "alpaca/data/alpaca_example.h"
#include "alpaca/data/alpaca_record.h"
#include "alpaca/data/collate.h"
#include "alpaca/data/packing.h"
#include "alpaca/data/tokenizer.h"
#include "alpaca/util/error.h"
#include "alpaca/util/sys.h"

namespace alpaca::cli {
namespace {

// Nearest-rank percentile of sorted values.
int64_t percentile(const std::vector<int64_t>& sorted, double p) {
  if (sorted.empty()) return 0;
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * sorted.size()));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

// One JSON line per example, written under a temporary name and renamed, so a failed run leaves
// no half file.
void write_examples(const std::string& output, const std::vector<data::Example>& examples, bool packing) {
  const std::string tmp = output + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    ALPACA_CHECK(out.good(), "cannot write " << tmp << "; check --output");
    for (const auto& ex : examples) {
      nlohmann::json j = {{"input_ids", ex.input_ids}, {"labels", ex.labels}};
      if (packing) {
        j["position_ids"] = ex.position_ids;
        j["segment_ids"] = ex.segment_ids;
      }
      out << j.dump() << "\n";
    }
    out.close();
    ALPACA_CHECK(out.good(), "failed writing " << tmp << " (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, output, ec);
  ALPACA_CHECK(!ec, "cannot rename " << tmp << " to " << output << ": " << ec.message());
}

}  // namespace

int run_preprocess(const std::vector<std::string>& args) {
  std::string data_path, model_dir, tokenizer_path, output;
  int64_t model_max_length = 512;
  int num_threads = 0;
  bool packing = false;
  bool use_fast_tokenizer = false;
  const Subcommand cmd{
      "preprocess", "Tokenize an Alpaca dataset as training does and report its statistics.",
      {{"--data_path", &data_path, "Alpaca JSON array or JSON Lines file", true},
       {"--model_name_or_path", &model_dir,
        "Model directory holding tokenizer.model or tokenizer.json (+ tokenizer_config.json ...)"},
       {"--tokenizer", &tokenizer_path,
        "Tokenizer directory, tokenizer.model or tokenizer.json file (instead of --model_name_or_path)"},
       {"--output", &output, "Where to write the tokenized examples (JSON Lines)", true},
       {"--model_max_length", &model_max_length, "Maximum sequence length; longer examples are truncated on the right"},
       {"--packing", &packing, "Pack examples into --model_max_length blocks (position/segment ids per example)"},
       {"--use_fast_tokenizer", &use_fast_tokenizer,
        "Use tokenizer.json when the directory also has tokenizer.model (default: tokenizer.model)"},
       {"--num_threads", &num_threads, "Tokenizer threads (0 = every core)"}}};
  if (parse_subcommand_flags(cmd, args).help) return 0;
  ALPACA_USAGE_CHECK(model_dir.empty() != tokenizer_path.empty(),
                     "preprocess: give exactly one of --model_name_or_path and --tokenizer");
  ALPACA_USAGE_CHECK(model_max_length > 0, "--model_max_length must be positive, got " << model_max_length);

  sys::Timer timer;
  auto records = data::load_alpaca_records(data_path);
  data::Tokenizer tok = data::Tokenizer::load(model_dir.empty() ? tokenizer_path : model_dir, use_fast_tokenizer);
  // As train.py: missing special tokens are added ([PAD] etc.; they can appear in the text).
  tok.add_missing_special_tokens();
  const double load_s = timer.seconds();
  timer.reset();
  data::TokenizeStats tstats;
  auto examples = data::tokenize_alpaca(records, tok, model_max_length, num_threads, &tstats);
  const double tok_s = timer.seconds();

  std::vector<int64_t> lengths;
  int64_t label_tokens = 0;
  for (const auto& ex : examples) {
    lengths.push_back(static_cast<int64_t>(ex.input_ids.size()));
    label_tokens += data::count_label_tokens(ex);
  }
  std::vector<int64_t> sorted = lengths;
  std::sort(sorted.begin(), sorted.end());
  int64_t total = 0;
  for (int64_t l : lengths) total += l;

  data::PackingStats pstats;
  const std::vector<data::Example>& out_examples =
      packing ? (examples = data::pack_examples(examples, model_max_length, &pstats)) : examples;

  write_examples(output, out_examples, packing);

  const int64_t n = static_cast<int64_t>(examples.size());
  std::cout << "records:            " << records.size() << "\n"
            << "tokenizer:          vocab " << tok.vocab_size() << ", pad id " << *tok.pad_id()
            << "\n"
            << "tokens:             " << total << " (" << label_tokens << " label tokens)\n"
            << "length (tokens):    min " << sorted.front() << ", p50 " << percentile(sorted, 50)
            << ", p90 " << percentile(sorted, 90) << ", p99 " << percentile(sorted, 99)
            << ", max " << sorted.back() << ", mean "
            << static_cast<double>(total) / static_cast<double>(records.size()) << "\n"
            << "truncated:          " << tstats.num_truncated << " (longer than "
            << model_max_length << ")\n"
            << "no label tokens:    " << tstats.num_no_label_tokens
            << " (the prompt fills the window; they add nothing to the loss)\n";
  if (packing)
    std::cout << "packed blocks:      " << pstats.num_blocks << " (fill " << pstats.fill_ratio
              << ")\n";
  std::cout << "written:            " << (packing ? pstats.num_blocks : n) << " lines to "
            << output << "\n"
            << "time:               load " << load_s << " s, tokenize " << tok_s << " s ("
            << static_cast<double>(records.size()) / std::max(tok_s, 1e-9) << " records/s)\n";
  return 0;
}

}  // namespace alpaca::cli
