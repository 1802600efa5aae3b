// The CPU kernels of the generation step on raw rows, for callers that manage their own buffers
// and threads (model::bf16_gemv, the fused CPU decode step CpuDecoder). One internal header for
// two files, both compiled with -fopenmp and without the precompiled header (CMakeLists.txt):
//
// gemv:: (src/model/gemv.cpp), the weight-streaming products
//   y[i * ldy + j] = sum_c x[i * ldx + c] * w[j * k + c]   for i < m, j in [n0, n1)
// with m = 1 to kMaxRows rows of x against a row-major (n, k) weight. Every weight row is read from
// memory once for all m rows of x, one row after another (one sequential stream, which this
// class of CPU prefetches best); sums are fp32, and `y` gets them as they are (float) or rounded
// once (bf16). x86-64 with AVX-512F (fp32) / AVX512-BF16 (bf16) only: callers check the
// have_* functions first (the runtime dispatch).
//
// decode:: (src/model/decode_kernels.cpp), the per-row ops of one decode step, each rounding to
// the compute dtype T (float or bf16) where transformers' module path rounds. dot and axpy (and
// attend, built on them) use AVX-512F on x86-64: callers check gemv::have_avx512f() first; other
// CPUs get plain loops.
#pragma once

#include <c10/util/BFloat16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace alpaca::model {
namespace gemv {

constexpr int kMaxRows = 8;

bool have_avx512f();      // this CPU runs f32_rows
bool have_avx512_bf16();  // this CPU runs bf16_rows

void f32_rows(const float* x, int64_t ldx, int m, const float* w, int64_t k, int64_t n0, int64_t n1, float* y,
              int64_t ldy);
void bf16_rows(const c10::BFloat16* x, int64_t ldx, int m, const c10::BFloat16* w, int64_t k, int64_t n0, int64_t n1,
               float* y, int64_t ldy);
void bf16_rows(const c10::BFloat16* x, int64_t ldx, int m, const c10::BFloat16* w, int64_t k, int64_t n0, int64_t n1,
               c10::BFloat16* y, int64_t ldy);

}  // namespace gemv

namespace decode {

using c10::BFloat16;
constexpr int64_t kMaxHeadDim = 512;  // rope_head and attend keep a head in fp32 on the stack

// Rounding to the compute dtype where the module path produces a tensor of that dtype.
template <typename T>
inline float round_to(float v) {
  if constexpr (std::is_same_v<T, BFloat16>) return static_cast<float>(BFloat16(v));
  return v;
}

// silu(g) * u as transformers' LlamaMLP computes it on tensors of dtype T: act_fn(gate) is
// rounded to T, the product is rounded by the caller's store.
template <typename T>
inline float silu_mul(float g, float u) {
  return round_to<T>(g / (1.0F + std::exp(-g))) * u;
}

// sum_c q[c] * k[c] over n values in fp32 (16-lane partial sums).
float dot(const float* q, const float* k, int64_t n);
float dot(const float* q, const BFloat16* k, int64_t n);

// out[c] += a * v[c] over n values, fp32 (fused multiply-add).
void axpy(float a, const float* v, float* out, int64_t n);
void axpy(float a, const BFloat16* v, float* out, int64_t n);

// transformers' LlamaRMSNorm of one row of n values: fp32 mean of squares, x * rsqrt(var + eps)
// rounded to T, times the weight (in T).
void rms_norm(const float* x, const float* w, float eps, int64_t n, float* out);
void rms_norm(const BFloat16* x, const BFloat16* w, float eps, int64_t n, BFloat16* out);

// apply_rope on one head of dh (even, <= kMaxHeadDim) values in place: x * cos + rotate_half(x) *
// sin, each product and the sum rounded to T as the three tensor ops of the module path are.
void rope_head(float* x, const float* cos, const float* sin, int64_t dh);
void rope_head(BFloat16* x, const BFloat16* cos, const BFloat16* sin, int64_t dh);

// One query head over `keys` cached positions: softmax(q . k_j * scale) over the allowed keys
// (allow[j], or all when allow is null; a query with none sees only key `self`, the cached
// context's rule), times v, into out (dh values, rounded to T). k and v are (keys, dh) rows;
// scores is scratch for `keys` floats.
void attend(const float* q, const float* k, const float* v, int64_t keys, const bool* allow, int64_t self, int64_t dh,
            float scale, float* scores, float* out);
void attend(const BFloat16* q, const BFloat16* k, const BFloat16* v, int64_t keys, const bool* allow, int64_t self,
            int64_t dh, float scale, float* scores, BFloat16* out);

}  // namespace decode
}  // namespace alpaca::model
