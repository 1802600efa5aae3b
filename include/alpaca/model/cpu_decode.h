// One generation step on the CPU, fused: a batch of 1 to 8 sequences, one new token each,
// through every decoder layer and the LM head without the module graph.
//
// A batch-1 step of a small model is ~2,000 tiny ATen ops (norms, RoPE, views, adds, attention
// over the cache) around the weight products, and they and their dispatch cost a fifth or more
// of the step (bf16 SmolLM2-135M, 1 thread: 21.5 ms through the modules, 17.5 ms fused).
// CpuDecoder computes the same math in a few loops per layer over the model's own weights and KV
// cache: RMSNorm, RoPE (cos/sin from rope_cos_sin, so the bits are transformers'), the cache
// append, softmax attention over the cached keys (GQA, the padding mask), SiLU-gated MLP and the
// residuals, rounding to the compute dtype wherever the module path (and transformers) rounds;
// the weight products are gemv's streams, q/k/v together and gate/up together, split by rows
// across the intra-op threads, and the per-row ops decode's kernels (both in the internal
// src/model/cpu_kernels.h). A LoRA adapter's branch is added unmerged, as peft's
// lora.Linear does: y + B(A(x)) * scaling, with the same roundings; trainable-token rows as
// peft's TrainableTokensLayer.
//
// Not bitwise the module path: sums run in another order (fp32 logits agree to ~1e-6 relative;
// greedy tokens are tested equal to transformers'). The module path (forward_cached) stays the
// reference, and the path for everything this does not cover.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/ATen.h>  // defines: at::Tensor

#include "alpaca/model/kv_cache.h"
#include "alpaca/model/llama.h"

namespace alpaca::model {

class CpuDecoder {
 public:
  // Why CpuDecoder cannot run `m` at `batch` rows, or "" when it can: parameters on the CPU in
  // fp32 (needs AVX-512F) or bf16 (needs AVX512-BF16 and the kNative bf16 policy), all in one
  // dtype, contiguous, 1 to 8 rows, no layer runner (FSDP), no LoRA dropout in training mode.
  // LoRA branches (unmerged, as peft runs them) and trainable-token rows are computed.
  static std::string unsupported(LlamaForCausalLMImpl& m, int64_t batch);

  // Checks unsupported() (throws with its reason) and keeps the model's weights (shared, not
  // copied) and per-step scratch for `batch` rows.
  CpuDecoder(LlamaForCausalLMImpl& m, int64_t batch);

  // One token per row, as forward_cached with T = 1: ids_b int64 (batch) or (batch, 1) on the
  // CPU, position_ids_b the same shape (each row's position), attention_mask_bk (batch,
  // cache.length() + 1) int64/bool with 0 = padding, or undefined (no padding). Appends every
  // layer's key and value at cache.length(), advances the cache by one and returns the logits
  // (batch, vocab) in fp32 (bf16 logits upcast, as forward_cached(...).to(kFloat)).
  at::Tensor step(const at::Tensor& ids_b, KvCache& cache, const at::Tensor& attention_mask_bk,
                  const at::Tensor& position_ids_b);

 private:
  struct Proj {
    at::Tensor w, b;          // (out, in), bias (out) or undefined
    at::Tensor lora_a, lora_b;  // peft's unmerged LoRA branch (r, in), (out, r), or undefined
    float scaling = 0;
  };
  struct Layer {
    Proj q, k, v, o, gate, up, down;
    at::Tensor ln1, ln2;  // RMSNorm weights
    float eps1 = 0, eps2 = 0;
  };
  template <typename T>
  class Run;  // one step in compute dtype T (src/model/cpu_decode.cpp)

  struct TokenRows {
    std::vector<int64_t> ids;  // peft trainable_token_indices
    at::Tensor rows;           // (ids, hidden) in the compute dtype
  };

  LlamaConfig cfg_;
  int64_t batch_;
  at::ScalarType dtype_;
  std::vector<Layer> layers_;
  at::Tensor embed_, norm_, lm_head_;
  TokenRows embed_tokens_, head_tokens_;  // trainable-token rows of the embedding / the LM head
  float norm_eps_ = 0;
  // Scratch in the compute dtype (bf16 or fp32) and fp32 (products' sums, attention scores).
  at::Tensor h_, xn_, qkv_, attn_, act_;
  at::Tensor sums_, scores_;
};

}  // namespace alpaca::model
