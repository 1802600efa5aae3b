// Causal-LM loss as transformers' ForCausalLMLoss: upcast to fp32, labels padded with -100 on the
// right and shifted left, summed cross-entropy over non-ignored tokens.
#include "alpaca/model/loss.h"

#include "alpaca/util/error.h"

namespace alpaca::model {

LossSum causal_lm_loss_sum(const at::Tensor& logits_btv, const at::Tensor& labels_bt) {
  ALPACA_CHECK(logits_btv.dim() == 3 && labels_bt.dim() == 2 && logits_btv.size(0) == labels_bt.size(0) &&
                   logits_btv.size(1) == labels_bt.size(1),
               "loss: logits (B, T, V) and labels (B, T) disagree: " << logits_btv.sizes() << " vs "
                                                                     << labels_bt.sizes());
  const int64_t v = logits_btv.size(2);
  at::Tensor shift_labels_bt =
      at::constant_pad_nd(labels_bt.to(at::kLong), {0, 1}, kIgnoreIndex).narrow(1, 1, labels_bt.size(1));
  at::Tensor flat_labels = shift_labels_bt.reshape({-1}).to(logits_btv.device());
  at::Tensor sum = at::cross_entropy_loss(logits_btv.to(at::kFloat).reshape({-1, v}), flat_labels, {},
                                          at::Reduction::Sum, kIgnoreIndex);
  const int64_t count = flat_labels.ne(kIgnoreIndex).sum().item<int64_t>();
  return {sum, count};
}

at::Tensor causal_lm_loss(const at::Tensor& logits_btv, const at::Tensor& labels_bt) {
  LossSum ls = causal_lm_loss_sum(logits_btv, labels_bt);
  return ls.sum / static_cast<double>(ls.num_tokens);
}

}  // namespace alpaca::model
