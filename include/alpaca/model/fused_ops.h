// Fused bf16 CPU kernels for the elementwise blocks of a LLaMA layer in training: RMSNorm, RoPE and
// SiLU(gate) * up, each one pass forward and one backward (src/model/fused_ops.cpp) in place of the
// 4-10 ATen ops, temporaries and autograd nodes of the module path, with the same math:
// - rope_bf16 and silu_mul_bf16 round to bf16 where the module path's bf16 ops round (after every
//   product and sum), so RoPE is bit-identical forward and backward, and SiLU*mul differs from
//   ATen's only where its exp (Sleef) and ours differ in the last fp32 bit before the rounding;
// - rms_norm_bf16 normalises in fp32 and rounds once before the weight, as transformers; its sums
//   run in another order than ATen's mean, so the rare value on a rounding boundary differs by one
//   bf16 ulp. Backward saves x (bf16) and one fp32 scale per row, not the fp32 copies the module path
//   keeps, so a bf16 layer's saved activations shrink (docs/memory.md).
// Only bf16 CPU tensors take them (fp32 keeps the module path, bit for bit); the row loops are
// compiled for AVX-512 (F+BW), AVX2 and baseline x86-64 from one source, chosen at run time.
// ALPACA_CPU_FUSED=0 (or set_fused_cpu_bf16(false)) turns them off: the module path everywhere,
// for comparisons.
#pragma once

#include <ATen/ATen.h>  // defines: at::Tensor

namespace alpaca::model {

// The instruction set the row loops run with: the best this CPU has, unless set (tests run every
// variant this CPU can and compare them bit for bit). Ordered: a CPU that runs one runs those below.
enum class FusedCpuIsa { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };
FusedCpuIsa best_fused_cpu_isa();
FusedCpuIsa fused_cpu_isa();
void set_fused_cpu_isa(FusedCpuIsa isa);

// Whether `x` takes the fused kernels: bf16, on the CPU, and not turned off.
bool fused_cpu_bf16_applies(const at::Tensor& x);
void set_fused_cpu_bf16(bool on);

// RMSNorm of x (..., D) with weight (D), both bf16: w * bf16(x * rsqrt(mean(x^2) + eps)).
at::Tensor rms_norm_bf16(const at::Tensor& x, const at::Tensor& weight, double eps);

// RoPE of x (B, T, H, Dh) (any strides; the projections' output viewed per head) with cos/sin
// (B, T, Dh) bf16: x * cos + rotate_half(x) * sin, returned contiguous (B, T, H, Dh).
at::Tensor rope_bf16(const at::Tensor& x_bthd, const at::Tensor& cos_btd, const at::Tensor& sin_btd);

// SiLU(gate) * up, both (..., F) bf16 of one shape.
at::Tensor silu_mul_bf16(const at::Tensor& gate, const at::Tensor& up);

}  // namespace alpaca::model
