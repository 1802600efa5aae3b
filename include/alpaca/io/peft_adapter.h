// A peft LoRA adapter directory (adapter_config.json + adapter_model.safetensors in peft's key
// layout: "base_model.model.<name>.lora_A.weight" / ".lora_B.weight", modules_to_save as
// "base_model.model.<name>", trainable tokens as "base_model.model.<module>.token_adapter.
// trainable_tokens_delta" with trainable_token_indices in the config), read once for both of its
// users: the merge (ckpt/lora_merge.h) and generation with an unmerged adapter (attach_lora_adapter).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "alpaca/io/safetensors.h"

namespace alpaca::model {
class LlamaForCausalLMImpl;
}

namespace alpaca::ckpt {

inline constexpr const char* kPeftKeyPrefix = "base_model.model.";

struct LoraAdapter {
  std::string dir;
  int64_t r = 0;
  double scaling = 0;  // lora_alpha / r, or / sqrt(r) with use_rslora
  // Base tensor name ("model.embed_tokens.weight", "lm_head.weight") -> the vocabulary rows its
  // trainable_tokens_delta replaces, in delta order.
  std::map<std::string, std::vector<int64_t>> token_rows;
  std::shared_ptr<io::SafetensorsFile> file;  // adapter_model.safetensors

  // The vocabulary after the trainable tokens: max(base_vocab, largest row + 1).
  int64_t vocab_size(int64_t base_vocab) const;
  // Full module names that have lora_A / lora_B in the file, in file order.
  std::vector<std::string> lora_modules() const;
};

// Reads and checks adapter_config.json and opens the weights. Throws alpaca::Error naming the file
// on anything that cannot be applied exactly (another peft type, DoRA, LoRA biases, fan_in_fan_out,
// rank/alpha patterns, malformed trainable_token_indices).
LoraAdapter read_lora_adapter(const std::string& adapter_dir);

// Applies the adapter to a loaded base `m` without merging, so the forward is peft's unmerged
// math: LoRA modules (model/lora.h) are attached to the adapted linears and receive A and B (in the
// base's dtype and device, dropout off), modules_to_save tensors replace the base's, and the
// trainable-token rows overwrite (after growing, if the adapter adds rows) the embedding /
// lm_head rows, which is what peft's TrainableTokensLayer computes. Throws alpaca::Error naming
// the key and the base when the adapter does not fit (a module it adapts is missing, or a shape
// differs): it was trained on another base. Returns the number of adapted linears.
int64_t attach_lora_adapter(model::LlamaForCausalLMImpl& m, const LoraAdapter& adapter, const std::string& base_dir);

}  // namespace alpaca::ckpt
