// The cross-entropy rows of the fused head loss (src/model/loss.cpp) for bf16 logits on the CPU:
// one kernel per row in place of ATen's upcast, amax, exp, sum, div, scatter and downcast passes
// over a chunk x vocabulary fp32 copy. Internal to src/model/.
#pragma once

#include <ATen/ATen.h>  // defines: at::Tensor

namespace alpaca::model {

// z (n, V) bf16, contiguous, CPU: logits rows; targets (n) int64, each in [0, V). Returns the sum
// over rows of logsumexp(z_i) - z_i[t_i] (each row in fp32, summed in row order: the same for any
// thread count). With write_grad, overwrites z with d(loss)/dz = softmax(z_i) - onehot(t_i),
// rounded to bf16 once (the fp32 softmax, minus one at the target, then the rounding: what the
// ATen passes compute). Row loops compiled for AVX-512 / AVX2 / baseline, picked as the fused
// kernels' (fused_cpu_isa()).
double cross_entropy_rows_bf16(at::Tensor& z, const at::Tensor& targets, bool write_grad);

}  // namespace alpaca::model
