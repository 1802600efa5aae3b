#include "alpaca/model/matmul.h"

#include <torch/csrc/autograd/custom_function.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

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

}  // namespace alpaca::model
