// Causal-LM loss as transformers' ForCausalLMLoss: upcast to fp32, labels padded with -100 on the
// right and shifted left, summed cross-entropy over non-ignored tokens.
#include "alpaca/model/loss.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "alpaca/model/fused_ops.h"
#include "alpaca/model/matmul.h"
#include "alpaca/util/error.h"
#include "alpaca/util/trace.h"
#include "alpaca/util/host_sync.h"
#include "blas.h"
#include "loss_rows.h"

namespace alpaca::model {
namespace {

// Labels shifted left by one (position t predicts t+1), -100 at the end of each row, flattened
// onto `device`: transformers' ForCausalLMLoss padding and shift.
at::Tensor shifted_flat_labels(const at::Tensor& labels_bt, const at::Device& device) {
  return at::constant_pad_nd(labels_bt.to(at::kLong), {0, 1}, kIgnoreIndex)
      .narrow(1, 1, labels_bt.size(1))
      .reshape({-1})
      .to(device);
}

}  // namespace

LossSum causal_lm_loss_sum(const at::Tensor& logits_btv, const at::Tensor& labels_bt) {
  ALPACA_CHECK(logits_btv.dim() == 3 && labels_bt.dim() == 2 && logits_btv.size(0) == labels_bt.size(0) &&
                   logits_btv.size(1) == labels_bt.size(1),
               "loss: logits (B, T, V) and labels (B, T) disagree: " << logits_btv.sizes() << " vs "
                                                                     << labels_bt.sizes());
  const int64_t v = logits_btv.size(2);
  // Counted where the labels are: on the host (a collated batch) without a device synchronisation.
  const at::Tensor labels_here = shifted_flat_labels(labels_bt, labels_bt.device());
  if (!labels_here.is_cpu()) util::count_host_sync();
  const int64_t count = labels_here.ne(kIgnoreIndex).sum().item<int64_t>();
  const at::Tensor flat_labels = util::to_device_async(labels_here, logits_btv.device());
  at::Tensor sum = at::cross_entropy_loss(logits_btv.to(at::kFloat).reshape({-1, v}), flat_labels, {},
                                          at::Reduction::Sum, kIgnoreIndex);
  return {sum, count};
}

at::Tensor causal_lm_loss(const at::Tensor& logits_btv, const at::Tensor& labels_bt) {
  LossSum ls = causal_lm_loss_sum(logits_btv, labels_bt);
  return ls.sum / static_cast<double>(ls.num_tokens);
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// One chunk's cross-entropy as transformers computes it: the logits z_c (rows, V) in the compute
// dtype, upcast to fp32, softmax; adds the rows' summed loss to `loss` and, when `need_grad`,
// returns d(loss)/d(z) = softmax - one_hot in z_c's dtype (the backward of the upcast). bf16 CPU
// logits take the fused row kernels (loss_rows.h: the same math in one pass per row, the gradient
// written over z_c); anything else the ATen passes.
// With `o` not plain, each row's term and gradient follow LossOptions (rows in fp32):
//   label smoothing e: (1 - e) nll + e (lse - mean_v z), gradient softmax - (1 - e) onehot - e / V;
//   DFT: p nll with p = exp(-nll) constant, gradient p (softmax - onehot).
// stats (fp64 (2), on the CPU) += the row kernels' sums.
void add_row_stats(at::Tensor& stats, const RowTokenStats& rs) {
  stats[0].add_(rs.entropy_sum);
  stats[1].add_(static_cast<double>(rs.top1));
}

// With `stats` (fp64 (2), o.token_stats): adds the rows' entropy sum and top-1 count (loss.h).
at::Tensor chunk_cross_entropy(at::Tensor& z_c, const at::Tensor& target_n, at::Tensor& loss, bool need_grad,
                               const LossOptions& o, at::Tensor& stats) {
  if (o.plain() && fused_cpu_bf16_applies(z_c) && z_c.is_contiguous()) {
    RowTokenStats row_stats;
    loss.add_(cross_entropy_rows_bf16(z_c, target_n.contiguous(), need_grad, stats.defined() ? &row_stats : nullptr));
    if (stats.defined()) add_row_stats(stats, row_stats);
    return need_grad ? z_c : at::Tensor();
  }
  const at::Tensor target = target_n.unsqueeze(1);
  const at::ScalarType compute_dtype = z_c.scalar_type();
  at::Tensor z = z_c.to(at::kFloat);
  z_c = at::Tensor();  // the compute-dtype logits die with the upcast (in bf16 they would be one more chunk)
  const at::Tensor target_logit = z.gather(1, target);
  // The token statistics: on the CPU with the fused kernels, one read-only pass a row that also
  // gives the max; elsewhere ATen's argmax (the first index among equal maxima, as TRL's is_top1).
  const bool cpu_stats = stats.defined() && z.is_cpu() && fused_cpu_enabled() && z.stride(1) == 1;
  RowTokenStats row_stats;
  const at::Tensor cpu_target = cpu_stats ? target_n.contiguous() : at::Tensor();
  const at::Tensor top1 = stats.defined() && !cpu_stats ? z.argmax(1).eq(target_n).sum() : at::Tensor();
  const at::Tensor zmax = cpu_stats ? token_stats_rows_f32(z, cpu_target, row_stats) : z.amax(1, /*keepdim=*/true);
  const at::Tensor zmean = o.label_smoothing != 0.0 ? z.mean(1, /*keepdim=*/true) : at::Tensor();
  z.sub_(zmax).exp_();                                   // exp(z - max), in place
  const at::Tensor sumexp = z.sum(1, /*keepdim=*/true);  // lse = log(sumexp) + max
  if (cpu_stats) {
    add_row_stats(stats, row_stats);
  } else if (stats.defined()) {
    // With e = exp(z - max) and s = sum e: entropy = log s - sum e log(e) / s (xlogy: 0 where e underflowed).
    const at::Tensor entropy = (sumexp.log() - at::xlogy(z, z).sum(1, /*keepdim=*/true).div_(sumexp)).sum();
    stats.add_(at::stack({entropy.to(at::kDouble), top1.to(at::kDouble)}));
  }
  at::Tensor p;  // DFT: each row's probability of its target
  if (o.plain()) {
    loss.add_((sumexp.log() + zmax - target_logit).sum());
  } else {
    const at::Tensor lse = sumexp.log() + zmax;
    const at::Tensor nll = lse - target_logit;
    if (o.dft) {
      p = (-nll).exp();
      loss.add_((p * nll).sum());
    } else {
      loss.add_((nll * (1 - o.label_smoothing) + (lse - zmean) * o.label_smoothing).sum());
    }
  }
  if (!need_grad) return {};
  z.div_(sumexp);
  if (o.dft) {
    z.scatter_add_(1, target, at::full_like(target_logit, -1.0)).mul_(p);
  } else if (o.label_smoothing != 0.0) {
    z.scatter_add_(1, target, at::full_like(target_logit, -(1 - o.label_smoothing)));
    z.sub_(o.label_smoothing / static_cast<double>(z.size(1)));
  } else {
    z.scatter_add_(1, target, at::full_like(target_logit, -1.0));
  }
  return z.to(compute_dtype);
}

// Forward does the whole work (loss and, if needed, both gradients); backward scales.
struct FusedHeadCrossEntropy : public torch::autograd::Function<FusedHeadCrossEntropy> {
  // h_nd: (N, D) hidden rows; w_vd: (V, D); labels_n: int64 (N), shifted; rows: the indices of
  // the rows with a label (int64, on h's device; their count is known on the host). Only those
  // are projected: an ignored row adds nothing to the loss and gets a zero gradient.
  // rows_kd / row_index_k: peft trainable-token rows (empty = none); see loss.h.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h_nd, const at::Tensor& w_vd,
                            const at::Tensor& labels_n, const at::Tensor& rows, int64_t chunk,
                            const at::Tensor& rows_kd, const at::Tensor& row_index_k, double label_smoothing,
                            bool dft, at::Tensor stats) {
    if (stats.numel() == 0) stats = at::Tensor();  // empty = none
    const LossOptions options{label_smoothing, dft, stats.defined()};
    const bool need_h = h_nd.requires_grad(), need_w = w_vd.requires_grad();
    const bool with_rows = rows_kd.numel() > 0;  // empty = none (apply takes defined tensors only)
    const bool need_rows = with_rows && rows_kd.requires_grad();
    ALPACA_CHECK(!with_rows || !need_w, "loss: trainable token rows need a frozen lm_head weight");
    const int64_t n = rows.size(0);
    at::Tensor loss = at::zeros({}, h_nd.options().dtype(at::kFloat));
    at::Tensor grad_h = need_h ? at::zeros_like(h_nd) : at::Tensor();
    // 16-bit products are summed in fp32 starting from the first chunk's (no zero fill; undefined
    // until then); fp32 products accumulate into zeros with addmm_.
    const bool sum_products = w_vd.scalar_type() != at::kFloat && !bf16_gemm_via_fp32(h_nd, w_vd) && n > 0;
    at::Tensor grad_w = need_w && !sum_products ? at::zeros(w_vd.sizes(), w_vd.options().dtype(at::kFloat)) : at::Tensor();
    at::Tensor grad_r = need_rows ? at::zeros(rows_kd.sizes(), rows_kd.options().dtype(at::kFloat)) : at::Tensor();
    // GEMM operands: as given, or upcast once when bf16 products take the fp32 route (matmul.h).
    const bool f32 = bf16_gemm_via_fp32(h_nd, w_vd);
    const at::Tensor w_c = f32 ? w_vd.to(at::kFloat) : w_vd;
    // Trainable rows: W' = W with rows `row_index_k` replaced by r, never formed. Logits h W'^T
    // are h W^T with those columns from h r^T; h's gradient g W' = g W + g[:, rows] (r - W[rows]).
    at::Tensor r_c, r_minus_w;
    if (with_rows) {
      r_c = rows_kd.to(w_c.scalar_type());
      if (need_h) r_minus_w = r_c - w_c.index_select(0, row_index_k);
    }
    at::Tensor head_scratch;  // the lm_head gradient's per-chunk product where ATen's GEMM makes it (loss_rows.h)
    // fp32 logits on the CPU: one buffer for every chunk, its rows padded (loss_rows.h); the products
    // that write or read them go straight to the BLAS (blas.h).
    const int64_t ld = n > 0 ? fp32_logits_row_stride(w_c) : 0;
    const at::Tensor z_buf = ld > 0 ? at::empty({std::min(chunk, n), ld}, w_c.options()) : at::Tensor();
    const at::Tensor w_cc = ld > 0 ? w_c.contiguous() : at::Tensor();
    for (int64_t s = 0; s < n; s += chunk) {
      const at::Tensor idx = rows.narrow(0, s, std::min(chunk, n - s));
      at::Tensor h_c = h_nd.index_select(0, idx);
      if (f32) h_c = h_c.to(at::kFloat);
      at::Tensor z_c;
      if (ld > 0) {
        h_c = h_c.contiguous();
        z_c = z_buf.narrow(0, 0, h_c.size(0)).narrow(1, 0, w_cc.size(0));
        blas::mm(z_c, h_c, w_cc.t());
      } else {
        z_c = at::mm(h_c, w_c.t());
      }
      // The padded rows' whole width is contiguous: column selections there (index_copy_, index_select) do not copy them.
      const at::Tensor z_rows = ld > 0 ? z_buf.narrow(0, 0, h_c.size(0)) : z_c;
      if (with_rows) z_rows.index_copy_(1, row_index_k, at::mm(h_c, r_c.t()));
      const at::Tensor g =
          chunk_cross_entropy(z_c, labels_n.index_select(0, idx), loss, need_h || need_w || need_rows, options, stats);
      if (!g.defined()) continue;
      // Padded (ld > 0: fp32 logits), g is the fp32 view of z_buf's rows, and g_cols those full-width rows
      // (the same values in their V columns).
      const at::Tensor g_cols = ld > 0 ? z_rows : g;
      if (need_h) {
        at::Tensor gh;
        if (ld > 0) {
          gh = at::empty({g.size(0), w_cc.size(1)}, g.options());
          blas::mm(gh, g, w_cc);
        } else {
          gh = at::mm(g, w_c);
        }
        if (with_rows) gh.addmm_(g_cols.index_select(1, row_index_k), r_minus_w);
        grad_h.index_copy_(0, idx, gh.to(h_nd.scalar_type()));
      }
      if (need_w) {
        if (ld > 0) {
          blas::mm(grad_w, g.t(), h_c, /*beta=*/1.0f);  // grad_w += g^T h_c
        } else if (g.scalar_type() == at::kFloat) {
          grad_w.addmm_(g.t(), h_c);
        } else {
          accumulate_head_weight_grad(grad_w, head_scratch, g, h_c);
        }
      }
      if (need_rows) {
        const at::Tensor g_rows = g_cols.index_select(1, row_index_k);
        if (g.scalar_type() == at::kFloat) {
          grad_r.addmm_(g_rows.t(), h_c);
        } else {
          grad_r.add_(at::mm(g_rows.t(), h_c));
        }
      }
    }
    ctx->saved_data["grad_h"] = grad_h;
    ctx->saved_data["grad_w"] = need_w ? grad_w.to(w_vd.scalar_type()) : grad_w;
    ctx->saved_data["grad_r"] = need_rows ? grad_r.to(rows_kd.scalar_type()) : grad_r;
    return loss;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_out) {
    const at::Tensor g = grad_out[0];
    at::Tensor grad_h = ctx->saved_data["grad_h"].toTensor();
    at::Tensor grad_w = ctx->saved_data["grad_w"].toTensor();
    at::Tensor grad_r = ctx->saved_data["grad_r"].toTensor();
    ctx->saved_data.clear();
    if (grad_h.defined()) grad_h.mul_(g.to(grad_h.scalar_type()));
    if (grad_w.defined()) grad_w.mul_(g.to(grad_w.scalar_type()));
    if (grad_r.defined()) grad_r.mul_(g.to(grad_r.scalar_type()));
    return {grad_h, grad_w, at::Tensor(), at::Tensor(), at::Tensor(), grad_r, at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

LossSum causal_lm_head_loss_sum(const at::Tensor& hidden_btd, const at::Tensor& weight_vd, const at::Tensor& labels_bt,
                                int64_t chunk_tokens, const at::Tensor& rows_kd, const at::Tensor& row_index_k,
                                const LossOptions& options) {
  ALPACA_TRACE("cat:loss");
  ALPACA_CHECK(hidden_btd.dim() == 3 && weight_vd.dim() == 2 && labels_bt.dim() == 2 &&
                   hidden_btd.size(0) == labels_bt.size(0) && hidden_btd.size(1) == labels_bt.size(1) &&
                   hidden_btd.size(2) == weight_vd.size(1),
               "loss: hidden (B, T, D), lm_head weight (V, D) and labels (B, T) disagree: "
                   << hidden_btd.sizes() << ", " << weight_vd.sizes() << ", " << labels_bt.sizes());
  const int64_t v = weight_vd.size(0), d = hidden_btd.size(2);
  // The label count, the vocabulary check and the labelled rows are computed where the labels
  // are: labels on the host (the trainer's collated batch) cost no device synchronisation and
  // travel to the device without a host wait; labels on the device cost two (the counts, the rows).
  const at::Tensor labels_here = shifted_flat_labels(labels_bt, labels_bt.device());
  const at::Tensor valid = labels_here.ne(kIgnoreIndex);
  const at::Tensor bad = valid & (labels_here.lt(0) | labels_here.ge(v));
  if (!labels_here.is_cpu()) util::count_host_sync();
  const at::Tensor counts = at::stack({valid.sum(), bad.sum()}).cpu();  // one copy when on the device
  const int64_t count = counts[0].item<int64_t>();
  if (counts[1].item<int64_t>() > 0) {
    const int64_t label = labels_here.masked_select(bad)[0].item<int64_t>();
    ALPACA_FAIL("loss: label " << label << " outside the vocabulary [0, " << v << ") (labels must be token ids or "
                               << kIgnoreIndex << ")");
  }
  if (!labels_here.is_cpu()) util::count_host_sync();
  const at::Tensor rows_here = valid.nonzero().squeeze(1);
  const at::Device device = hidden_btd.device();
  const at::Tensor flat_labels = util::to_device_async(labels_here, device);
  const at::Tensor rows = util::to_device_async(rows_here, device);
  if (chunk_tokens <= 0) chunk_tokens = std::max<int64_t>(1, (int64_t{1} << 23) / std::max<int64_t>(v, 1));
  const bool with_rows = rows_kd.defined() && rows_kd.numel() > 0;
  ALPACA_CHECK(!with_rows || (rows_kd.dim() == 2 && rows_kd.size(1) == d && row_index_k.defined() &&
                              row_index_k.numel() == rows_kd.size(0)),
               "loss: trainable token rows " << rows_kd.sizes() << " do not fit the head weight " << weight_vd.sizes());
  const at::Tensor none = at::empty({0}, weight_vd.options());
  // Filled in place by the forward; empty = none.
  const at::Tensor stats = at::zeros({options.token_stats ? 2 : 0}, hidden_btd.options().dtype(at::kDouble));
  at::Tensor sum = FusedHeadCrossEntropy::apply(hidden_btd.reshape({-1, d}), weight_vd, flat_labels, rows, chunk_tokens,
                                               with_rows ? rows_kd : none,
                                               with_rows ? row_index_k : none.to(at::kLong), options.label_smoothing,
                                               options.dft, stats);
  return {sum, count, options.token_stats ? stats : at::Tensor()};
}

}  // namespace alpaca::model
