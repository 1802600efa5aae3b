// The packed bf16 GEMM of the GEMM attention (see bf16_gemm.h).
#include "bf16_gemm.h"

#include <ATen/native/CPUBlas.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "alpaca/model/matmul.h"  // cpu_has_native_bf16
#include "alpaca/util/cpu_features.h"
#include "alpaca/util/error.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define ALPACA_GEMM_X86 1
#define ALPACA_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define ALPACA_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))
#else
#define ALPACA_GEMM_X86 0
#endif

namespace alpaca::model::bf16gemm {
namespace {

#if ALPACA_GEMM_X86
constexpr int kMr = 8;   // rows of C per micro-tile
constexpr int kNr = 32;  // columns of C per micro-tile (two 16-lane registers)

// C tile (mr x up to 32 columns, masks m0 / m1 for the two halves) (+)= A rows . B columns.
template <int kRows>
ALPACA_AVX512_BF16 void micro_tile(int64_t kp, const uint32_t* a, int64_t a_rs, int64_t a_ks, const uint32_t* b,
                                   int64_t ldb, float* c, int64_t ldc, bool add, __mmask16 m0, __mmask16 m1) {
  // Every loop over the rows unrolled, so that the accumulators live in registers (GCC keeps an array
  // indexed by a rolled loop on the stack: a load and a store around every multiply-add).
  __m512 acc[kRows][2];
#pragma GCC unroll 8
  for (int i = 0; i < kRows; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kp; ++p) {
    const __m512bh b0 = (__m512bh)_mm512_maskz_loadu_epi32(m0, b + p * ldb);
    const __m512bh b1 = (__m512bh)_mm512_maskz_loadu_epi32(m1, b + p * ldb + 16);
#pragma GCC unroll 8
    for (int i = 0; i < kRows; ++i) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[i * a_rs + p * a_ks]));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], av, b0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], av, b1);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < kRows; ++i) {
    float* ci = c + i * ldc;
    if (add) {
      acc[i][0] = _mm512_add_ps(acc[i][0], _mm512_maskz_loadu_ps(m0, ci));
      acc[i][1] = _mm512_add_ps(acc[i][1], _mm512_maskz_loadu_ps(m1, ci + 16));
    }
    _mm512_mask_storeu_ps(ci, m0, acc[i][0]);
    _mm512_mask_storeu_ps(ci + 16, m1, acc[i][1]);
  }
}

using TileFn = void (*)(int64_t, const uint32_t*, int64_t, int64_t, const uint32_t*, int64_t, float*, int64_t, bool,
                        __mmask16, __mmask16);
constexpr TileFn kTiles[kMr + 1] = {nullptr,        micro_tile<1>, micro_tile<2>, micro_tile<3>, micro_tile<4>,
                                    micro_tile<5>, micro_tile<6>, micro_tile<7>, micro_tile<8>};

ALPACA_AVX512 __mmask16 lanes(int64_t k) { return k >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << k) - 1); }

// The words [p0, p1) of row tile [i, i + rows) x column tile [j, ...) that the hint leaves (p1 <= p0:
// the tile's C is zero, or left as it is with add; nothing at all for a kCols tile: returns false).
bool tile_span(const Causal& h, int64_t i, int64_t rows, int64_t j, int64_t kp, int64_t& p0, int64_t& p1) {
  p0 = 0, p1 = kp;
  switch (h.kind) {
    case Causal::kCols: return j < h.diag + i + rows;
    case Causal::kDepthTo: p1 = std::min(kp, (h.diag + i + rows + 1) / 2); break;
    case Causal::kDepthFrom: p0 = std::clamp<int64_t>((i - h.diag) / 2, 0, kp); break;
    case Causal::kNone: break;
  }
  return true;
}

// Column tiles outside, row tiles inside: one B panel (kp x 32 words) stays in L1 across the rows.
void own_gemm(int64_t m, int64_t n, int64_t kp, const uint32_t* a, int64_t a_rs, int64_t a_ks, const Packed& b,
              float* c, int64_t ldc, bool add, const Causal& hint) {
  static_assert(kNr == kPanel, "one micro-tile's columns are one B panel");
  for (int64_t j = 0; j < n; j += kNr) {
    const int64_t w = std::min<int64_t>(kNr, n - j);
    const __mmask16 m0 = lanes(w), m1 = lanes(std::max<int64_t>(0, w - 16));
    const uint32_t* bj = b.b + j / kPanel * b.panel;
    for (int64_t i = 0; i < m; i += kMr) {
      const int64_t r = std::min<int64_t>(kMr, m - i);
      int64_t p0, p1;
      if (!tile_span(hint, i, r, j, kp, p0, p1)) continue;
      kTiles[r](std::max<int64_t>(0, p1 - p0), a + i * a_rs + p0 * a_ks, a_rs, a_ks, bj + p0 * b.ldb, b.ldb,
                c + i * ldc + j, ldc, add, m0, m1);
    }
  }
}

// dst[p * cols + j] = (r0[j], r1[j]): 32 columns a step, the bf16 pairs interleaved in registers.
ALPACA_AVX512_BF16 void pack_rows_avx512(const uint16_t* r0, const uint16_t* r1, int64_t cols, uint32_t* dst) {
  int64_t j = 0;
  for (; j + 32 <= cols; j += 32) {
    const __m512i x = _mm512_loadu_si512(r0 + j), y = _mm512_loadu_si512(r1 + j);
    // unpack works within 128-bit lanes: lo holds columns 0-3, 8-11, 16-19, 24-27; hi the others.
    const __m512i lo = _mm512_unpacklo_epi16(x, y), hi = _mm512_unpackhi_epi16(x, y);
    const __m512i first = _mm512_permutex2var_epi64(lo, _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), hi);
    const __m512i second = _mm512_permutex2var_epi64(lo, _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15), hi);
    _mm512_storeu_si512(dst + j, first);
    _mm512_storeu_si512(dst + j + 16, second);
  }
  for (; j < cols; ++j) dst[j] = static_cast<uint32_t>(r0[j]) | static_cast<uint32_t>(r1[j]) << 16;
}

// r[i] (16 words of row i) becomes column i: r[j][i] = the old r[i][j]. (GCC 12's unpack intrinsics
// pass an `undefined` vector, `__m512i __Y = __Y`, that -Wmaybe-uninitialized flags once inlined.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
ALPACA_AVX512 inline void transpose16(__m512i r[16]) {
  __m512i t[16], u[16];
#pragma GCC unroll 8
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 16; i += 4) {
    u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
#pragma GCC unroll 8
  for (int i = 0; i < 16; i += 8)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      t[i + j] = _mm512_shuffle_i32x4(u[i + j], u[i + j + 4], 0x88);
      t[i + j + 4] = _mm512_shuffle_i32x4(u[i + j], u[i + j + 4], 0xdd);
    }
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0xdd);
  }
}

// pack_cols in 16 x 16 word blocks: 16 rows loaded, transposed in registers, stored as 16 panel rows
// (a scalar store a word into rows 128 bytes apart measured ~8 cycles a word here).
ALPACA_AVX512_BF16 void pack_cols_avx512(const uint16_t* src, int64_t ld, int64_t rows, int64_t kp, uint32_t* dst) {
  const int64_t panel = kPanel * kp, n = (rows + kPanel - 1) / kPanel * kPanel;
  for (int64_t i0 = 0; i0 < n; i0 += 16) {
    uint32_t* d = dst + i0 / kPanel * panel + i0 % kPanel;
    for (int64_t p0 = 0; p0 < kp; p0 += 16) {
      const __mmask16 mk = lanes(kp - p0);
      __m512i r[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i)
        r[i] = i0 + i < rows ? _mm512_maskz_loadu_epi32(mk, src + (i0 + i) * ld + 2 * p0) : _mm512_setzero_si512();
      transpose16(r);
#pragma GCC unroll 16
      for (int p = 0; p < 16; ++p)
        if (p0 + p < kp) _mm512_storeu_si512(d + (p0 + p) * kPanel, r[p]);
    }
  }
}

// dst[j * ldd + i] = src[i * lds + j] for i < rows, j < cols: words in 16 x 16 blocks transposed in
// registers (the onednn backend's row-major copy of a transposed A; AVX-512 CPUs only, as it is).
ALPACA_AVX512 void transpose_words_avx512(const uint32_t* src, int64_t lds, int64_t rows, int64_t cols, uint32_t* dst,
                                          int64_t ldd) {
  for (int64_t i0 = 0; i0 < rows; i0 += 16) {
    const __mmask16 mi = lanes(rows - i0);
    for (int64_t j0 = 0; j0 < cols; j0 += 16) {
      const __mmask16 mj = lanes(cols - j0);
      __m512i r[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i)
        r[i] = i0 + i < rows ? _mm512_maskz_loadu_epi32(mj, src + (i0 + i) * lds + j0) : _mm512_setzero_si512();
      transpose16(r);
#pragma GCC unroll 16
      for (int j = 0; j < 16; ++j)
        if (j0 + j < cols) _mm512_mask_storeu_epi32(dst + (j0 + j) * ldd + i0, mi, r[j]);
    }
  }
}
#pragma GCC diagnostic pop
#endif

// A as row-major bf16 for ATen's GEMMs, with its row stride in bf16 (lda): a row-major A's words as
// they are (lda = 2 a_rs), another (a transposed A from pack_rows: a_rs = 1) copied into `rows`, m x kp
// words, in 16 x 16 AVX-512 register transposes where `avx512` allows (onednn: AVX-512 CPUs only).
const at::BFloat16* a_rows(int64_t m, int64_t kp, const uint32_t* a, int64_t a_rs, int64_t a_ks, bool avx512,
                           std::vector<uint32_t>& rows, int64_t& lda) {
  if (a_ks == 1) {
    lda = 2 * a_rs;
    return reinterpret_cast<const at::BFloat16*>(a);
  }
  rows.resize(m * kp);
#if ALPACA_GEMM_X86
  if (avx512 && a_rs == 1) {
    transpose_words_avx512(a, a_ks, kp, m, rows.data(), kp);
  } else
#endif
  {
    for (int64_t p = 0; p < kp; ++p)
      for (int64_t i = 0; i < m; ++i) rows[i * kp + p] = a[i * a_rs + p * a_ks];
  }
  lda = 2 * kp;
  return reinterpret_cast<const at::BFloat16*>(rows.data());
}

// Elsewhere: unpack to row-major bf16 and take ATen's cpublas GEMM (bf16 x bf16 -> fp32).
void fallback_gemm(int64_t m, int64_t n, int64_t kp, const uint32_t* a, int64_t a_rs, int64_t a_ks, const Packed& b,
                   float* c, int64_t ldc, bool add) {
  thread_local std::vector<uint32_t> ab, bb;
  int64_t lda = 0;
  const at::BFloat16* ar = a_rows(m, kp, a, a_rs, a_ks, /*avx512=*/false, ab, lda);
  bb.resize(kp * n);  // 2 kp x n bf16
  auto* bh = reinterpret_cast<uint16_t*>(bb.data());                          // (2 kp) x n bf16
  for (int64_t p = 0; p < kp; ++p)
    for (int64_t j = 0; j < n; ++j) {
      const uint32_t v = b.b[j / kPanel * b.panel + p * b.ldb + j % kPanel];
      bh[(2 * p) * n + j] = static_cast<uint16_t>(v & 0xFFFFu);
      bh[(2 * p + 1) * n + j] = static_cast<uint16_t>(v >> 16);
    }
  at::native::cpublas::brgemm(m, n, 2 * kp, lda, n, ldc, add, ar, reinterpret_cast<const at::BFloat16*>(bh), c,
                              /*is_vnni=*/false);
}

// oneDNN's brgemm ukernel (ATen's cpublas::brgemm with is_vnni): its bf16 B operand is the VNNI layout,
// (K / 2) x ldb pairs, which is what our words are: a row-major B (rows_of) is one call with ldb its row
// length, a panelled one (panels_of) a call per 32-column panel with ldb 32. A is row-major bf16
// (a_rows: a transposed one is copied, m x kp words, small beside the m x n x kp multiply-adds). The
// kernels are JIT-compiled per shape and cached per thread by ATen; on AMX CPUs they run on the tiles.
void onednn_gemm(int64_t m, int64_t n, int64_t kp, const uint32_t* a, int64_t a_rs, int64_t a_ks, const Packed& b,
                 float* c, int64_t ldc, bool add, const Causal& hint) {
  thread_local std::vector<uint32_t> rows;
  int64_t lda = 0;
  const at::BFloat16* ab = a_rows(m, kp, a, a_rs, a_ks, /*avx512=*/true, rows, lda);
  const auto* bb = reinterpret_cast<const at::BFloat16*>(b.b);
  if (b.panel == kPanel) {  // rows_of: B(p, j) = b[p * ldb + j]
    at::native::cpublas::brgemm(m, n, 2 * kp, lda, b.ldb, ldc, add, ab, bb, c, /*is_vnni=*/true);
    return;
  }
  // A kCols hint leaves out, per panel, the rows that need none of its columns (i < j - diag).
  for (int64_t j = 0; j < n; j += kPanel) {
    const int64_t i0 = hint.kind == Causal::kCols ? std::max<int64_t>(0, j - hint.diag) : 0;
    if (i0 >= m) break;
    at::native::cpublas::brgemm(m - i0, std::min<int64_t>(kPanel, n - j), 2 * kp, lda, kPanel, ldc, add,
                                ab + i0 * lda, bb + 2 * (j / kPanel) * b.panel, c + i0 * ldc + j, /*is_vnni=*/true);
  }
}

// Whether ATen's oneDNN ukernel takes bf16 VNNI operands here (oneDNN built in, an AVX-512 or AMX CPU,
// mkldnn not turned off): asked once with a 1 x 1 product; ATen refuses (throws) where it does not.
// Not under an ALPACA_CPU_ISA cap below AVX-512 (util/cpu_features.h: as on an AVX2-only CPU).
bool onednn_runs() {
  static const bool runs = [] {
#if ALPACA_GEMM_X86
    if (!cpu::has(cpu::Feature::kAvx512f) || !cpu::has(cpu::Feature::kAvx512bw)) return false;
#else
    return false;
#endif
    const uint32_t one = 0x3F80u;  // bf16 1.0 with a zero partner
    float c = 0.0f;
    try {
      at::native::cpublas::brgemm(1, 1, 2, 2, 1, 1, false, reinterpret_cast<const at::BFloat16*>(&one),
                                  reinterpret_cast<const at::BFloat16*>(&one), &c, /*is_vnni=*/true);
      at::native::cpublas::brgemm_release(true);
    } catch (const std::exception&) {
      return false;
    }
    return c == 1.0f;
  }();
  return runs;
}

bool cpu_has_avx512_bf16() {
#if ALPACA_GEMM_X86
  return cpu::has(cpu::Feature::kAvx512bf16);
#else
  return false;
#endif
}

// The packs' AVX-512 loops run with the fast backends on a CPU with AVX512-BF16 (their target); with
// cpublas (AVX2-only CPUs, and the tests' check of the loops) the plain loops.
bool avx512_packs() { return backend() != Backend::kCpublas && cpu_has_avx512_bf16(); }

Backend default_backend() {
#if ALPACA_GEMM_X86
  if (cpu_has_avx512_bf16() && !cpu::has(cpu::Feature::kAmxBf16)) return Backend::kOwn;
  if (cpu::has(cpu::Feature::kAmxBf16) && onednn_runs()) return Backend::kOnednn;
#endif
  return Backend::kCpublas;
}

// ALPACA_BF16_GEMM=own|onednn|cpublas picks another on any CPU that runs it (for measurements).
Backend detect_backend() {
  const char* env = std::getenv("ALPACA_BF16_GEMM");
  if (env == nullptr || *env == '\0' || std::strcmp(env, "auto") == 0) return default_backend();
  const std::optional<Backend> b = backend_named(env);
  ALPACA_CHECK(b, "ALPACA_BF16_GEMM=" << env << " is not understood; use auto (the default), own, onednn or cpublas");
  ALPACA_CHECK(runs(*b), "ALPACA_BF16_GEMM=" << env << ": this CPU cannot run it; use auto (the default) or cpublas");
  return *b;
}

std::atomic<Backend>& backend_slot() {
  static std::atomic<Backend> slot{detect_backend()};
  return slot;
}

}  // namespace

const char* name(Backend b) {
  switch (b) {
    case Backend::kOwn: return "own";
    case Backend::kOnednn: return "onednn";
    case Backend::kCpublas: return "cpublas";
  }
  return "?";
}

std::optional<Backend> backend_named(const std::string& s) {
  for (Backend b : {Backend::kOwn, Backend::kOnednn, Backend::kCpublas})
    if (s == name(b)) return b;
  return std::nullopt;
}

bool runs(Backend b) {
  switch (b) {
    case Backend::kOwn: return cpu_has_avx512_bf16();
    case Backend::kOnednn: return onednn_runs();
    case Backend::kCpublas: return true;
  }
  return false;
}

Backend backend() { return backend_slot().load(std::memory_order_relaxed); }

void set_backend(Backend b) {
  ALPACA_CHECK(runs(b), "bf16gemm::set_backend: this CPU cannot run the " << name(b) << " product");
  backend_slot().store(b, std::memory_order_relaxed);
}

bool fast() {
  const Backend b = backend();
  return b == Backend::kOwn || (b == Backend::kOnednn && cpu_has_native_bf16());
}

void release() {
  if (backend() == Backend::kOnednn) at::native::cpublas::brgemm_release(true);
}

void gemm(int64_t m, int64_t n, int64_t kp, const uint32_t* a, int64_t a_rs, int64_t a_ks, const Packed& b, float* c,
          int64_t ldc, bool add, Causal hint) {
  if (m <= 0 || n <= 0) return;
  if (kp <= 0) {
    for (int64_t i = 0; i < m && !add; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
    return;
  }
  switch (backend()) {
    case Backend::kOwn:
#if ALPACA_GEMM_X86
      return own_gemm(m, n, kp, a, a_rs, a_ks, b, c, ldc, add, hint);
#else
      [[fallthrough]];
#endif
    case Backend::kCpublas: return fallback_gemm(m, n, kp, a, a_rs, a_ks, b, c, ldc, add);
    case Backend::kOnednn: return onednn_gemm(m, n, kp, a, a_rs, a_ks, b, c, ldc, add, hint);
  }
}

void pack_rows(const uint16_t* src, int64_t ld, int64_t rows, int64_t cols, uint32_t* dst) {
  [[maybe_unused]] const bool own = avx512_packs();
  for (int64_t p = 0; p < rows / 2; ++p) {
    const uint16_t *r0 = src + 2 * p * ld, *r1 = r0 + ld;
    uint32_t* d = dst + p * cols;
#if ALPACA_GEMM_X86
    if (own) {
      pack_rows_avx512(r0, r1, cols, d);
      continue;
    }
#endif
    for (int64_t j = 0; j < cols; ++j) d[j] = static_cast<uint32_t>(r0[j]) | static_cast<uint32_t>(r1[j]) << 16;
  }
  if (rows % 2 != 0) {  // the last row with a zero partner
    const uint16_t* r0 = src + (rows - 1) * ld;
    for (int64_t j = 0; j < cols; ++j) dst[rows / 2 * cols + j] = r0[j];
  }
}

void pack_cols(const uint16_t* src, int64_t ld, int64_t rows, int64_t cols, uint32_t* dst) {
  const int64_t kp = cols / 2, panel = kPanel * kp;
#if ALPACA_GEMM_X86
  if (avx512_packs()) return pack_cols_avx512(src, ld, rows, kp, dst);
#endif
  for (int64_t i = 0; i < rows; ++i) {
    uint32_t* d = dst + i / kPanel * panel + i % kPanel;  // column i: its words kPanel apart
    const uint16_t* s = src + i * ld;
    for (int64_t p = 0; p < kp; ++p) {
      uint32_t w;
      std::memcpy(&w, s + 2 * p, 4);
      d[p * kPanel] = w;
    }
  }
  for (int64_t i = rows; i % kPanel != 0; ++i)
    for (int64_t p = 0; p < kp; ++p) dst[i / kPanel * panel + p * kPanel + i % kPanel] = 0;
}

}  // namespace alpaca::model::bf16gemm
