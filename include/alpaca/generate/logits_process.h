// Next-token scoring as transformers' generate does it: the repetition penalty first (a logits
// processor), then, only when sampling, the warpers temperature -> top-k -> top-p, each with
// transformers' exact semantics (ties at the top-k threshold are kept; top-p removes the tokens
// whose ascending cumulative probability is <= 1 - top_p and always keeps the most likely one),
// then argmax (greedy) or one draw from softmax (sampling).
#pragma once

#include <cstdint>

#include <ATen/ATen.h>  // defines: at::Tensor, at::Generator

namespace alpaca::generate {

struct SamplingParams {
  bool do_sample = false;
  double temperature = 1.0;         // > 0; 1 = off
  int64_t top_k = 50;               // 0 = off
  double top_p = 1.0;               // (0, 1]; 1 = off
  double repetition_penalty = 1.0;  // > 0; 1 = off
};

// Checks the ranges transformers checks; throws alpaca::Error naming the flag (--top_p ...).
void validate(const SamplingParams& p);

// RepetitionPenaltyLogitsProcessor: for each token that occurs in the row's (unpadded) prompt or
// generation so far (`seen_bv`, bool (B, V)), a negative score is multiplied by `penalty` and a
// non-negative one divided by it, once however often the token occurred.
at::Tensor apply_repetition_penalty(const at::Tensor& scores_bv, const at::Tensor& seen_bv, double penalty);
at::Tensor apply_temperature(const at::Tensor& scores_bv, double temperature);     // TemperatureLogitsWarper
at::Tensor apply_top_k(const at::Tensor& scores_bv, int64_t top_k);                // TopKLogitsWarper
at::Tensor apply_top_p(const at::Tensor& scores_bv, double top_p);                 // TopPLogitsWarper

// The processors above in transformers' order for `p` on fp32 scores (B, V). `seen_bv` may be
// undefined when repetition_penalty == 1.
at::Tensor process_logits(const at::Tensor& scores_bv, const at::Tensor& seen_bv, const SamplingParams& p);

// Next token per row (int64 (B) on the CPU): argmax of the processed scores, or one multinomial
// draw from their softmax with `gen` (a CPU generator, so a seed gives the same tokens on any
// device).
at::Tensor select_next_tokens(const at::Tensor& scores_bv, const SamplingParams& p, at::Generator& gen);

}  // namespace alpaca::generate
