// Tiny LLaMA configs for the tests that build a model in C++ (no checkpoint): one builder for the
// sizes every such test sets, so a test states only its numbers and what it sets beyond them.
#pragma once

#include <cstdint>

#include "alpaca/model/config.h"

namespace alpaca::testing {

// The sizes of a test model, in the order of HF config.json: vocab_size, hidden_size,
// intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim
// (0 = unset: LlamaConfig's default, which the config loader and the planner read as
// hidden / heads) and max_position_embeddings.
struct ModelSizes {
  int64_t vocab = 0, hidden = 0, intermediate = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int64_t max_positions = 2048;
};

// A model_type "llama" config of those sizes; every other field keeps LlamaConfig's default.
inline model::LlamaConfig llama_config(const ModelSizes& s) {
  model::LlamaConfig c;
  c.vocab_size = s.vocab;
  c.hidden_size = s.hidden;
  c.intermediate_size = s.intermediate;
  c.num_hidden_layers = s.layers;
  c.num_attention_heads = s.heads;
  c.num_key_value_heads = s.kv_heads;
  c.head_dim = s.head_dim;
  c.max_position_embeddings = s.max_positions;
  return c;
}

// A ~100M-parameter LLaMA (vocab 32000, hidden 768, 8 layers of 12 heads): the model of the
// per-rank byte-count tests, built on the meta device.
inline model::LlamaConfig llama_100m() { return llama_config({32000, 768, 2048, 8, 12, 12, 64, 512}); }

// A ~21M-parameter LLaMA (vocab 8000, hidden 512, 4 layers of 8 heads): the model of the
// peak-memory tests of loading, large enough that one copy of it stands out of the RSS noise.
inline model::LlamaConfig llama_21m() { return llama_config({8000, 512, 1376, 4, 8, 8, 64}); }

}  // namespace alpaca::testing
