// `alpaca-train merge --model_name_or_path BASE --adapter DIR --output_dir OUT`: a LoRA adapter
// merged into its base as a plain HF directory (ckpt/lora_merge.h), one tensor at a time.
#include <iostream>

#include <CLI/CLI.hpp>  // defines: CLI::App

#include "alpaca/ckpt/lora_merge.h"
#include "alpaca/cli/commands.h"
#include "alpaca/io/hf_model.h"
#include "alpaca/util/error.h"
#include "alpaca/util/log.h"

namespace alpaca::cli {

int run_merge(const std::vector<std::string>& args) {
  CLI::App app{"Merge a LoRA adapter (alpaca-train --use_peft output) into its base model", "alpaca-train merge"};
  std::string base, adapter, output_dir, shard_size = "5GB";
  app.add_option("--model_name_or_path", base, "The base HF model directory the adapter was trained on")->required();
  app.add_option("--adapter", adapter, "The adapter directory (adapter_config.json, adapter_model.safetensors)")->required();
  app.add_option("--output_dir", output_dir, "Where the merged HF model is written")->required();
  app.add_option("--save_max_shard_size", shard_size, "Largest safetensors shard, e.g. 5GB, 200MB")->capture_default_str();
  std::vector<std::string> argv(args.rbegin(), args.rend());  // CLI11 parses a reversed vector
  try {
    app.parse(argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    ALPACA_FAIL("merge: " << e.what() << " (see alpaca-train merge --help)");
  }
  const ckpt::MergeStats s = ckpt::merge_lora_adapter(base, adapter, output_dir, io::parse_shard_size(shard_size));
  ALPACA_INFO("merge: wrote " << s.num_tensors << " tensors (" << s.num_merged << " linears merged, vocabulary "
              << s.vocab_size << ") to " << output_dir << "; RSS grew by " << s.peak_rss_growth / (1 << 20) << " MiB");
  return 0;
}

}  // namespace alpaca::cli
