// RoPE frequencies as transformers' modeling_rope_utils.py computes them, so cos/sin match
// to the last bit in fp32 (same ops, same order, same dtypes).
#include "alpaca/model/rope.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "alpaca/util/error.h"

namespace alpaca::model {
namespace {

// Python's `scalar / tensor` is tensor.reciprocal() * scalar; mirror it for identical bits.
at::Tensor rdiv(double s, const at::Tensor& t) { return t.reciprocal() * s; }

at::Tensor exponents(int64_t dim, const at::Device& device) {
  return at::arange(0, dim, 2, at::TensorOptions().dtype(at::kLong).device(device)).to(at::kFloat) /
         static_cast<double>(dim);
}

// transformers' _compute_yarn_parameters: each frequency between its extrapolated (plain) and
// interpolated (divided by factor) value, by a linear ramp over the dimensions whose wavelength
// falls between beta_fast and beta_slow rotations of the pretraining context. Python floats are
// doubles here; the tensors fp32, in the same order of operations.
at::Tensor yarn_inv_freq(const LlamaConfig& cfg, const at::Device& device) {
  const RopeScaling& rs = cfg.rope_scaling;
  const int64_t dim = cfg.head_dim;
  const double base = cfg.rope_theta;
  const double ctx = static_cast<double>(rs.original_max_position_embeddings);
  auto correction_dim = [&](double rotations) {
    return (static_cast<double>(dim) * std::log(ctx / (rotations * 2 * M_PI))) / (2 * std::log(base));
  };
  double low = correction_dim(rs.beta_fast), high = correction_dim(rs.beta_slow);
  if (rs.truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // transformers: "prevent singularity"
  at::Tensor pos_freqs = at::pow(at::Scalar(base), exponents(dim, device));
  at::Tensor extrapolation = rdiv(1.0, pos_freqs);
  at::Tensor interpolation = rdiv(1.0, pos_freqs * rs.factor);
  at::Tensor ramp = ((at::arange(dim / 2, at::TensorOptions().dtype(at::kFloat)) - low) / (high - low)).clamp(0, 1);
  at::Tensor extrapolation_factor = (1 - ramp).to(device);
  return interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor;
}

}  // namespace

double rope_attention_scaling(const LlamaConfig& cfg) {
  const RopeScaling& rs = cfg.rope_scaling;
  if (rs.attention_factor) return *rs.attention_factor;
  if (rs.type == "yarn") {
    auto get_mscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
    if (rs.mscale != 0.0 && rs.mscale_all_dim != 0.0)
      return get_mscale(rs.factor, rs.mscale) / get_mscale(rs.factor, rs.mscale_all_dim);
    return get_mscale(rs.factor, 1.0);
  }
  if (rs.type == "longrope") {
    if (rs.factor <= 1.0) return 1.0;
    return std::sqrt(1 + std::log(rs.factor) / std::log(static_cast<double>(rs.original_max_position_embeddings)));
  }
  return 1.0;
}

at::Tensor rope_inv_freq(const LlamaConfig& cfg, int64_t seq_len, const at::Device& device) {
  const int64_t dim = cfg.head_dim;
  const RopeScaling& rs = cfg.rope_scaling;
  if (rs.type == "yarn") return yarn_inv_freq(cfg, device);
  if (rs.type == "longrope") {
    // The long factors once the positions pass the pretraining context (the highest position of
    // the whole batch, as transformers' longrope_frequency_update), the short ones below it.
    const auto& ext = seq_len > rs.original_max_position_embeddings ? rs.long_factor : rs.short_factor;
    at::Tensor ext_factors =
        at::tensor(std::vector<float>(ext.begin(), ext.end()), at::TensorOptions().dtype(at::kFloat)).to(device);
    return rdiv(1.0, ext_factors * at::pow(at::Scalar(cfg.rope_theta), exponents(dim, device)));
  }
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
  // Only dynamic and longrope scaling depend on the length; reading it is a device sync, so skip it otherwise.
  const bool by_length = cfg.rope_scaling.type == "dynamic" || cfg.rope_scaling.type == "longrope";
  const int64_t seq_len = by_length && position_ids_bt.numel()
                              ? position_ids_bt.max().item<int64_t>() + 1
                              : 0;
  at::Tensor inv_freq = rope_inv_freq(cfg, seq_len, position_ids_bt.device());
  at::Tensor freqs_btf = position_ids_bt.unsqueeze(-1).to(at::kFloat) * inv_freq;
  at::Tensor emb_btd = at::cat({freqs_btf, freqs_btf}, -1);
  const double scaling = rope_attention_scaling(cfg);
  if (scaling == 1.0) return {emb_btd.cos().to(dtype), emb_btd.sin().to(dtype)};  // x * 1.0 is x
  return {(emb_btd.cos() * scaling).to(dtype), (emb_btd.sin() * scaling).to(dtype)};
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
