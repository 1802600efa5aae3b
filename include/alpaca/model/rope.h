// Rotary position embeddings computed the way transformers computes them (inv_freq in fp32,
// cat(freqs, freqs), cos/sin cast to the compute dtype) for every supported rope_scaling type.
#pragma once

#include <ATen/ATen.h>  // defines: at::Tensor

#include "alpaca/model/config.h"

namespace alpaca::model {

// Inverse frequencies (head_dim / 2) in fp32 on `device`. `seq_len` (the highest position + 1)
// matters only for "dynamic" scaling (beyond max_position_embeddings the base grows: transformers'
// dynamic NTK; at or below it the plain frequencies, as a freshly loaded transformers model has)
// and "longrope" (the long factors beyond original_max_position_embeddings, else the short ones).
at::Tensor rope_inv_freq(const LlamaConfig& cfg, int64_t seq_len, const at::Device& device);

// The factor transformers multiplies cos and sin by (its rotary embedding's attention_scaling):
// yarn's and longrope's attention factor, 1 for every other type.
double rope_attention_scaling(const LlamaConfig& cfg);

// cos and sin, each (B, T, head_dim) in `dtype`, for int64 position_ids_bt (B, T).
std::pair<at::Tensor, at::Tensor> rope_cos_sin(const LlamaConfig& cfg, const at::Tensor& position_ids_bt,
                                               at::ScalarType dtype);

// Applies RoPE to x (B, H, T, head_dim) with cos/sin (B, T, head_dim).
at::Tensor apply_rope(const at::Tensor& x_bhtd, const at::Tensor& cos_btd, const at::Tensor& sin_btd);

}  // namespace alpaca::model
