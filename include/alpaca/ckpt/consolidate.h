// `alpaca-train consolidate CHECKPOINT OUT`: a sharded training checkpoint (sharded/, written by
// every rank) turned into a plain Hugging Face directory offline, as torch's
// _consolidate_hf_safetensors does: config.json, safetensors weights (sharded with an index above
// max_shard_bytes), generation_config.json and the tokenizer files. One tensor in memory at a time.
#pragma once

#include <cstdint>
#include <filesystem>

namespace alpaca::ckpt {

struct ConsolidateStats {
  int64_t num_tensors = 0;
  int64_t bytes = 0;
};

// Throws naming the checkpoint when it is not a complete sharded checkpoint (checkpoint_problem).
ConsolidateStats consolidate_checkpoint(const std::filesystem::path& checkpoint_dir, const std::filesystem::path& out_dir,
                                        int64_t max_shard_bytes);

}  // namespace alpaca::ckpt
