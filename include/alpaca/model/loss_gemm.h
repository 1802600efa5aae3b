// How the fused head loss (model/loss.h) forms the bf16 lm_head gradient on this CPU; the memory
// planner asks (src/model/loss_rows.cpp).
#pragma once

namespace alpaca::model {

// Whether bf16 CPU training sums the lm_head weight gradient in fp32 inside our AVX512-BF16 GEMM
// (the fused kernels on, a CPU with AVX512-BF16 and without AMX: src/model/bf16_gemm.h), so that no
// bf16 V x D product and no fp32 copy of it exist per chunk.
bool head_grad_summed_in_cpu_gemm();

}  // namespace alpaca::model
