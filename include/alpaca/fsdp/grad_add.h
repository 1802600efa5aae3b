// The reduced gradient shard added into its fp32 master gradient (src/fsdp/engine.cpp's reduction).
#pragma once

#include <ATen/ATen.h>  // defines: at::Tensor

namespace alpaca::fsdp {

// grad += src: a contiguous CPU fp32 grad and a bf16 src of as many elements take one fused pass
// (the upcast inside the add, no fp32 copy of src first, as ATen's add_ makes on the CPU; the same
// bits; model::add_bf16_into_fp32, the fused kernels' per-instruction-set row loop); anything else ATen's add_.
void add_gradient(at::Tensor& grad, const at::Tensor& src);

}  // namespace alpaca::fsdp
