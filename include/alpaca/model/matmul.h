// Matrix products of the model in its compute dtype, with one CPU-specific choice.
//
// A bf16 matmul on a CPU without native bf16 dot products (no AVX512_BF16 / AMX) runs as an
// emulated oneDNN kernel that is several times slower than MKL's fp32 GEMM on the same numbers.
// There, kFp32 computes each bf16 product as an fp32 GEMM of the exactly-upcast operands with the
// result rounded to bf16 once — the contract of a bf16 GEMM (fp32 accumulation, one rounding) —
// while autograd still saves the bf16 operands, so activation memory does not grow. Only the
// summation order differs from the native kernel. GPUs and other dtypes always take the native
// kernel. Default: kFp32 when this CPU lacks native bf16, else kNative; ALPACA_CPU_BF16_GEMM=native
// or =fp32 overrides it, as does set_cpu_bf16_gemm (tests).
#pragma once

#include <ATen/ATen.h>  // defines: at::Tensor

namespace alpaca::model {

enum class CpuBf16Gemm { kNative, kFp32 };

CpuBf16Gemm cpu_bf16_gemm();
void set_cpu_bf16_gemm(CpuBf16Gemm mode);
// Whether this CPU has native bf16 dot products (AVX512_BF16 or AMX-BF16), from /proc/cpuinfo.
bool cpu_has_native_bf16();

// y = x W^T (+ b), differentiable, as at::linear under the policy above.
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});
// Whether a product of these operands takes the fp32 route (for fused kernels that run their
// own GEMMs and upcast each operand once rather than per product).
bool bf16_gemm_via_fp32(const at::Tensor& a, const at::Tensor& b);

}  // namespace alpaca::model
