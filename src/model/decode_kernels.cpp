// The per-row kernels of the fused CPU decode step (cpu_kernels.h, namespace decode): dot and axpy
// over head_dim values in AVX-512F, and the norm, RoPE and attention of one row or head built on
// them. Compiled with -fopenmp and without the precompiled header, as gemv.cpp (CMakeLists.txt).
#include "cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// GCC 12 warns inside its own AVX-512 intrinsics (GCC bug 105593), as in gemv.cpp.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace alpaca::model::decode {
namespace {

// --- q . k and out += p v over head_dim values -------------------------------------------------
#if defined(__x86_64__)
#define ALPACA_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))
ALPACA_AVX512 inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
ALPACA_AVX512 inline __m512 load16(const BFloat16* p, __mmask16 m) {
  const __m256i raw = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
inline __mmask16 lanes(int64_t left) { return left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1U << left) - 1); }

template <typename T>
ALPACA_AVX512 float dot_t(const float* q, const T* k, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t c = 0; c < n; c += 16) {
    const __mmask16 m = lanes(n - c);
    acc = _mm512_fmadd_ps(load16(q + c, m), load16(k + c, m), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

template <typename T>
ALPACA_AVX512 void axpy_t(float a, const T* v, float* out, int64_t n) {
  const __m512 av = _mm512_set1_ps(a);
  for (int64_t c = 0; c < n; c += 16) {
    const __mmask16 m = lanes(n - c);
    _mm512_mask_storeu_ps(out + c, m, _mm512_fmadd_ps(av, load16(v + c, m), load16(out + c, m)));
  }
}
#else
template <typename T>
float dot_t(const float* q, const T* k, int64_t n) {
  float s = 0;
  for (int64_t c = 0; c < n; ++c) s += q[c] * static_cast<float>(k[c]);
  return s;
}
template <typename T>
void axpy_t(float a, const T* v, float* out, int64_t n) {
  for (int64_t c = 0; c < n; ++c) out[c] += a * static_cast<float>(v[c]);
}
#endif

// The mean is summed in double (ATen sums fp32 pairwise).
template <typename T>
void rms_norm_t(const T* x, const T* w, float eps, int64_t n, T* out) {
  double ss = 0;
  for (int64_t c = 0; c < n; ++c) {
    const float v = static_cast<float>(x[c]);
    ss += static_cast<double>(v) * v;
  }
  const float var = static_cast<float>(ss / static_cast<double>(n));
  const float r = 1.0F / std::sqrt(var + eps);
  for (int64_t c = 0; c < n; ++c) {
    const float y = round_to<T>(static_cast<float>(x[c]) * r);
    out[c] = static_cast<T>(static_cast<float>(w[c]) * y);
  }
}

template <typename T>
void rope_head_t(T* x, const T* cos, const T* sin, int64_t dh) {
  float tmp[kMaxHeadDim];
  const int64_t half = dh / 2;
  for (int64_t d = 0; d < dh; ++d) {
    const float rot = d < half ? -static_cast<float>(x[d + half]) : static_cast<float>(x[d - half]);
    const float a = round_to<T>(static_cast<float>(x[d]) * static_cast<float>(cos[d]));
    const float b = round_to<T>(rot * static_cast<float>(sin[d]));
    tmp[d] = a + b;
  }
  for (int64_t d = 0; d < dh; ++d) x[d] = static_cast<T>(tmp[d]);
}

template <typename T>
void attend_t(const T* q, const T* k, const T* v, int64_t keys, const bool* allow, int64_t self, int64_t dh,
              float scale, float* scores, T* out) {
  float qf[kMaxHeadDim], acc[kMaxHeadDim];
  for (int64_t c = 0; c < dh; ++c) qf[c] = static_cast<float>(q[c]);
  bool any = false;
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < keys; ++j) {
    if (allow != nullptr && !allow[j]) continue;
    any = true;
    scores[j] = dot_t(qf, k + j * dh, dh) * scale;
    mx = std::max(mx, scores[j]);
  }
  // A query with no key to attend to sees itself (make_cached_context's rule).
  if (!any) {
    scores[self] = dot_t(qf, k + self * dh, dh) * scale;
    mx = scores[self];
  }
  std::fill_n(acc, dh, 0.0F);
  float total = 0;
  for (int64_t j = 0; j < keys; ++j) {
    if (any ? (allow != nullptr && !allow[j]) : j != self) continue;
    const float e = std::exp(scores[j] - mx);
    total += e;
    axpy_t(e, v + j * dh, acc, dh);
  }
  for (int64_t c = 0; c < dh; ++c) out[c] = static_cast<T>(acc[c] / total);
}

}  // namespace

float dot(const float* q, const float* k, int64_t n) { return dot_t(q, k, n); }
float dot(const float* q, const BFloat16* k, int64_t n) { return dot_t(q, k, n); }
void axpy(float a, const float* v, float* out, int64_t n) { axpy_t(a, v, out, n); }
void axpy(float a, const BFloat16* v, float* out, int64_t n) { axpy_t(a, v, out, n); }
void rms_norm(const float* x, const float* w, float eps, int64_t n, float* out) { rms_norm_t(x, w, eps, n, out); }
void rms_norm(const BFloat16* x, const BFloat16* w, float eps, int64_t n, BFloat16* out) {
  rms_norm_t(x, w, eps, n, out);
}
void rope_head(float* x, const float* cos, const float* sin, int64_t dh) { rope_head_t(x, cos, sin, dh); }
void rope_head(BFloat16* x, const BFloat16* cos, const BFloat16* sin, int64_t dh) { rope_head_t(x, cos, sin, dh); }
void attend(const float* q, const float* k, const float* v, int64_t keys, const bool* allow, int64_t self, int64_t dh,
            float scale, float* scores, float* out) {
  attend_t(q, k, v, keys, allow, self, dh, scale, scores, out);
}
void attend(const BFloat16* q, const BFloat16* k, const BFloat16* v, int64_t keys, const bool* allow, int64_t self,
            int64_t dh, float scale, float* scores, BFloat16* out) {
  attend_t(q, k, v, keys, allow, self, dh, scale, scores, out);
}

}  // namespace alpaca::model::decode
