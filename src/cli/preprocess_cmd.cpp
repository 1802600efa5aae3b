// `alpaca-train preprocess`: tokenizes a dataset (every format) exactly as training does and writes
// one JSON line per example, then prints what the data looks like to the model: counts, length
// percentiles, truncations and examples left without label tokens. Useful to pick
// --model_max_length and to check a dataset before a long run.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "alpaca/cli/commands.h"
#include "alpaca/cli/subcommand_flags.h"
#include "alpaca/cli/usage_error.h"
#include "alpaca/data/alpaca_example.h"
#include "alpaca/data/alpaca_record.h"
#include "alpaca/data/collate.h"
#include "alpaca/data/conversation.h"
#include "alpaca/data/conversation_example.h"
#include "alpaca/data/packing.h"
#include "alpaca/tokenizer/tokenizer.h"
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

// What the data looks like to the model: counts, length percentiles, truncations, labels.
void print_report(const std::vector<data::Example>& examples, const data::MaskStats& ms, const tokenizer::Tokenizer& tok,
                  int64_t model_max_length) {
  std::vector<int64_t> sorted;
  int64_t total = 0;
  for (const auto& ex : examples) {
    sorted.push_back(static_cast<int64_t>(ex.input_ids.size()));
    total += sorted.back();
  }
  std::sort(sorted.begin(), sorted.end());
  std::cout << "records:            " << ms.num_rows << "\n"
            << "tokenizer:          vocab " << tok.vocab_size() << ", pad id " << *tok.pad_id() << "\n"
            << "tokens:             " << total << " (" << ms.num_trained << " label tokens)\n"
            << "loss mask:          " << data::describe_mask_stats(ms, model_max_length) << "\n";
  if (!sorted.empty())
    std::cout << "length (tokens):    min " << sorted.front() << ", p50 " << percentile(sorted, 50) << ", p90 "
              << percentile(sorted, 90) << ", p99 " << percentile(sorted, 99) << ", max " << sorted.back()
              << ", mean " << static_cast<double>(total) / static_cast<double>(sorted.size()) << "\n";
  std::cout << "truncated:          " << ms.num_truncated << " (longer than " << model_max_length << ")\n"
            << "no label tokens:    " << ms.num_no_label + ms.num_dropped + ms.num_kept_no_label
            << " (the prompt fills the window; they add nothing to the loss)\n";
}

}  // namespace

int run_preprocess(const std::vector<std::string>& args) {
  std::string data_path, model_dir, tokenizer_path, output, dataset_format = "auto", dataset_text_field = "text",
      chat_template, packing_strategy = "bfd", eos_token, pad_token;
  int64_t model_max_length = 512, seed = 42;
  int num_threads = 0;
  bool shuffle_dataset = false, packing = false, use_fast_tokenizer = false, assistant_only_loss = false, completion_only_loss = true;
  const Subcommand cmd{
      "preprocess", "Tokenize a dataset (any format) as training does and report its statistics.",
      {{"--data_path", &data_path,
        "Dataset: JSON array, JSON Lines, Parquet, CSV or a datasets.save_to_disk directory; several "
        "comma-separated paths are concatenated", true},
       {"--dataset_format", &dataset_format, "auto (detect per file) / alpaca / messages / sharegpt / prompt_completion / text / tokenized"},
       {"--dataset_text_field", &dataset_text_field, "The field holding a text row's text (TRL's dataset_text_field)"},
       {"--model_name_or_path", &model_dir,
        "Model directory holding tokenizer.model or tokenizer.json (+ tokenizer_config.json, chat template ...)"},
       {"--tokenizer", &tokenizer_path,
        "Tokenizer directory, tokenizer.model or tokenizer.json file (instead of --model_name_or_path)"},
       {"--chat_template", &chat_template, "Jinja chat template file for conversation rows (instead of the model's)",
        false, {"--chat_template_path"}},
       {"--eos_token", &eos_token, "TRL's eos_token: the tokenizer's eos for this run (a token in the vocabulary)"},
       {"--pad_token", &pad_token, "TRL's pad_token: the pad token (a token in the vocabulary)"},
       {"--assistant_only_loss", &assistant_only_loss, "Conversation rows: label only the assistant tokens (TRL)"},
       {"--completion_only_loss", &completion_only_loss,
        "Prompt-completion rows: label only the completion (TRL; unset = True for them, and for tokenized rows' "
        "completion_mask only when their file has prompt and completion columns)"},
       {"--output", &output, "Where to write the tokenized examples (JSON Lines)", true},
       {"--model_max_length", &model_max_length, "Maximum sequence length; longer examples are truncated on the right",
        false, {"--max_length", "--max_seq_length"}},
       {"--packing", &packing, "Pack examples into --model_max_length blocks as TRL does (position/segment ids)"},
       {"--packing_strategy", &packing_strategy, "With --packing: bfd (TRL's default) or wrapped"},
       {"--shuffle_dataset", &shuffle_dataset,
        "Shuffle the rows as TRL does (datasets' shuffle with --seed, before packing and after)"},
       {"--seed", &seed, "The seed of --shuffle_dataset (TrainingArguments' seed; default 42)"},
       {"--use_fast_tokenizer", &use_fast_tokenizer,
        "Use tokenizer.json when the directory also has tokenizer.model (default: tokenizer.model)"},
       {"--num_threads", &num_threads, "Tokenizer threads (0 = every core)"}}};
  const ParsedFlags parsed = parse_subcommand_flags(cmd, args);
  if (parsed.help) return 0;
  // Unset is TRL's None, as for train: prompt-completion rows train the completion, a tokenized
  // row's completion_mask is applied only when the flag says True.
  const std::optional<bool> completion_only =
      parsed.was_given("--completion_only_loss") ? std::optional<bool>(completion_only_loss) : std::nullopt;
  ALPACA_USAGE_CHECK(model_dir.empty() != tokenizer_path.empty(),
                     "preprocess: give exactly one of --model_name_or_path and --tokenizer");
  ALPACA_USAGE_CHECK(model_max_length > 0, "--model_max_length must be positive, got " << model_max_length);
  ALPACA_USAGE_CHECK(!shuffle_dataset || seed >= 0, "--shuffle_dataset with --seed " << seed << ": datasets' shuffle "
                     "(NumPy's default_rng) takes a seed >= 0; give a non-negative --seed");
  data::RowFormat row_format;
  try {
    row_format = data::parse_row_format(dataset_format, dataset_text_field);  // its errors name the flags
  } catch (const Error& e) {
    ALPACA_USAGE_FAIL(e.message());
  }
  ALPACA_USAGE_CHECK(chat_template.empty() || std::filesystem::is_regular_file(chat_template),
                     "--chat_template " << chat_template << " is not a file (a Jinja chat template is needed)");

  sys::Timer timer;
  const std::string tok_source = model_dir.empty() ? tokenizer_path : model_dir;
  tokenizer::Tokenizer tok = tokenizer::Tokenizer::load(tok_source, use_fast_tokenizer);
  // As train.py for Alpaca records (missing special tokens are added: [PAD] etc., they can appear
  // in the text), as TRL for conversation data (nothing added; pad = eos), after --eos_token / --pad_token.
  data::prepare_special_tokens(tok, data_path, "", row_format, eos_token, pad_token);
  const double load_s = timer.seconds();
  timer.reset();
  data::MaskStats ms;
  const std::filesystem::path tmpl_dir = std::filesystem::is_directory(tok_source)
                                             ? std::filesystem::path(tok_source)
                                             : std::filesystem::path(tok_source).parent_path();
  const auto strategy = data::parse_packing_strategy(packing_strategy);
  auto examples = data::load_examples(
      data_path, row_format, tok, tmpl_dir, chat_template,
      data::run_mask_options(assistant_only_loss, completion_only, model_max_length, packing, packing_strategy),
      num_threads, &ms);
  const double tok_s = timer.seconds();
  print_report(examples, ms, tok, model_max_length);

  data::PackingStats pstats;
  examples = data::pack_and_shuffle(std::move(examples), packing ? std::optional(strategy) : std::nullopt,
                                    model_max_length, &pstats,
                                    shuffle_dataset ? std::optional(static_cast<uint64_t>(seed)) : std::nullopt);
  write_examples(output, examples, packing);
  if (packing)
    std::cout << "packed blocks:      " << pstats.num_blocks << " (fill " << pstats.fill_ratio << ")\n";
  if (!examples.empty() && !packing) {
    // The end of the first example, so a user sees the EOS train.py appends (id and piece).
    const auto& ids = examples.front().input_ids;
    const size_t k = std::min<size_t>(ids.size(), 6);
    std::cout << "first example ends: " << tok.describe_ids({ids.end() - static_cast<std::ptrdiff_t>(k), ids.end()})
              << " (eos " << tok.eos_id() << ", tokenizer " << tok.source()
              << (tok.tokenizer_class().empty() ? "" : " as " + tok.tokenizer_class()) << ")\n";
  }
  std::cout << "written:            " << examples.size() << " lines to " << output << "\n"
            << "time:               load " << load_s << " s, tokenize " << tok_s << " s ("
            << static_cast<double>(ms.num_rows) / std::max(tok_s, 1e-9) << " records/s)\n";
  return 0;
}

}  // namespace alpaca::cli
