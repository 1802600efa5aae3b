// LlamaConfig: the Hugging Face `config.json` of a LLaMA-family checkpoint (LLaMA 1, 2, 3/3.1,
// Mistral, Qwen2), read with validation (errors name the file and the field) and written back in HF form.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace alpaca::model {

// RoPE scaling as in HF `rope_scaling` / `rope_parameters`. type "" = plain RoPE. The fields are
// transformers' (modeling_rope_utils.py) after its defaults are applied.
struct RopeScaling {
  std::string type;  // "", "linear", "dynamic", "llama3", "yarn", "longrope"
  double factor = 1.0;  // longrope without one: max_position_embeddings / original_max_position_embeddings
  double low_freq_factor = 1.0;                 // llama3 only
  double high_freq_factor = 4.0;                // llama3 only
  // llama3, yarn, longrope: the pretraining context (absent: max_position_embeddings; a top-level
  // config field of that name wins, as in transformers).
  int64_t original_max_position_embeddings = 0;
  // yarn, longrope: the factor cos and sin are multiplied by; absent = derived from factor.
  std::optional<double> attention_factor;
  double beta_fast = 32.0, beta_slow = 1.0;     // yarn: the ramp's bounds in rotations
  double mscale = 0.0, mscale_all_dim = 0.0;    // yarn: DeepSeek's attention-factor terms (0 = unset)
  bool truncate = true;                         // yarn: floor/ceil the ramp's bounds
  std::vector<double> short_factor, long_factor;  // longrope: head_dim / 2 rescale factors each
};

struct LlamaConfig {
  // "llama", "mistral" (the same modules; see sliding_window) or "qwen2" (the same
  // modules with q/k/v bias and no o_proj bias; sliding windows per layer). Written back as read.
  std::string model_type = "llama";
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // GQA; defaults to num_attention_heads
  int64_t head_dim = 0;             // defaults to hidden_size / num_attention_heads
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  double initializer_range = 0.02;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // bias on q_proj, k_proj, v_proj (qwen2: always true)
  bool o_proj_bias = false;     // bias on o_proj: llama's attention_bias covers it; qwen2 has none
  bool mlp_bias = false;
  RopeScaling rope_scaling;
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_id;  // LLaMA 3 lists several end tokens; LLaMA 1/2 have one
  std::optional<int64_t> pad_token_id;
  // transformers' embed_tokens padding_idx: pad_token_id as given (LLaMA-1's -1 counted from the
  // end, vocab_size - 1); that row gets no gradient. -1: none. Kept by resize_token_embeddings.
  int64_t embedding_padding_idx = -1;
  std::string torch_dtype;            // "float32", "bfloat16", "float16" or "" when absent
  // Sliding-window attention (transformers' sliding_window_overlay): in a sliding layer query i
  // sees keys j with i - W < j <= i (itself and the W - 1 before). Mistral: every layer, W =
  // sliding_window (absent: MistralConfig's 4096; null: none). Qwen2: only with use_sliding_window
  // (else transformers nulls the window), the layers layer_types names "sliding_attention" (absent:
  // those from max_window_layers on). Training, evaluation and generation run any length (the KV
  // cache keeps every key; LlamaForCausalLMImpl::window_cuts).
  std::optional<int64_t> sliding_window;
  std::vector<bool> sliding_layers;  // per layer (num_hidden_layers): attends through the window
  bool use_sliding_window = false;   // Qwen2's flag, written back
  int64_t max_window_layers = 0;     // Qwen2's field as read (28 when absent), written back
  bool layer_slides(int64_t i) const {
    return sliding_window && i >= 0 && i < static_cast<int64_t>(sliding_layers.size()) && sliding_layers[i];
  }
  bool any_layer_slides() const;

  // Parses HF config.json text. `source` names the file in error messages.
  static LlamaConfig from_json_string(const std::string& text, const std::string& source);
  // Reads `path`; errors name the file and the offending field.
  static LlamaConfig from_json_file(const std::string& path);
  // HF config.json text: architectures LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM
  // with the matching model_type.
  std::string to_json() const;
  // Checks the cross-field invariants (heads divide, positive sizes); `source` names the origin.
  void validate(const std::string& source) const;
};

}  // namespace alpaca::model
