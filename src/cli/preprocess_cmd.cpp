// `alpaca-train preprocess`: tokenizes an Alpaca dataset exactly as training does and writes
// one JSON line per example, then prints what the data looks like to the model: counts, length
// percentiles, truncations and examples left without label tokens. Useful to pick
// --model_max_length and to check a dataset before a long run.
#include <CLI/CLI.hpp>  // defines: CLI::App

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "alpaca/cli/commands.h"
#include "alpaca/data/alpaca_example.h"
#include "alpaca/data/alpaca_record.h"
#include "alpaca/data/collate.h"
#include "alpaca/data/conversation.h"
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

}  // namespace

int run_preprocess(const std::vector<std::string>& args) {
  CLI::App app{"Tokenize an Alpaca dataset as training does and report its statistics",
               "alpaca-train preprocess"};
  std::string data_path, model_dir, tokenizer_path, output, dataset_format = "auto";
  int64_t model_max_length = 512;
  int num_threads = 0;
  bool packing = false;
  bool use_fast_tokenizer = false;
  app.add_option("--data_path", data_path,
                 "Dataset: JSON array, JSON Lines, Parquet or a datasets.save_to_disk directory; "
                 "several comma-separated paths are concatenated")
      ->required();
  app.add_option("--dataset_format", dataset_format,
                 "auto (detect per file) / alpaca / messages / sharegpt / prompt_completion")
      ->check(CLI::IsMember({"auto", "alpaca", "messages", "sharegpt", "prompt_completion"}))
      ->capture_default_str();
  app.add_option("--model_name_or_path", model_dir,
                 "Model directory holding tokenizer.model or tokenizer.json (+ tokenizer_config.json ...)");
  app.add_option("--tokenizer", tokenizer_path,
                 "Tokenizer directory, tokenizer.model or tokenizer.json file (instead of --model_name_or_path)");
  app.add_option("--output", output, "Where to write the tokenized examples (JSON Lines)")
      ->required();
  app.add_option("--model_max_length", model_max_length,
                 "Maximum sequence length; longer examples are truncated on the right")
      ->capture_default_str();
  app.add_flag("--packing", packing,
               "Pack examples into --model_max_length blocks (position/segment ids per example)");
  app.add_flag("--use_fast_tokenizer", use_fast_tokenizer,
               "Use tokenizer.json when the directory also has tokenizer.model (default: tokenizer.model)");
  app.add_option("--num_threads", num_threads, "Tokenizer threads (0 = every core)")
      ->capture_default_str();
  // HF-style booleans ("--packing True") as well as the bare flag: fold a following boolean word
  // into "--packing=<word>", which CLI11 reads for flags.
  std::vector<std::string> folded;
  for (size_t i = 0; i < args.size(); ++i) {
    static const std::vector<std::string> kWords = {"True", "False", "true", "false", "1", "0"};
    if ((args[i] == "--packing" || args[i] == "--use_fast_tokenizer") && i + 1 < args.size() &&
        std::find(kWords.begin(), kWords.end(), args[i + 1]) != kWords.end()) {
      folded.push_back(args[i] + "=" + args[i + 1]);
      ++i;
    } else {
      folded.push_back(args[i]);
    }
  }
  std::vector<std::string> argv(folded.rbegin(), folded.rend());  // CLI11 parses reversed
  try {
    app.parse(argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    ALPACA_FAIL("preprocess: " << e.what() << " (see alpaca-train preprocess --help)");
  }
  ALPACA_CHECK(model_dir.empty() != tokenizer_path.empty(),
               "preprocess: give exactly one of --model_name_or_path and --tokenizer");
  ALPACA_CHECK(model_max_length > 0, "--model_max_length must be positive, got "
                                         << model_max_length);

  sys::Timer timer;
  const auto dataset = data::load_dataset(data_path, data::parse_dataset_format(dataset_format));
  data::require_alpaca_rows(dataset.files, "--data_path");
  const auto records = dataset.alpaca_records();
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

  // Written under a temporary name and renamed, so a failed run leaves no half file.
  const std::string tmp = output + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    ALPACA_CHECK(out.good(), "cannot write " << tmp << "; check --output");
    for (const auto& ex : out_examples) {
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
