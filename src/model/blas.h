// The BLAS LibTorch carries (MKL on x86 wheels), called directly for fp32 products on raw rows: ATen's
// cpublas::gemm for float is not exported, and at::mm_out costs a tensor and a dispatch per call (the
// GEMM attention makes ~20k a step) and, into an `out` whose rows are padded, a full-size contiguous
// temporary (the structured kernel's proxy) copied back. Looked up at run time (the Fortran `sgemm_`
// LibTorch exports, as ATen's own BLAS declarations spell it, 32-bit sizes), so a LibTorch without one
// keeps ATen's routes rather than failing to link. Internal to src/model/.
#pragma once

#include <cstdint>

namespace alpaca::model::blas {

// Whether this LibTorch exports sgemm_.
bool sgemm_available();

// Row-major C (m x n, row stride ldc) = op(A) op(B) + beta C; op(A) is (m x k): A as stored (row stride
// lda), or with a_t A^T of a stored (k x m). Likewise B. Sizes and strides below 2^31. Needs
// sgemm_available().
void sgemm(bool a_t, bool b_t, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
           int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace alpaca::model::blas
