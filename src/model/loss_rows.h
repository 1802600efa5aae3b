// The cross-entropy rows of the fused head loss (src/model/loss.cpp) for bf16 logits on the CPU:
// one kernel per row in place of ATen's upcast, amax, exp, sum, div, scatter and downcast passes
// over a chunk x vocabulary fp32 copy. Internal to src/model/.
#pragma once

#include <ATen/ATen.h>  // defines: at::Tensor

#include <cstdint>

namespace alpaca::model {

// z (n, V) bf16, contiguous, CPU: logits rows; targets (n) int64, each in [0, V). Returns the sum
// over rows of logsumexp(z_i) - z_i[t_i] (each row in fp32, summed in row order: the same for any
// thread count). With write_grad, overwrites z with d(loss)/dz = softmax(z_i) - onehot(t_i),
// rounded to bf16 once (the fp32 softmax, minus one at the target, then the rounding: what the
// ATen passes compute). Row loops compiled for AVX-512 / AVX2 / baseline, picked as the fused
// kernels' (fused_cpu_isa()).
// With `stats`, also adds each row's softmax entropy and whether its target is the argmax (the
// first index among equal maxima), from the same bf16 logits, before any gradient is written.
struct RowTokenStats {
  double entropy_sum = 0;
  int64_t top1 = 0;
};
double cross_entropy_rows_bf16(at::Tensor& z, const at::Tensor& targets, bool write_grad,
                               RowTokenStats* stats = nullptr);

// The same statistics over fp32 logits z (n, V), CPU, unit column stride (the padded rows' views
// too), in two read-only passes a row with the fused kernels' exp; returns the rows' maxima (n, 1),
// exactly amax's, for the ATen passes that follow. Targets must be in [0, V), as the loss checks.
at::Tensor token_stats_rows_f32(const at::Tensor& z, const at::Tensor& targets, RowTokenStats& stats);

// The row stride for a chunk's fp32 logits (n, V) computed on the CPU with the lm_head weight w (V, D):
// V rounded up to 16 floats (64 bytes) where V is not already a multiple, 0 where the logits keep
// ATen's fresh contiguous tensor (V a multiple of 16; not fp32; not on the CPU; ALPACA_CPU_FUSED=0; no
// BLAS sgemm_ in this LibTorch, blas.h, which computes each chunk straight into the padded rows).
// MKL's sgemm writes unaligned output rows ~1.4x slower: Alpaca's 32001-word vocabulary (LLaMA's
// 32000 plus the [PAD] its recipe adds) ran h w^T at 66 GFLOP/s a core where 32016-float rows run
// at 89-94 (AMD EPYC, AVX-512; the bits are the same). The caller keeps one buffer of such rows
// for all its chunks and computes each chunk into a (n, V) view of it.
int64_t fp32_logits_row_stride(const at::Tensor& w);

// The lm_head weight gradient of one chunk summed in fp32 inside the GEMM: grad_w (V, D) fp32
// += g^T h, g (n, V) the logits gradient, h (n, D) the chunk's hidden rows, both bf16, contiguous,
// on the CPU; an undefined grad_w is allocated and written (the first chunk: no zero fill). Only
// where the packed GEMM is fast (bf16_gemm.h: fast(), our AVX512-BF16 kernel or oneDNN's on AMX) and
// the operands are bf16; returns false, doing nothing, elsewhere (the caller keeps ATen's product).
// Each element is one fp32 sum over the chunk's rows in order (the same for any thread count): no
// bf16 V x D product (before: rounded once a chunk), no fp32 temporary of it, no transposed copy of g;
// the vocabulary is taken in blocks of rows packed where they are used (L1/L2).
bool head_weight_grad_bf16(at::Tensor& grad_w, const at::Tensor& g, const at::Tensor& h);

// grad_w (V, D) fp32 += g^T h for one chunk of 16-bit g (n, V) and h (n, D), whichever GEMM runs
// (grad_w undefined: allocated from the first chunk). Where head_weight_grad_bf16 applies, its sum
// inside the GEMM; elsewhere (GPUs, the cpublas backend with native bf16 products) ATen's product
// of the chunk in the compute dtype, added into fp32. On the CPU with the fused kernels on, that
// product is written into `scratch` (one V x D buffer the caller keeps across its chunks, not one
// allocated a chunk) and added in one pass (add_bf16_into_fp32: add_'s bits without the full-size
// fp32 copy of the product add_ makes first): the same bits as `grad_w.add_(at::mm(g.t(), h))`.
void accumulate_head_weight_grad(at::Tensor& grad_w, at::Tensor& scratch, const at::Tensor& g, const at::Tensor& h);

}  // namespace alpaca::model
