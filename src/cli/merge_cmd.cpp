// `alpaca-train merge --model_name_or_path BASE --adapter DIR --output_dir OUT`: a LoRA adapter
// merged into its base as a plain HF directory (ckpt/lora_merge.h), one tensor at a time.
#include "alpaca/ckpt/lora_merge.h"
#include "alpaca/cli/commands.h"
#include "alpaca/cli/subcommand_flags.h"
#include "alpaca/io/hf_model.h"
#include "alpaca/util/error.h"
#include "alpaca/util/log.h"

namespace alpaca::cli {

int run_merge(const std::vector<std::string>& args) {
  std::string base, adapter, output_dir, shard_size = "5GB";
  const Subcommand cmd{"merge", "Merge a LoRA adapter (alpaca-train --use_peft output) into its base model.",
                       {{"--model_name_or_path", &base, "The base HF model directory the adapter was trained on", true},
                        {"--adapter", &adapter, "The adapter directory (adapter_config.json, adapter_model.safetensors)", true},
                        {"--output_dir", &output_dir, "Where the merged HF model is written", true},
                        {"--save_max_shard_size", &shard_size, "Largest safetensors shard, e.g. 5GB, 200MB"}}};
  if (parse_subcommand_flags(cmd, args).help) return 0;
  const ckpt::MergeStats s = ckpt::merge_lora_adapter(base, adapter, output_dir, io::parse_shard_size(shard_size));
  ALPACA_INFO("merge: wrote " << s.num_tensors << " tensors (" << s.num_merged << " linears merged, vocabulary "
              << s.vocab_size << ") to " << output_dir << "; RSS grew by " << s.peak_rss_growth / (1 << 20) << " MiB");
  return 0;
}

}  // namespace alpaca::cli
