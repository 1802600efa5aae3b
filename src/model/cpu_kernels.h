// The decode step's weight-streaming products on raw rows (src/model/gemv.cpp), for callers that
// manage their own buffers and threads (model::bf16_gemv, the fused CPU decode step):
//   y[i * ldy + j] = sum_c x[i * ldx + c] * w[j * k + c]   for i < m, j in [n0, n1)
// with m = 1 to kMaxRows rows of x against a row-major (n, k) weight. Every weight row is read from
// memory once for all m rows of x, one row after another (one sequential stream, which this
// class of CPU prefetches best); sums are fp32, and `y` gets them as they are (float) or rounded
// once (bf16). x86-64 with AVX-512F (fp32) / AVX512-BF16 (bf16) only: callers check the
// have_* functions first.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>

namespace alpaca::model::gemv {

constexpr int kMaxRows = 8;

bool have_avx512f();      // this CPU runs f32_rows
bool have_avx512_bf16();  // this CPU runs bf16_rows

void f32_rows(const float* x, int64_t ldx, int m, const float* w, int64_t k, int64_t n0, int64_t n1, float* y,
              int64_t ldy);
void bf16_rows(const c10::BFloat16* x, int64_t ldx, int m, const c10::BFloat16* w, int64_t k, int64_t n0, int64_t n1,
               float* y, int64_t ldy);
void bf16_rows(const c10::BFloat16* x, int64_t ldx, int m, const c10::BFloat16* w, int64_t k, int64_t n0, int64_t n1,
               c10::BFloat16* y, int64_t ldy);

}  // namespace alpaca::model::gemv
