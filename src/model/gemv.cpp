// The decode step's products: y = x W^T for 1 to 8 rows of x (a generation step of that many
// sequences), which at these shapes is a stream of the weights (1-2 rows) or close to one (up to
// 8: ~2.2x the 1-row time for 8 rows). Each weight row is read once for all of x's rows; bf16 rows are dotted with VDPBF16PS (bf16 pairs multiplied, summed into fp32
// lanes) and rounded to bf16 once, the contract of a bf16 GEMM; fp32 rows with FMAs. The library
// kernels stream these shapes at about half the speed this machine can (oneDNN for bf16, MKL's
// generic sgemv for fp32 on this AMD CPU).
#include "cpu_kernels.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>  // defines: at::GradMode

#include <algorithm>
#include <vector>

#include "alpaca/model/matmul.h"
#include "alpaca/util/cpu_features.h"
#include "alpaca/util/error.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define ALPACA_HAVE_GEMV 1
#else
#define ALPACA_HAVE_GEMV 0  // other CPUs: have_* are false, the library kernels do the work
#endif

#if ALPACA_HAVE_GEMV && defined(__GNUC__) && !defined(__clang__)
// GCC 12 warns inside its own AVX-512 intrinsics (the _mm512_undefined_* they start from,
// GCC bug 105593); nothing of ours is uninitialised.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace alpaca::model {
namespace gemv {

#if ALPACA_HAVE_GEMV
namespace {

#define ALPACA_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define ALPACA_AVX512F __attribute__((target("avx512f")))

// The per-row-of-x loops are unrolled so each row's accumulators stay in registers (GCC keeps
// them in a stack array otherwise, a load and a store around every FMA: 3x slower at 8 rows).
#define ALPACA_UNROLL _Pragma("GCC unroll 8")

inline void store(float* p, float v) { *p = v; }
inline void store(c10::BFloat16* p, float v) { *p = c10::BFloat16(v); }

// Output rows [n0, n1) for M rows of x; one weight row at a time: the weights are then one
// sequential stream, which this CPU's prefetchers follow at ~1.5x the speed of several
// interleaved row streams (measured on the lm_head shape: 16 GB/s for one row at a time,
// 9-13 GB/s for 4 or 8 rows at a time).
template <int M, typename OutT>
ALPACA_AVX512_BF16 void bf16_block(const c10::BFloat16* x, int64_t ldx, const c10::BFloat16* w, int64_t k,
                                   int64_t n0, int64_t n1, OutT* y, int64_t ldy) {
  const int64_t full = k / 32 * 32;
  const __mmask32 tail = static_cast<__mmask32>((1ULL << (k - full)) - 1);
  for (int64_t j = n0; j < n1; ++j) {
    __m512 acc[M];
    ALPACA_UNROLL for (int i = 0; i < M; ++i) acc[i] = _mm512_setzero_ps();
    const c10::BFloat16* wr = w + j * k;
    for (int64_t c = 0; c < k; c += 32) {
      const __mmask32 mask = c < full ? static_cast<__mmask32>(~0U) : tail;
      const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(mask, wr + c);
      ALPACA_UNROLL for (int i = 0; i < M; ++i) {
        const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + i * ldx + c);
        acc[i] = _mm512_dpbf16_ps(acc[i], xv, wv);
      }
    }
    ALPACA_UNROLL for (int i = 0; i < M; ++i) store(y + i * ldy + j, _mm512_reduce_add_ps(acc[i]));
  }
}

// fp32: two accumulators per row of x (k = 576 is 36 vectors; one FMA chain would be
// latency-bound), reduced once per output.
template <int M>
ALPACA_AVX512F void f32_block(const float* x, int64_t ldx, const float* w, int64_t k, int64_t n0, int64_t n1,
                              float* y, int64_t ldy) {
  const int64_t full = k / 16 * 16;
  const __mmask16 tail = static_cast<__mmask16>((1U << (k - full)) - 1);
  for (int64_t j = n0; j < n1; ++j) {
    __m512 a0[M], a1[M];
    ALPACA_UNROLL for (int i = 0; i < M; ++i) a0[i] = a1[i] = _mm512_setzero_ps();
    const float* wr = w + j * k;
    int64_t c = 0;
    for (; c + 32 <= full; c += 32) {
      const __m512 w0 = _mm512_loadu_ps(wr + c), w1 = _mm512_loadu_ps(wr + c + 16);
      ALPACA_UNROLL for (int i = 0; i < M; ++i) {
        a0[i] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i * ldx + c), w0, a0[i]);
        a1[i] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i * ldx + c + 16), w1, a1[i]);
      }
    }
    for (; c < full; c += 16) {
      const __m512 w0 = _mm512_loadu_ps(wr + c);
      ALPACA_UNROLL for (int i = 0; i < M; ++i) a0[i] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i * ldx + c), w0, a0[i]);
    }
    if (tail != 0) {
      const __m512 w0 = _mm512_maskz_loadu_ps(tail, wr + c);
      ALPACA_UNROLL for (int i = 0; i < M; ++i) a1[i] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, x + i * ldx + c), w0, a1[i]);
    }
    ALPACA_UNROLL for (int i = 0; i < M; ++i) y[i * ldy + j] = _mm512_reduce_add_ps(_mm512_add_ps(a0[i], a1[i]));
  }
}

// m rows of x: block<1> .. block<8>.
#define ALPACA_GEMV_DISPATCH(block, m, ...)        \
  switch (m) {                                     \
    case 1: block<1>(__VA_ARGS__); break;          \
    case 2: block<2>(__VA_ARGS__); break;          \
    case 3: block<3>(__VA_ARGS__); break;          \
    case 4: block<4>(__VA_ARGS__); break;          \
    case 5: block<5>(__VA_ARGS__); break;          \
    case 6: block<6>(__VA_ARGS__); break;          \
    case 7: block<7>(__VA_ARGS__); break;          \
    default: block<8>(__VA_ARGS__); break;         \
  }

}  // namespace

bool have_avx512f() {
  static const bool has = cpu::has(cpu::Feature::kAvx512f);
  return has;
}

bool have_avx512_bf16() {
  // The kernels' VDPBF16PS needs AVX512-BF16 itself (AMX CPUs have it too).
  static const bool has = have_avx512f() && cpu::has(cpu::Feature::kAvx512bf16);
  return has;
}

void f32_rows(const float* x, int64_t ldx, int m, const float* w, int64_t k, int64_t n0, int64_t n1, float* y,
              int64_t ldy) {
  ALPACA_CHECK(m >= 1 && m <= kMaxRows && have_avx512f(), "gemv::f32_rows: " << m << " rows on this CPU");
  ALPACA_GEMV_DISPATCH(f32_block, m, x, ldx, w, k, n0, n1, y, ldy);
}

void bf16_rows(const c10::BFloat16* x, int64_t ldx, int m, const c10::BFloat16* w, int64_t k, int64_t n0, int64_t n1,
               float* y, int64_t ldy) {
  ALPACA_CHECK(m >= 1 && m <= kMaxRows && have_avx512_bf16(), "gemv::bf16_rows: " << m << " rows on this CPU");
  ALPACA_GEMV_DISPATCH(bf16_block, m, x, ldx, w, k, n0, n1, y, ldy);
}

void bf16_rows(const c10::BFloat16* x, int64_t ldx, int m, const c10::BFloat16* w, int64_t k, int64_t n0, int64_t n1,
               c10::BFloat16* y, int64_t ldy) {
  ALPACA_CHECK(m >= 1 && m <= kMaxRows && have_avx512_bf16(), "gemv::bf16_rows: " << m << " rows on this CPU");
  ALPACA_GEMV_DISPATCH(bf16_block, m, x, ldx, w, k, n0, n1, y, ldy);
}

#else
bool have_avx512f() { return false; }
bool have_avx512_bf16() { return false; }
void f32_rows(const float*, int64_t, int, const float*, int64_t, int64_t, int64_t, float*, int64_t) {
  ALPACA_FAIL("gemv::f32_rows needs x86-64 with AVX-512F");
}
void bf16_rows(const c10::BFloat16*, int64_t, int, const c10::BFloat16*, int64_t, int64_t, int64_t, float*, int64_t) {
  ALPACA_FAIL("gemv::bf16_rows needs x86-64 with AVX512-BF16");
}
void bf16_rows(const c10::BFloat16*, int64_t, int, const c10::BFloat16*, int64_t, int64_t, int64_t, c10::BFloat16*,
               int64_t) {
  ALPACA_FAIL("gemv::bf16_rows needs x86-64 with AVX512-BF16");
}
#endif

}  // namespace gemv

// model::linear takes the kernel up to two rows, where it is bandwidth-bound and ~1.6x oneDNN's.
// (Measured before the row loops were unrolled, from four rows on it was slower than oneDNN: 27 ms
// for 4 and 49 ms for 8 on the SmolLM2 step, against oneDNN's 37 and 43. Unrolled it is ~18 and
// ~31 ms; the fused decode step uses it up to 8 rows, model::linear still stops at 2.)
constexpr int64_t kLinearMaxRows = 2;
bool bf16_gemv_applies(const at::Tensor& x, const at::Tensor& weight) {
  if (!gemv::have_avx512_bf16()) return false;
  if (x.scalar_type() != at::kBFloat16 || weight.scalar_type() != at::kBFloat16) return false;
  if (!x.device().is_cpu() || !weight.device().is_cpu() || weight.dim() != 2 || x.dim() < 1) return false;
  if (x.size(-1) != weight.size(1) || x.numel() == 0 || x.numel() / x.size(-1) > kLinearMaxRows) return false;
  if (at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad())) return false;
  return cpu_bf16_gemm() == CpuBf16Gemm::kNative;
}

at::Tensor bf16_gemv(const at::Tensor& x, const at::Tensor& weight) {
  ALPACA_CHECK(bf16_gemv_applies(x, weight), "bf16_gemv: needs bf16 CPU operands x (..., " << weight.size(1)
                                                 << ") with at most " << kLinearMaxRows
                                                 << " rows, no autograd, and a CPU with AVX512-BF16");
  const int64_t k = weight.size(1), n = weight.size(0), m = x.numel() / k;
  const at::Tensor x2 = x.reshape({m, k}).contiguous();
  const at::Tensor w = weight.contiguous();
  std::vector<int64_t> out_sizes(x.sizes().begin(), x.sizes().end());
  out_sizes.back() = n;
  at::Tensor y = at::empty({m, n}, x.options());
  const auto* xp = x2.const_data_ptr<c10::BFloat16>();
  const auto* wp = w.const_data_ptr<c10::BFloat16>();
  auto* yp = y.mutable_data_ptr<c10::BFloat16>();
  // Split the weight rows across the intra-op threads (a few hundred kB each at least).
  const int64_t grain = std::max<int64_t>(64, (256 << 10) / (2 * k));
  at::parallel_for(0, n, grain,
                   [&](int64_t n0, int64_t n1) { gemv::bf16_rows(xp, k, static_cast<int>(m), wp, k, n0, n1, yp, n); });
  return y.view(out_sizes);
}

}  // namespace alpaca::model
