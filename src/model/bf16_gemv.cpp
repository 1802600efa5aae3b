// The bf16 decode-step product: y = x W^T for one or two rows of x (a generation step of one or
// two sequences) against a bf16 weight, on AVX512-BF16. Each weight row is read from memory once for all
// of x's rows and dotted with VDPBF16PS (bf16 pairs multiplied, summed into fp32 lanes), then
// rounded to bf16 once: the contract of a bf16 GEMM. At these shapes the product is a stream of
// the weights, and the library kernels stream them at about half the speed this machine can.
#include "alpaca/model/matmul.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>  // defines: at::GradMode
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <vector>

#include "alpaca/util/error.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define ALPACA_HAVE_BF16_GEMV 1
#else
#define ALPACA_HAVE_BF16_GEMV 0  // other CPUs: bf16_gemv_applies is false, oneDNN does the work
#endif

#if ALPACA_HAVE_BF16_GEMV && defined(__GNUC__) && !defined(__clang__)
// GCC 12 warns inside its own AVX-512 intrinsics (the _mm512_undefined_* they start from,
// GCC bug 105593); nothing of ours is uninitialised.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace alpaca::model {
namespace {
// Up to two rows of x the kernel is bandwidth-bound and ~1.6x oneDNN's; from four rows on, its
// per-output reductions make it slower than oneDNN (on the SmolLM2 step: 19 ms for 1 or 2 rows,
// 27 ms for 4, 49 ms for 8, against oneDNN's 29, 37, 41, 43 ms), so larger batches keep oneDNN.
constexpr int64_t kMaxRows = 2;
}  // namespace

#if ALPACA_HAVE_BF16_GEMV
namespace {

#define ALPACA_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

// Output rows [n0, n1) of y (m, n) = x (m, k) . w (n, k)^T; R weight rows per pass, M rows of x.
template <int M, int R>
ALPACA_AVX512_BF16 void gemv_block(const c10::BFloat16* x, int64_t ldx, const c10::BFloat16* w, int64_t k,
                                   int64_t n0, int64_t n1, c10::BFloat16* y, int64_t ldy) {
  const int64_t full = k / 32 * 32;
  const __mmask32 tail = static_cast<__mmask32>((1ULL << (k - full)) - 1);
  int64_t j = n0;
  for (; j + R <= n1; j += R) {
    __m512 acc[M][R];
    for (int i = 0; i < M; ++i)
      for (int r = 0; r < R; ++r) acc[i][r] = _mm512_setzero_ps();
    for (int64_t c = 0; c < k; c += 32) {
      const __mmask32 mask = c < full ? static_cast<__mmask32>(~0U) : tail;
      __m512bh wv[R];
      for (int r = 0; r < R; ++r) wv[r] = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + (j + r) * k + c);
      for (int i = 0; i < M; ++i) {
        const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + i * ldx + c);
        for (int r = 0; r < R; ++r) acc[i][r] = _mm512_dpbf16_ps(acc[i][r], xv, wv[r]);
      }
    }
    for (int i = 0; i < M; ++i)
      for (int r = 0; r < R; ++r) y[i * ldy + j + r] = c10::BFloat16(_mm512_reduce_add_ps(acc[i][r]));
  }
  if (j < n1) gemv_block<M, 1>(x, ldx, w, k, j, n1, y, ldy);
}

template <int M>
void gemv_rows(const c10::BFloat16* x, int64_t ldx, const c10::BFloat16* w, int64_t k, int64_t n0, int64_t n1,
               c10::BFloat16* y, int64_t ldy) {
  // One weight row at a time: the weights are then one sequential stream, which this CPU's
  // prefetchers follow at ~1.5x the speed of several interleaved row streams (measured on the
  // lm_head shape: 16 GB/s for one row at a time, 9-13 GB/s for 4 or 8 rows at a time).
  gemv_block<M, 1>(x, ldx, w, k, n0, n1, y, ldy);
}

using RowsFn = void (*)(const c10::BFloat16*, int64_t, const c10::BFloat16*, int64_t, int64_t, int64_t,
                        c10::BFloat16*, int64_t);
constexpr RowsFn kRowsFns[kMaxRows] = {gemv_rows<1>, gemv_rows<2>};

}  // namespace
#endif

bool bf16_gemv_applies(const at::Tensor& x, const at::Tensor& weight) {
  if (!ALPACA_HAVE_BF16_GEMV) return false;
  if (x.scalar_type() != at::kBFloat16 || weight.scalar_type() != at::kBFloat16) return false;
  if (!x.device().is_cpu() || !weight.device().is_cpu() || weight.dim() != 2 || x.dim() < 1) return false;
  if (x.size(-1) != weight.size(1) || x.numel() == 0 || x.numel() / x.size(-1) > kMaxRows) return false;
  if (at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad())) return false;
  return cpu_has_native_bf16() && cpu_bf16_gemm() == CpuBf16Gemm::kNative;
}

at::Tensor bf16_gemv(const at::Tensor& x, const at::Tensor& weight) {
  ALPACA_CHECK(bf16_gemv_applies(x, weight), "bf16_gemv: needs bf16 CPU operands x (..., " << weight.size(1)
                                                 << ") with at most " << kMaxRows
                                                 << " rows, no autograd, and a CPU with AVX512-BF16");
#if ALPACA_HAVE_BF16_GEMV
  const int64_t k = weight.size(1), n = weight.size(0), m = x.numel() / k;
  const at::Tensor x2 = x.reshape({m, k}).contiguous();
  const at::Tensor w = weight.contiguous();
  std::vector<int64_t> out_sizes(x.sizes().begin(), x.sizes().end());
  out_sizes.back() = n;
  at::Tensor y = at::empty({m, n}, x.options());
  const auto* xp = x2.const_data_ptr<c10::BFloat16>();
  const auto* wp = w.const_data_ptr<c10::BFloat16>();
  auto* yp = y.mutable_data_ptr<c10::BFloat16>();
  const RowsFn fn = kRowsFns[m - 1];
  // Split the weight rows across the intra-op threads (a few hundred kB each at least).
  const int64_t grain = std::max<int64_t>(64, (256 << 10) / (2 * k));
  at::parallel_for(0, n, grain, [&](int64_t n0, int64_t n1) { fn(xp, k, wp, k, n0, n1, yp, n); });
  return y.view(out_sizes);
#else
  return {};
#endif
}

}  // namespace alpaca::model
