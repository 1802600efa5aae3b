// Shifted causal-LM cross-entropy with ignore_index -100, computed in fp32 (transformers'
// ForCausalLMLoss). The sum form lets the trainer normalise by the global label-token count.
#pragma once

#include <cstdint>

#include <ATen/ATen.h>  // defines: at::Tensor

#include "alpaca/model/loss_options.h"

namespace alpaca::model {

constexpr int64_t kIgnoreIndex = -100;

struct LossSum {
  at::Tensor sum;      // scalar fp32: sum of the token losses
  int64_t num_tokens;  // label tokens counted (labels != -100 after the shift)
  // With LossOptions::token_stats (causal_lm_head_loss_sum only): fp64 (2) on the hidden states'
  // device, never differentiated: [sum over the label tokens of the entropy of their predicted
  // distribution, count of label tokens that are its argmax (the first index among equal maxima)],
  // TRL's fused LM head `entropy` and `is_top1` summed. Undefined otherwise.
  at::Tensor token_stats = {};
};

// logits_btv: (B, T, V) any float dtype; labels_bt: int64 (B, T), position t predicts t+1.
LossSum causal_lm_loss_sum(const at::Tensor& logits_btv, const at::Tensor& labels_bt);
// Mean over label tokens, = transformers' loss (NaN when there is no label token, as there).
at::Tensor causal_lm_loss(const at::Tensor& logits_btv, const at::Tensor& labels_bt);

// The same loss computed from the final hidden states without materialising the (B, T, V) logits:
// `hidden_btd` (after the final norm) is projected by `weight_vd` (lm_head) a chunk of
// `chunk_tokens` positions at a time; each chunk's logits are made as transformers makes them
// (linear in the hidden dtype, then upcast to fp32), reduced to the loss, and, when a gradient is
// wanted, turned straight into that chunk's gradients (softmax - one_hot), so backward only scales
// them by the incoming gradient. Peak extra memory is one chunk of logits instead of several
// (B, T, V) fp32 tensors; the weight gradient accumulates in fp32 across chunks.
// chunk_tokens <= 0 picks a chunk of about 2^23 logits (32 MiB in fp32).
// The labels may live on the host while the hidden states are on a device: the count, the
// vocabulary check and the labelled rows are then computed on the host (no device
// synchronisation) and moved asynchronously; device labels cost two synchronisations (counted,
// util/host_sync.h). The same holds for causal_lm_loss_sum's count.
// With `rows_kd` (peft trainable tokens: the values of rows `row_index_k` of the weight), the
// weight is W.index_copy(0, row_index_k, rows_kd) without forming it: those logits come from
// rows_kd, which gets their gradient; `weight_vd` must then be frozen (no gradient).
// `options` other than plain cross-entropy take the ATen row passes (fp32), never the bf16 row kernel;
// options.token_stats fills LossSum::token_stats from the same logits (both row paths).
LossSum causal_lm_head_loss_sum(const at::Tensor& hidden_btd, const at::Tensor& weight_vd, const at::Tensor& labels_bt,
                                int64_t chunk_tokens = 0, const at::Tensor& rows_kd = {},
                                const at::Tensor& row_index_k = {}, const LossOptions& options = {});

}  // namespace alpaca::model
