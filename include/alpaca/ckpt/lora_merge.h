// Merging a peft LoRA adapter (adapter_config.json + adapter_model.safetensors, as alpaca-train
// --use_peft writes it) into its base model, streamed one base tensor at a time so memory stays
// bounded by the largest tensor: W' = W + s * B A for every adapted linear (peft's merge_and_unload),
// modules_to_save replace their base tensors, and trainable-token rows ([PAD]) grow / overwrite
// the embedding and lm_head rows. The result is a plain HF directory transformers loads.
#pragma once

#include <cstdint>
#include <string>

namespace alpaca::ckpt {

struct MergeStats {
  int64_t num_tensors = 0;      // tensors written
  int64_t num_merged = 0;       // linears that received B A
  int64_t vocab_size = 0;       // of the merged model
  int64_t peak_rss_growth = 0;  // bytes, while merging
};

// Throws alpaca::Error naming the file and key on anything it cannot merge exactly (another peft
// type, DoRA, biases, an adapter key that matches no base tensor, shape mismatches).
MergeStats merge_lora_adapter(const std::string& base_dir, const std::string& adapter_dir, const std::string& out_dir,
                              int64_t max_shard_bytes = 5'000'000'000);

}  // namespace alpaca::ckpt
