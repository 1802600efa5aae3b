#include "alpaca/model/matmul.h"

#include <torch/csrc/autograd/custom_function.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>

#include "alpaca/model/fused_ops.h"
#include "alpaca/util/cpu_features.h"
#include "alpaca/util/error.h"
#include "alpaca/util/trace.h"

namespace alpaca::model {
namespace {

CpuBf16Gemm default_mode() {
  if (const char* env = std::getenv("ALPACA_CPU_BF16_GEMM"); env != nullptr && *env != '\0') {
    if (std::strcmp(env, "native") == 0) return CpuBf16Gemm::kNative;
    if (std::strcmp(env, "fp32") == 0) return CpuBf16Gemm::kFp32;
    ALPACA_FAIL("ALPACA_CPU_BF16_GEMM=" << env << " is not understood; use native or fp32");
  }
  return cpu_has_native_bf16() ? CpuBf16Gemm::kNative : CpuBf16Gemm::kFp32;
}

std::atomic<int>& mode_slot() {
  static std::atomic<int> slot{static_cast<int>(default_mode())};
  return slot;
}

// linear in fp32 on upcast bf16 operands; saves the bf16 operands, recomputes the upcasts.
// (Autograd functions take no undefined inputs, hence the bias-less twin.)
at::Tensor fp32_linear_forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  at::Tensor y = b.defined() ? at::linear(x.to(at::kFloat), w.to(at::kFloat), b.to(at::kFloat))
                             : at::linear(x.to(at::kFloat), w.to(at::kFloat));
  return y.to(x.scalar_type());
}

torch::autograd::tensor_list fp32_linear_backward(torch::autograd::AutogradContext* ctx, const at::Tensor& grad_y,
                                                  bool has_bias) {
  const auto saved = ctx->get_saved_variables();
  const at::Tensor& x = saved[0];
  const at::Tensor& w = saved[1];
  const int64_t in = w.size(1), out = w.size(0);
  const at::Tensor g = grad_y.to(at::kFloat).reshape({-1, out});
  at::Tensor gx, gw, gb;
  if (ctx->needs_input_grad(0)) gx = at::mm(g, w.to(at::kFloat)).to(x.scalar_type()).view(x.sizes());
  if (ctx->needs_input_grad(1)) gw = at::mm(g.t(), x.reshape({-1, in}).to(at::kFloat)).to(w.scalar_type());
  if (has_bias && ctx->needs_input_grad(2)) gb = g.sum(0).to(w.scalar_type());
  if (has_bias) return {gx, gw, gb};
  return {gx, gw};
}

struct Fp32Linear : public torch::autograd::Function<Fp32Linear> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w) {
    ctx->save_for_backward({x, w});
    return fp32_linear_forward(x, w, {});
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grad_out) {
    return fp32_linear_backward(ctx, grad_out[0], /*has_bias=*/false);
  }
};

struct Fp32LinearBias : public torch::autograd::Function<Fp32LinearBias> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const at::Tensor& b) {
    ctx->save_for_backward({x, w});
    return fp32_linear_forward(x, w, b);
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grad_out) {
    return fp32_linear_backward(ctx, grad_out[0], /*has_bias=*/true);
  }
};

}  // namespace

bool cpu_has_native_bf16() {
  static const bool has = cpu::has(cpu::Feature::kAvx512bf16) || cpu::has(cpu::Feature::kAmxBf16);
  return has;
}

CpuBf16Gemm cpu_bf16_gemm() { return static_cast<CpuBf16Gemm>(mode_slot().load(std::memory_order_relaxed)); }
void set_cpu_bf16_gemm(CpuBf16Gemm mode) { mode_slot().store(static_cast<int>(mode), std::memory_order_relaxed); }

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  ALPACA_TRACE("cat:linear");
  if (!bias.defined() && bf16_gemv_applies(x, weight)) return bf16_gemv(x, weight);
  if (bf16_gemm_via_fp32(x, weight)) return bias.defined() ? Fp32LinearBias::apply(x, weight, bias) : Fp32Linear::apply(x, weight);
  return bias.defined() ? at::linear(x, weight, bias) : at::linear(x, weight);
}

bool bf16_gemm_via_fp32(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == at::kBFloat16 && b.scalar_type() == at::kBFloat16 && a.device().is_cpu() &&
         cpu_bf16_gemm() == CpuBf16Gemm::kFp32;
}

at::Tensor repeat_kv(const at::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  const int64_t b = x.size(0), h = x.size(1), t = x.size(2), dh = x.size(3);
  return x.unsqueeze(2).expand({b, h, n_rep, t, dh}).reshape({b, h * n_rep, t, dh});
}

namespace {

// The gradient of repeat_kv: the n_rep query heads of a key/value head summed (in fp32).
at::Tensor sum_heads(const at::Tensor& g, int64_t n_rep) {
  if (n_rep == 1) return g;
  return g.view({g.size(0), -1, n_rep, g.size(2), g.size(3)}).sum(2);
}

// ATen's CPU flash kernel on fp32 upcasts of bf16 q, k, v; saves the bf16 operands, the fp32 output
// and logsumexp, and upcasts the operands again in backward. (The backward's rowsum(dO * O) on the
// bf16-rounded output instead would cost dQ and dK ~1% of their scale: it cancels against dP.)
struct Fp32Attention : public torch::autograd::Function<Fp32Attention> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& bias, bool is_causal, double scale) {
    const int64_t n_rep = q.size(1) / k.size(1);
    const std::optional<at::Tensor> b = bias.numel() > 0 ? std::optional<at::Tensor>(bias) : std::nullopt;
    auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(
        q.to(at::kFloat), repeat_kv(k.to(at::kFloat), n_rep), repeat_kv(v.to(at::kFloat), n_rep), 0.0, is_causal, b, scale);
    ctx->save_for_backward({q, k, v, out, lse, bias});
    ctx->saved_data["causal"] = is_causal;
    ctx->saved_data["scale"] = scale;
    return out.to(at::kBFloat16);
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grad_out) {
    const auto s = ctx->get_saved_variables();
    const at::Tensor &q = s[0], &k = s[1], &v = s[2], &bias = s[5];
    const int64_t n_rep = q.size(1) / k.size(1);
    const std::optional<at::Tensor> b = bias.numel() > 0 ? std::optional<at::Tensor>(bias) : std::nullopt;
    auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        grad_out[0].to(at::kFloat), q.to(at::kFloat), repeat_kv(k.to(at::kFloat), n_rep),
        repeat_kv(v.to(at::kFloat), n_rep), s[3], s[4], 0.0, ctx->saved_data["causal"].toBool(), b,
        ctx->saved_data["scale"].toDouble());
    return {dq.to(at::kBFloat16), sum_heads(dk, n_rep).to(at::kBFloat16), sum_heads(dv, n_rep).to(at::kBFloat16),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

namespace {

// ATen's own conversion of a boolean mask (convert_boolean_attn_mask): 0 where allowed, -inf
// elsewhere; kept for the last mask seen on this thread. Every layer of a micro-batch passes the
// same mask tensor (LayerContext::attn_mask), so it is converted once per micro-batch, not per layer
// call. The cache holds the mask itself (its TensorImpl cannot be reused while held) and its version
// (an in-place change converts again).
at::Tensor float_mask_of(const at::Tensor& allow_mask) {
  thread_local at::Tensor mask, bias;
  thread_local int64_t version = -1;
  if (!mask.defined() || mask.unsafeGetTensorImpl() != allow_mask.unsafeGetTensorImpl() ||
      version != static_cast<int64_t>(allow_mask._version())) {
    bias = at::zeros(allow_mask.sizes(), allow_mask.options().dtype(at::kFloat))
               .masked_fill_(allow_mask.logical_not(), -std::numeric_limits<float>::infinity());
    mask = allow_mask;
    version = static_cast<int64_t>(allow_mask._version());
  }
  return bias;
}

}  // namespace

bool bf16_attention_via_fp32(const at::Tensor& q) {
  return q.scalar_type() == at::kBFloat16 && q.device().is_cpu() && cpu_bf16_gemm() == CpuBf16Gemm::kFp32 &&
         cpu_attention_routes_on();
}

at::Tensor attention_via_fp32(const at::Tensor& q_bhtd, const at::Tensor& k_bhtd, const at::Tensor& v_bhtd,
                              const at::Tensor& allow_mask, bool is_causal, double scale) {
  ALPACA_CHECK(bf16_attention_via_fp32(q_bhtd) && k_bhtd.scalar_type() == at::kBFloat16 &&
                   v_bhtd.scalar_type() == at::kBFloat16 && q_bhtd.dim() == 4 && k_bhtd.dim() == 4 &&
                   q_bhtd.size(1) % k_bhtd.size(1) == 0 && !(is_causal && allow_mask.defined()),
               "attention_via_fp32: needs bf16 CPU q (B, H, T, D), k and v (B, H / n, K, D) in kFp32 mode, and a mask or "
               "is_causal, not both; got q " << q_bhtd.sizes() << " " << q_bhtd.scalar_type() << ", k " << k_bhtd.sizes());
  const at::Tensor bias = allow_mask.defined() ? float_mask_of(allow_mask)
                                               : at::empty({0}, q_bhtd.options().dtype(at::kFloat));
  return Fp32Attention::apply(q_bhtd, k_bhtd, v_bhtd, bias, is_causal, scale);
}

}  // namespace alpaca::model
