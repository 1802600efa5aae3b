// RoPE frequencies as transformers' modeling_rope_utils.py computes them, so cos/sin match
// to the last bit in fp32 (same ops, same order, same dtypes).
#include "alpaca/model/rope.h"

#include <cmath>

#include "alpaca/util/error.h"

namespace alpaca::model {
namespace {

// Python's `scalar / tensor` is tensor.reciprocal() * scalar; mirror it for identical bits.
at::Tensor rdiv(double s, const at::Tensor& t) { return t.reciprocal() * s; }

at::Tensor exponents(int64_t dim, const at::Device& device) {
  return at::arange(0, dim, 2, at::TensorOptions().dtype(at::kLong).device(device)).to(at::kFloat) /
         static_cast<double>(dim);
}

}  // namespace

at::Tensor rope_inv_freq(const LlamaConfig& cfg, int64_t seq_len, const at::Device& device) {
  const int64_t dim = cfg.head_dim;
  const RopeScaling& rs = cfg.rope_scaling;
  if (rs.type == "dynamic" && seq_len > cfg.max_position_embeddings) {
    // transformers recomputes with a 0-dim int64 seq_len tensor, so the new base is fp32 math.
    at::Tensor s = at::scalar_tensor(seq_len, at::TensorOptions().dtype(at::kLong).device(device));
    at::Tensor base = cfg.rope_theta *
                      at::pow((rs.factor * s / static_cast<double>(cfg.max_position_embeddings)) - (rs.factor - 1),
                              static_cast<double>(dim) / static_cast<double>(dim - 2));
    return rdiv(1.0, at::pow(base, exponents(dim, device)));
  }
  at::Tensor inv_freq = rdiv(1.0, at::pow(at::Scalar(cfg.rope_theta), exponents(dim, device)));
  if (rs.type == "linear") return inv_freq / rs.factor;
  if (rs.type == "llama3") {
    const double old_ctx = static_cast<double>(rs.original_max_position_embeddings);
    const double low_wavelen = old_ctx / rs.low_freq_factor;
    const double high_wavelen = old_ctx / rs.high_freq_factor;
    at::Tensor wavelen = rdiv(2 * M_PI, inv_freq);
    at::Tensor llama = at::where(wavelen > low_wavelen, inv_freq / rs.factor, inv_freq);
    at::Tensor smooth = (rdiv(old_ctx, wavelen) - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
    at::Tensor smoothed = (1 - smooth) * llama / rs.factor + smooth * llama;
    at::Tensor is_medium = at::logical_not(wavelen < high_wavelen).logical_and(at::logical_not(wavelen > low_wavelen));
    return at::where(is_medium, smoothed, llama);
  }
  return inv_freq;
}

std::pair<at::Tensor, at::Tensor> rope_cos_sin(const LlamaConfig& cfg, const at::Tensor& position_ids_bt,
                                               at::ScalarType dtype) {
  ALPACA_CHECK(position_ids_bt.dim() == 2, "position_ids must be (batch, seq), got " << position_ids_bt.sizes());
  // Only dynamic scaling depends on the length; reading it is a device sync, so skip it otherwise.
  const int64_t seq_len = cfg.rope_scaling.type == "dynamic" && position_ids_bt.numel()
                              ? position_ids_bt.max().item<int64_t>() + 1
                              : 0;
  at::Tensor inv_freq = rope_inv_freq(cfg, seq_len, position_ids_bt.device());
  at::Tensor freqs_btf = position_ids_bt.unsqueeze(-1).to(at::kFloat) * inv_freq;
  at::Tensor emb_btd = at::cat({freqs_btf, freqs_btf}, -1);
  return {emb_btd.cos().to(dtype), emb_btd.sin().to(dtype)};
}

at::Tensor apply_rope(const at::Tensor& x_bhtd, const at::Tensor& cos_btd, const at::Tensor& sin_btd) {
  const int64_t half = x_bhtd.size(-1) / 2;
  at::Tensor x1 = x_bhtd.narrow(-1, 0, half);
  at::Tensor x2 = x_bhtd.narrow(-1, half, half);
  at::Tensor rotated = at::cat({-x2, x1}, -1);
  at::Tensor cos = cos_btd.unsqueeze(1), sin = sin_btd.unsqueeze(1);
  return x_bhtd * cos + rotated * sin;
}

}  // namespace alpaca::model
