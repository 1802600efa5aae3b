// Rotary position embeddings computed the way transformers computes them (inv_freq in fp32,
// cat(freqs, freqs), cos/sin cast to the compute dtype) for every supported rope_scaling type.
#pragma once

#include <ATen/ATen.h>  // defines: at::Tensor

#include "alpaca/model/config.h"

namespace alpaca::model {

// Inverse frequencies (head_dim / 2) in fp32 on `device`. `seq_len` matters only for "dynamic"
// scaling: beyond max_position_embeddings the base grows (transformers' dynamic NTK); at or below
// it the plain frequencies are used, which is what a freshly loaded transformers model does.
at::Tensor rope_inv_freq(const LlamaConfig& cfg, int64_t seq_len, const at::Device& device);

// cos and sin, each (B, T, head_dim) in `dtype`, for int64 position_ids_bt (B, T).
std::pair<at::Tensor, at::Tensor> rope_cos_sin(const LlamaConfig& cfg, const at::Tensor& position_ids_bt,
                                               at::ScalarType dtype);

// Applies RoPE to x (B, H, T, head_dim) with cos/sin (B, T, head_dim).
at::Tensor apply_rope(const at::Tensor& x_bhtd, const at::Tensor& cos_btd, const at::Tensor& sin_btd);

}  // namespace alpaca::model
