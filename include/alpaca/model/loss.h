// Shifted causal-LM cross-entropy with ignore_index -100, computed in fp32 (transformers'
// ForCausalLMLoss). The sum form lets the trainer normalise by the global label-token count.
#pragma once

#include <cstdint>

#include <ATen/ATen.h>  // defines: at::Tensor

namespace alpaca::model {

constexpr int64_t kIgnoreIndex = -100;

struct LossSum {
  at::Tensor sum;      // scalar fp32: sum of the token losses
  int64_t num_tokens;  // label tokens counted (labels != -100 after the shift)
};

// logits_btv: (B, T, V) any float dtype; labels_bt: int64 (B, T), position t predicts t+1.
LossSum causal_lm_loss_sum(const at::Tensor& logits_btv, const at::Tensor& labels_bt);
// Mean over label tokens, = transformers' loss (NaN when there is no label token, as there).
at::Tensor causal_lm_loss(const at::Tensor& logits_btv, const at::Tensor& labels_bt);

}  // namespace alpaca::model
