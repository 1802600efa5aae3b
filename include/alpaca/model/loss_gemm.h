// How the fused head loss (model/loss.h) forms the bf16 lm_head gradient on this CPU; the memory
// planner asks (src/model/loss_rows.cpp).
#pragma once

namespace alpaca::model {

// Whether bf16 CPU training sums the lm_head weight gradient in fp32 inside the packed bf16 GEMM
// (the fused kernels on, a fast backend of src/model/bf16_gemm.h: our AVX512-BF16 kernel, or oneDNN's
// brgemm on an AMX CPU), so that no bf16 V x D product exists per chunk.
bool head_grad_summed_in_cpu_gemm();

}  // namespace alpaca::model
