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

// y = x W^T (+ b), differentiable, as at::linear under the policy above; a bias-less product
// that bf16_gemv_applies to takes bf16_gemv instead.
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});
// Whether a product of these operands takes the fp32 route (for fused kernels that run their
// own GEMMs and upcast each operand once rather than per product).
bool bf16_gemm_via_fp32(const at::Tensor& a, const at::Tensor& b);

// Attention under the same policy: ATen's bf16 flash kernel runs its products through cpublas's
// bf16 GEMM, which on a CPU without native bf16 is a scalar loop (backward ~7x the fp32 kernel's
// time at T 512, measured capped at AVX2: docs/profile_bf16.md). There (kFp32) bf16 q, k, v take
// ATen's flash kernel in fp32 on their exact upcasts, output and gradients rounded to bf16 once;
// it saves bf16 q, k, v and the fp32 output and logsumexp (2 bytes an output element more than the
// bf16 kernel, for gradients within one rounding). q (B, H, T, D), k and
// v (B, H / n_rep, K, D) (GQA: the n_rep query heads' key/value gradients summed in fp32);
// `allow_mask` a boolean (B, 1, T, K) mask (true = may attend) or undefined with `is_causal`.
// ALPACA_CPU_ATTN=0 turns it off (fused_ops.h's cpu_attention_routes_on).
bool bf16_attention_via_fp32(const at::Tensor& q);
// (B, Hkv, T, D) -> (B, Hkv * n_rep, T, D), as transformers' repeat_kv: query head h reads key/value
// head h / n_rep (SDPA with a mask and the fp32 route take GQA this way).
at::Tensor repeat_kv(const at::Tensor& x, int64_t n_rep);
at::Tensor attention_via_fp32(const at::Tensor& q_bhtd, const at::Tensor& k_bhtd, const at::Tensor& v_bhtd,
                              const at::Tensor& allow_mask, bool is_causal, double scale);

// The decode step's bf16 product (src/model/gemv.cpp): x (..., in) with at most 2 rows in
// all, weight (out, in), both bf16 on a CPU with AVX512-BF16 in kNative mode, no autograd
// (GradMode off or neither operand requiring grad). y = x W^T in bf16 from fp32 sums (one
// rounding, as a bf16 GEMM), reading each weight row once for every row of x; the weight rows are
// split across the intra-op threads. oneDNN streams the weights at about 0.6x this speed at
// these shapes, and a batch-1 generation step is mostly that stream.
bool bf16_gemv_applies(const at::Tensor& x, const at::Tensor& weight);
at::Tensor bf16_gemv(const at::Tensor& x, const at::Tensor& weight);

}  // namespace alpaca::model
