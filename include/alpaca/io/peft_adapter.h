// The peft LoRA adapter format, in one place (io/: the Hugging Face format boundary). A directory
// holds adapter_config.json + adapter_model.safetensors in peft's key layout:
// "base_model.model.<name>.lora_A.weight" / ".lora_B.weight", modules_to_save as
// "base_model.model.<name>", trainable tokens as "base_model.model.<module>.token_adapter.
// trainable_tokens_delta" with trainable_token_indices in the config. Written by the trainer
// (peft_adapter_config_json, peft_key: train/trainer_lora.cpp, which also resumes from it) and read
// once (read_lora_adapter) for both of its other users: the merge (ckpt/lora_merge.h) and
// generation with an unmerged adapter (attach_lora_adapter).
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

namespace alpaca::io {

inline constexpr const char* kPeftKeyPrefix = "base_model.model.";
inline constexpr const char* kAdapterConfigFile = "adapter_config.json";
inline constexpr const char* kAdapterWeightsFile = "adapter_model.safetensors";

// peft's key of our parameter `name` (no adapter name in the key, as save_pretrained writes it).
inline std::string peft_key(const std::string& name) { return kPeftKeyPrefix + name; }

// The LoraConfig fields alpaca-train sets; the rest are peft's defaults for a plain LoRA.
struct PeftLoraConfig {
  std::string base_model_name_or_path;
  int64_t r = 0;
  double alpha = 0, dropout = 0;
  bool use_rslora = false;
  bool use_dora = false;
  std::vector<std::string> target_modules;   // leaf names, as resolved (all-linear expanded)
  std::vector<std::string> modules_to_save;  // empty: null
  // Table key ("embed_tokens", "lm_head") -> the vocabulary rows trained as trainable tokens; empty: null.
  std::map<std::string, std::vector<int64_t>> trainable_token_indices;
  // A tied model whose embed_tokens is saved in full: the one table serves the embedding and the
  // output layer (peft's ensure_weight_tying=True; the adapter then holds it under both names).
  bool ensure_weight_tying = false;
};
// adapter_config.json's text (2-space indent, newline at the end) for `c`.
std::string peft_adapter_config_json(const PeftLoraConfig& c);

struct LoraAdapter {
  std::string dir;
  int64_t r = 0;
  double scaling = 0;  // lora_alpha / r, or / sqrt(r) with use_rslora
  // Base tensor name ("model.embed_tokens.weight", "lm_head.weight") -> the vocabulary rows its
  // trainable_tokens_delta replaces, in delta order.
  std::map<std::string, std::vector<int64_t>> token_rows;
  std::shared_ptr<io::SafetensorsFile> file;  // adapter_model.safetensors
  // adapter_config.json's ensure_weight_tying: a saved embed_tokens / lm_head table serves both
  // sides of a tied base. Without it peft applies the table to its own side only and unties.
  bool ensure_weight_tying = false;
  bool use_dora = false;  // each adapted linear has "<module>.lora_magnitude_vector" (peft DoRA)

  // The vocabulary after the trainable tokens: max(base_vocab, largest row + 1).
  int64_t vocab_size(int64_t base_vocab) const;
  // Full module names that have lora_A / lora_B in the file, in file order.
  std::vector<std::string> lora_modules() const;
};

// Reads and checks adapter_config.json and opens the weights. Throws alpaca::Error naming the file
// on anything that cannot be applied exactly (another peft type, LoRA biases, fan_in_fan_out,
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

// Throws naming the adapter when it saves a whole embed_tokens / lm_head table for a base with tied
// embeddings without ensure_weight_tying: peft then applies the table to one side only and unties
// the model, which neither attach nor merge reproduces (they would apply it to both).
void check_tied_tables(const LoraAdapter& adapter, bool base_tied);

// Where the tokenizer an adapter was trained with lives: the adapter directory when it has one
// (an --use_peft output_dir, maybe with train.py's [PAD]), else the base's (peft's save_pretrained).
std::string adapter_tokenizer_dir(const std::string& adapter_dir, const std::string& base_dir);

}  // namespace alpaca::io
