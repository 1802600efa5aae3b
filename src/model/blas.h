// The BLAS LibTorch carries (MKL on x86 wheels), called directly for fp32 products on raw rows: ATen's
// cpublas::gemm for float is not exported, and at::mm costs a tensor and a dispatch per call (the GEMM
// attention makes ~20k a step). Looked up at run time (the Fortran `sgemm_`
// LibTorch exports, as ATen's own BLAS declarations spell it, 32-bit sizes), so a LibTorch without one
// keeps ATen's routes rather than failing to link. Internal to src/model/.
#pragma once

#include <ATen/ATen.h>  // defines: at::Tensor

#include <cstdint>

namespace alpaca::model::blas {

// Whether this LibTorch exports sgemm_.
bool sgemm_available();

// Row-major C (m x n, row stride ldc) = op(A) op(B) + beta C; op(A) is (m x k): A as stored (row stride
// lda), or with a_t A^T of a stored (k x m). Likewise B. Sizes and strides below 2^31. Needs
// sgemm_available().
void sgemm(bool a_t, bool b_t, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
           int64_t ldb, float beta, float* c, int64_t ldc);

// The same on 2-D fp32 CPU tensors, each with unit stride along one dimension (rows of any stride, e.g.
// padded, or a transposed view): c = a b + beta c, written in place into c (whose rows have unit stride).
void mm(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, float beta = 0.0f);

}  // namespace alpaca::model::blas
