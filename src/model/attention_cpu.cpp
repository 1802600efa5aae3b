// Causal bf16 attention through GEMMs for CPU training (alpaca/model/fused_ops.h, issue 32).
//
// ATen's flash-attention CPU kernel ran at ~29 GFLOP/s on the small model's shapes (docs/profile_bf16.md):
// a quarter of a bf16 step. Here each (batch, KV head) is one task: K and V packed once, then
// for each query head of its group and each block of kAttnBlock query rows [i0, i0 + rows), the
// keys 0 .. i0 + rows - 1 only (no key block above the diagonal):
//   forward   S = Q_blk K^T (fp32), E = exp(S * scale - rowmax) masked (rounded to bf16 for the
//             next GEMM), O_blk = (E V) / rowsum(E), lse = the rows' logsumexp;
//   backward  S and P again from Q, K and lse, dP = dO_blk V^T, dS = P * (dP - rowsum(dO * O)) * scale,
//             dQ_blk = dS K, dV += P^T dO_blk, dK += dS^T Q_blk (fp32 accumulators per KV head,
//             so the heads of a GQA group and all query blocks sum before one rounding).
// Nothing T x T is kept between forward and backward, and no ATen op runs per block: the products
// are bf16_gemm.h's on packed operands (K, V packed once per task; the forward's P is already the
// A operand of P V, and the backward's softmax writes P and dS directly as the row-pair words that
// dV and dK take; of a block only its Q and dO rows are packed), our AVX512-BF16 kernel where the
// CPU has it without AMX (with causal hints that skip the tiles above the diagonal), oneDNN's brgemm
// ukernel on AMX CPUs (the tiles; our words are its VNNI layout), else ATen's cpublas bf16 -> fp32
// GEMM (bf16_gemm.h). The softmax rows are our loops,
// compiled per instruction set like fused_ops.cpp's, in chunks of 32 keys over rows padded to whole
// chunks.
// fp32 training takes the same blocks (causal_attention_fp32): one task per (batch, query head)
// forward, per (batch, KV head) backward, the products through LibTorch's BLAS sgemm on the tensors
// as they are (no packing), P and dS in fp32. ATen's fp32 flash kernel took 1.40 s of a 15.5 s
// small-model step here; this 0.77 s (docs/profile_bf16.md).
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "alpaca/model/fused_ops.h"
#include "alpaca/util/error.h"
#include "alpaca/util/trace.h"
#include "bf16_gemm.h"
#include "blas.h"
#include "fused_math.h"

namespace alpaca::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;
using namespace fused;  // u16, In, Out, Acc, f32, bf16, exp_f, kLanes (fused_math.h)
using Mask = const uint8_t* __restrict;
constexpr float kInf = std::numeric_limits<float>::infinity();

// The softmax rows run in chunks of kChunk keys with no scalar remainder: a block's rows are padded to
// a multiple (Block::n; the padding keys are zero keys, their scores 0), the keys past a row's limit
// selected away in its last chunk. (With a remainder loop, up to 31 keys a row ran scalar: about a
// third of the softmax's time at T 512.) 32, so that the 16-bit stores fill a 64-byte vector (GCC
// does not vectorise a 16-iteration loop that mixes them with fp32 at all).
constexpr int kChunk = 32;
static_assert(kChunk == bf16gemm::kPanel, "a padded score row ends where K's zero-filled panels end");
int64_t round_chunk(int64_t x) { return (x + kChunk - 1) / kChunk * kChunk; }
// Keys of a chunk at j that a row seeing the keys below lim may count: lanes l < chunk_keys(j, lim).
ALPACA_INLINE int chunk_keys(int64_t j, int64_t lim) {
  return static_cast<int>(std::clamp<int64_t>(lim - j, 0, kChunk));
}

// kN partial maxima / sums folded in halves (lane l with l + w): a sequential fold was a dependent
// chain of 32 scalar operations a row (a fifth of the forward softmax's time).
template <int kN>
ALPACA_INLINE float fold_max(float* acc) {
#pragma GCC unroll 8
  for (int w = kN / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] = acc[l] > acc[l + w] ? acc[l] : acc[l + w];
  return acc[0];
}
template <int kN>
ALPACA_INLINE float fold_sum(float* acc) {
#pragma GCC unroll 8
  for (int w = kN / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

// rowsum(dO * O) of one row: kChunk partial sums (and the remainder into lane 0), folded. (Not
// fused_math.h's dot_lanes: its 16 lanes of 16-bit loads do not vectorise in 64-byte registers, and
// its sequential fold is a 16-long chain, for 64 products a row.)
ALPACA_INLINE float row_dot(const u16* __restrict a, const u16* __restrict b, int64_t n) {
  float acc[kChunk] = {};
  int64_t i = 0;
  for (; i + kChunk <= n; i += kChunk)
    for (int l = 0; l < kChunk; ++l) acc[l] += f32(a[i + l]) * f32(b[i + l]);
  for (; i < n; ++i) acc[0] += f32(a[i]) * f32(b[i]);
  return fold_sum<kChunk>(acc);
}

// dst (rows x cols, row stride ldd) = bf16(src), src (rows x cols) fp32 with row stride lds; with
// row_scale, bf16(src * row_scale[r]).
ALPACA_INLINE void store_rows_impl(const float* __restrict src, int64_t lds, int64_t rows, int64_t cols, Out dst,
                                   int64_t ldd, const float* row_scale) {
  for (int64_t r = 0; r < rows; ++r) {
    const float f = row_scale != nullptr ? row_scale[r] : 1.0f;
    for (int64_t c = 0; c < cols; ++c) dst[r * ldd + c] = bf16(src[r * lds + c] * f);
  }
}

// The maximum of s[j] * scale over the keys j < lim the mask allows (-inf if none).
template <bool kMasked>
ALPACA_INLINE float scaled_max(const float* __restrict s, int64_t lim, Mask m, float scale) {
  float acc[kChunk];
  for (int l = 0; l < kChunk; ++l) acc[l] = -kInf;
  for (int64_t j = 0; j < lim; j += kChunk) {
    const int keys = chunk_keys(j, lim);
    for (int l = 0; l < kChunk; ++l) {
      bool ok = l < keys;
      if constexpr (kMasked) ok = ok & (m[j + l] != 0);
      const float v = ok ? s[j + l] * scale : -kInf;
      acc[l] = acc[l] > v ? acc[l] : v;
    }
  }
  return fold_max<kChunk>(acc);
}

// e = exp(s[j] * scale - mx), 0 for keys not counted, for j < round_chunk(lim): p[j] = bf16(e);
// returns the sum of the e (fp32, kChunk partial sums folded: the same order in every variant).
// P's element: bf16 (the bf16 route, rounded) or fp32 (the fp32 route, as computed).
template <typename PT>
ALPACA_INLINE PT p_value(float e) {
  if constexpr (std::is_same_v<PT, float>) {
    return e;
  } else {
    return bf16(e);
  }
}

template <bool kMasked, typename PT>
ALPACA_INLINE float exp_round_sum(const float* __restrict s, int64_t lim, Mask m, float scale, float mx,
                                  PT* __restrict p) {
  float acc[kChunk] = {};
  for (int64_t j = 0; j < lim; j += kChunk) {
    const int keys = chunk_keys(j, lim);
    for (int l = 0; l < kChunk; ++l) {
      bool ok = l < keys;
      if constexpr (kMasked) ok = ok & (m[j + l] != 0);
      const float e = ok ? exp_f(s[j + l] * scale - mx) : 0.0f;
      p[j + l] = p_value<PT>(e);
      acc[l] += e;
    }
  }
  return fold_sum<kChunk>(acc);
}

// Forward softmax of `rows` score rows (s: rows x n fp32, the raw q . k; n a multiple of kChunk) of
// queries i0 .. i0 + rows - 1: query i sees keys j <= i that the mask rows (stride n, or none) allow.
// Two passes over a row: its maximum, then p (rows x n bf16) = exp(s * scale - max) rounded to bf16,
// not yet divided by the row's sum (0 beyond the allowed keys): O = (P V) * inv, inv[r] = 1 / sum,
// so the division is one multiply per output, not per key. lse[r] = the row's logsumexp of s * scale
// (+inf for a row with no allowed key, whose p is all 0 and inv 0).
template <bool kMasked, typename PT>
ALPACA_INLINE void softmax_row(const float* s, int64_t lim, int64_t n, Mask m, float scale, PT* __restrict p,
                               float& lse, float& inv) {
  const float mx = scaled_max<kMasked>(s, lim, m, scale);
  int64_t j = 0;
  if (mx == -kInf) {
    lse = kInf, inv = 0.0f;
  } else {
    const float sum = exp_round_sum<kMasked, PT>(s, lim, m, scale, mx, p);
    lse = mx + std::log(sum), inv = 1.0f / sum, j = round_chunk(lim);
  }
  for (; j < n; ++j) p[j] = 0;
}

template <typename PT>
ALPACA_INLINE void softmax_rows_impl(const float* s, int64_t rows, int64_t n, int64_t i0, Mask mask, float scale,
                                     PT* p, float* lse, float* inv) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t lim = std::min(i0 + r + 1, n);
    if (mask != nullptr) {
      softmax_row<true, PT>(s + r * n, lim, n, mask + r * n, scale, p + r * n, lse[r], inv[r]);
    } else {
      softmax_row<false, PT>(s + r * n, lim, n, nullptr, scale, p + r * n, lse[r], inv[r]);
    }
  }
}

using W = uint32_t;  // two bf16 along the reduction dimension (bf16_gemm.h)
using bf16gemm::Causal;

// One score row of the backward: s and dp (fp32), its keys below lim seen (if the mask allows),
// its logsumexp and rowsum(dO O).
struct GradRow {
  const float *s, *dp;
  int64_t lim;
  const uint8_t* m;
  float lse, d;
};

// Backward of rows r0, r1 (a pair; an absent r1 is r0 with lim 0): p = exp(s * scale - lse) (the
// forward's probabilities, recomputed), ds = p * (dp - d) * scale, both rounded to bf16, 0 where
// the forward's p was 0. Written where the products take them, with no packing pass: p and ds as
// the pairs (row r0's value in the low half) that dV += P^T dO and dK += dS^T Q read as A (pr, dsr),
// and ds row by row for dQ = dS K.
template <bool kMasked>
ALPACA_INLINE void softmax_grad_pair(const GradRow& r0, const GradRow& r1, int64_t n, float scale, W* __restrict pr,
                                     W* __restrict dsr, Out ds0, Out ds1) {
  const float *__restrict s0 = r0.s, *__restrict s1 = r1.s, *__restrict dp0 = r0.dp, *__restrict dp1 = r1.dp;
  Mask m0 = r0.m;
  Mask m1 = r1.m;
  const int64_t lim = std::max(r0.lim, r1.lim);
  for (int64_t j = 0; j < lim; j += kChunk) {
    const int keys0 = chunk_keys(j, r0.lim), keys1 = chunk_keys(j, r1.lim);
    for (int l = 0; l < kChunk; ++l) {
      const int64_t c = j + l;
      bool k0 = l < keys0, k1 = l < keys1;
      if constexpr (kMasked) k0 = k0 & (m0[c] != 0), k1 = k1 & (m1[c] != 0);
      const float e0 = k0 ? exp_f(s0[c] * scale - r0.lse) : 0.0f, e1 = k1 ? exp_f(s1[c] * scale - r1.lse) : 0.0f;
      const u16 g0 = k0 ? bf16(e0 * (dp0[c] - r0.d) * scale) : 0, g1 = k1 ? bf16(e1 * (dp1[c] - r1.d) * scale) : 0;
      pr[c] = static_cast<W>(bf16(e0)) | static_cast<W>(bf16(e1)) << 16;
      dsr[c] = static_cast<W>(g0) | static_cast<W>(g1) << 16;
      ds0[c] = g0;
      ds1[c] = g1;
    }
  }
  for (int64_t j = round_chunk(lim); j < n; ++j) pr[j] = dsr[j] = 0, ds0[j] = ds1[j] = 0;
}

// Rows 0 .. rows - 1 (n keys, a multiple of kChunk; queries from i0; mask rows of stride n or none):
// pr, dsr (ceil(rows / 2) x n words), ds (rows x n bf16; with odd rows, row `rows` is scratch).
ALPACA_INLINE void softmax_grad_rows_impl(const float* s, const float* dp, int64_t rows, int64_t n, int64_t i0,
                                          Mask mask, float scale, const float* lse, const float* d, W* pr, W* dsr,
                                          u16* ds) {
  const auto row = [&](int64_t r) {
    return GradRow{s + r * n, dp + r * n, lse[r] == kInf ? 0 : std::min(i0 + r + 1, n),
                   mask != nullptr ? mask + r * n : nullptr, lse[r], d[r]};
  };
  for (int64_t r = 0; r < rows; r += 2) {
    const GradRow r0 = row(r);
    const GradRow r1 = r + 1 < rows ? row(r + 1) : GradRow{r0.s, r0.dp, 0, r0.m, r0.lse, r0.d};
    W *p = pr + r / 2 * n, *g = dsr + r / 2 * n;
    if (mask != nullptr) {
      softmax_grad_pair<true>(r0, r1, n, scale, p, g, ds + r * n, ds + (r + 1) * n);
    } else {
      softmax_grad_pair<false>(r0, r1, n, scale, p, g, ds + r * n, ds + (r + 1) * n);
    }
  }
}

// The fp32 route's backward of one score row, in place: s becomes p = exp(s * scale - lse) (the
// forward's probabilities, recomputed) and dp becomes ds = p * (dp - d) * scale, both 0 for keys not
// seen and for columns lim .. n - 1 (whose s and dp were never computed: selected, not multiplied).
template <bool kMasked>
ALPACA_INLINE void softmax_grad_row_f32(float* __restrict s, float* __restrict dp, int64_t lim, int64_t n, Mask m,
                                        float scale, float lse, float d) {
  int64_t j = 0;
  if (lse != kInf) {
    for (; j < lim; j += kChunk) {
      const int keys = chunk_keys(j, lim);
      for (int l = 0; l < kChunk; ++l) {
        bool ok = l < keys;
        if constexpr (kMasked) ok = ok & (m[j + l] != 0);
        const float p = exp_f(s[j + l] * scale - lse);
        const float g = p * (dp[j + l] - d) * scale;
        s[j + l] = ok ? p : 0.0f;
        dp[j + l] = ok ? g : 0.0f;
      }
    }
  }
  for (; j < n; ++j) s[j] = 0.0f, dp[j] = 0.0f;
}

ALPACA_INLINE void softmax_grad_rows_f32_impl(float* s, float* dp, int64_t rows, int64_t n, int64_t i0, Mask mask,
                                              float scale, const float* lse, const float* d) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t lim = std::min(i0 + r + 1, n);
    if (mask != nullptr) {
      softmax_grad_row_f32<true>(s + r * n, dp + r * n, lim, n, mask + r * n, scale, lse[r], d[r]);
    } else {
      softmax_grad_row_f32<false>(s + r * n, dp + r * n, lim, n, nullptr, scale, lse[r], d[r]);
    }
  }
}

// rowsum(dO * O) of one fp32 row: kChunk partial sums (the remainder into lane 0), folded.
ALPACA_INLINE float row_dot_f32(const float* __restrict a, const float* __restrict b, int64_t n) {
  float acc[kChunk] = {};
  int64_t j = 0;
  for (; j + kChunk <= n; j += kChunk)
    for (int l = 0; l < kChunk; ++l) acc[l] += a[j + l] * b[j + l];
  for (; j < n; ++j) acc[0] += a[j] * b[j];
  return fold_sum<kChunk>(acc);
}

struct AttnKernels {
  void (*softmax_rows)(const float*, int64_t, int64_t, int64_t, const uint8_t*, float, u16*, float*, float*);
  void (*softmax_rows_f32)(const float*, int64_t, int64_t, int64_t, const uint8_t*, float, float*, float*, float*);
  void (*softmax_grad_rows_f32)(float*, float*, int64_t, int64_t, int64_t, const uint8_t*, float, const float*,
                                const float*);
  float (*dot_f32)(const float*, const float*, int64_t);
  void (*softmax_grad_rows)(const float*, const float*, int64_t, int64_t, int64_t, const uint8_t*, float, const float*,
                            const float*, W*, W*, u16*);
  float (*dot)(const u16*, const u16*, int64_t);
  void (*store_rows)(const float*, int64_t, int64_t, int64_t, u16*, int64_t, const float*);
};

#define ALPACA_ATTN_KERNELS(NS, ATTR)                                                                                 \
  namespace NS {                                                                                                      \
  ATTR void softmax_rows(const float* s, int64_t rows, int64_t n, int64_t i0, const uint8_t* m, float scale, u16* p,  \
                         float* lse, float* inv) {                                                                    \
    softmax_rows_impl<u16>(s, rows, n, i0, m, scale, p, lse, inv);                                                   \
  }                                                                                                                   \
  ATTR void softmax_rows_f32(const float* s, int64_t rows, int64_t n, int64_t i0, const uint8_t* m, float scale,      \
                             float* p, float* lse, float* inv) {                                                      \
    softmax_rows_impl<float>(s, rows, n, i0, m, scale, p, lse, inv);                                                 \
  }                                                                                                                   \
  ATTR void softmax_grad_rows_f32(float* s, float* dp, int64_t rows, int64_t n, int64_t i0, const uint8_t* m,         \
                                  float scale, const float* lse, const float* d) {                                    \
    softmax_grad_rows_f32_impl(s, dp, rows, n, i0, m, scale, lse, d);                                                \
  }                                                                                                                   \
  ATTR float dot_f32(const float* a, const float* b, int64_t n) { return row_dot_f32(a, b, n); }                      \
  ATTR void softmax_grad_rows(const float* s, const float* dp, int64_t rows, int64_t n, int64_t i0, const uint8_t* m, \
                              float scale, const float* lse, const float* d, W* pr, W* dsr, u16* ds) {                \
    softmax_grad_rows_impl(s, dp, rows, n, i0, m, scale, lse, d, pr, dsr, ds);                                       \
  }                                                                                                                   \
  ATTR float dot(const u16* a, const u16* b, int64_t n) { return row_dot(a, b, n); }                                   \
  ATTR void store_rows(const float* src, int64_t lds, int64_t rows, int64_t cols, u16* dst, int64_t ldd,              \
                       const float* row_scale) {                                                                      \
    store_rows_impl(src, lds, rows, cols, dst, ldd, row_scale);                                                      \
  }                                                                                                                   \
  const AttnKernels kernels{softmax_rows, softmax_rows_f32, softmax_grad_rows_f32, dot_f32, softmax_grad_rows, dot,    \
                           store_rows};                                                                               \
  }

ALPACA_FOR_EACH_CPU_ISA(ALPACA_ATTN_KERNELS)

const AttnKernels& attn_kernels() { return ALPACA_ISA_KERNELS(static_cast<int>(fused_cpu_isa())); }

// dst = bf16(src (* row_scale)), rows x cols (store_rows_impl), in this CPU's variant.
void store_bf16(const float* src, int64_t lds, int64_t rows, int64_t cols, u16* dst, int64_t ldd,
                const float* row_scale = nullptr) {
  attn_kernels().store_rows(src, lds, rows, cols, dst, ldd, row_scale);
}

const W* words(const u16* p) { return reinterpret_cast<const W*>(p); }

// The problem: q, out, dq (B, T, H, Dh) and k, v, dk, dv (B, T, Hkv, Dh) contiguous bf16 (Dh even);
// lse (B, H, T) fp32; mask (B or 1, T, T) bytes or null. Key counts are rounded up to even (tp, and
// each block's np) for the packed products, and score rows to whole softmax chunks (tn, each block's
// n); the extra keys are never allowed (they lie after every query).
struct Attn {
  int64_t b, t, h, hkv, dh;
  float scale;
  const uint8_t* mask;
  int64_t mask_bstride;
  int64_t tp() const { return t + (t & 1); }
  int64_t tn() const { return round_chunk(t); }
  int64_t ldq() const { return h * dh; }
  int64_t ldk() const { return hkv * dh; }
  int64_t q_off(int64_t bi, int64_t i, int64_t hi) const { return ((bi * t + i) * h + hi) * dh; }
  int64_t k_off(int64_t bi, int64_t g) const { return (bi * t * hkv + g) * dh; }
};

// One thread's buffers, reused across its tasks and blocks, and kept (grown, never shrunk) from call
// to call: a fresh set per call went to mmap and back, ~20k page faults per step. kc, vc = K^T, V^T
// packed in panels (Dh/2 x tn words, bf16gemm::pack_cols); kr, vr = K, V packed by key pairs (tp/2 x
// Dh); per block (rows of tn at most) s, dp (fp32), p (forward), ds (bf16), the backward's P and dS
// packed by row pairs (pr, dsr), the block's mask rows and its Q and dO packed by row pairs.
struct Scratch {
  std::vector<W> kc, vc, kr, vr, pr, dsr, qr, dor;
  std::vector<u16> p, ds;
  std::vector<uint8_t> mask;
  std::vector<float> s, dp, o, dk, dv, dsum, inv;
  static Scratch& of_this_thread(const Attn& a, bool backward) {
    thread_local Scratch w;
    const auto grow = [](auto& v, int64_t n) {
      if (static_cast<int64_t>(v.size()) < n) v.resize(n);
    };
    const int64_t tp = a.tp(), tn = a.tn(), dh = a.dh;
    for (auto* m : {&w.kc, &w.vc}) grow(*m, bf16gemm::panels_size(dh / 2, tn));
    for (auto* m : {&w.kr, &w.vr}) grow(*m, tp / 2 * dh);
    for (auto* m : {&w.pr, &w.dsr}) grow(*m, kAttnBlock / 2 * tn);
    for (auto* m : {&w.qr, &w.dor}) grow(*m, kAttnBlock / 2 * dh);
    for (auto* m : {&w.p, &w.ds}) grow(*m, (kAttnBlock + 1) * tn);
    for (auto* m : {&w.s, &w.dp}) grow(*m, kAttnBlock * tn);
    if (a.mask != nullptr) grow(w.mask, kAttnBlock * tn);
    grow(w.o, kAttnBlock * dh);
    grow(w.inv, kAttnBlock);
    if (backward) {
      for (auto* m : {&w.dk, &w.dv}) grow(*m, tp * dh);
      grow(w.dsum, a.t);
    }
    return w;
  }
};

// K^T packed in panels into kc; the columns after the last key (to the panel's end, >= tn) are zero.
void pack_keys_transposed(const Attn& a, const u16* k, W* kc) { bf16gemm::pack_cols(k, a.ldk(), a.t, a.dh, kc); }

// Rows of the block at i0, its key count rounded up to even (np: the products' reduction over keys)
// and to whole softmax chunks (n: the score rows, whose columns from the last key on are zero keys).
struct Block {
  int64_t i0, rows, np, n;
  Block(const Attn& a, int64_t i0_)
      : i0(i0_), rows(std::min(kAttnBlock, a.t - i0)), np(i0 + rows + ((i0 + rows) & 1)), n(round_chunk(i0 + rows)) {}
};

// The block's mask rows with row stride blk.n, 0 past the last key (so a softmax chunk reads no
// further than its row), in w.mask; null without a mask.
const uint8_t* block_mask(const Attn& a, int64_t bi, const Block& blk, std::vector<uint8_t>& buf) {
  if (a.mask == nullptr) return nullptr;
  const int64_t keys = std::min(a.t, blk.n);
  for (int64_t r = 0; r < blk.rows; ++r) {
    uint8_t* dst = buf.data() + r * blk.n;
    std::memcpy(dst, a.mask + bi * a.mask_bstride + (blk.i0 + r) * a.t, static_cast<size_t>(keys));
    std::fill(dst + keys, dst + blk.n, uint8_t{0});
  }
  return buf.data();
}

void forward_head(const Attn& a, int64_t bi, int64_t hi, const u16* q, u16* out, float* lse, Scratch& w) {
  const AttnKernels& K = attn_kernels();
  const int64_t dp2 = a.dh / 2;
  for (int64_t i0 = 0; i0 < a.t; i0 += kAttnBlock) {
    const Block blk(a, i0);
    bf16gemm::gemm(blk.rows, blk.n, dp2, words(q + a.q_off(bi, i0, hi)), a.ldq() / 2, 1,
                   bf16gemm::panels_of(w.kc.data(), dp2), w.s.data(), blk.n, false, {Causal::kCols, i0});
    K.softmax_rows(w.s.data(), blk.rows, blk.n, i0, block_mask(a, bi, blk, w.mask), a.scale, w.p.data(),
                   lse + (bi * a.h + hi) * a.t + i0, w.inv.data());
    bf16gemm::gemm(blk.rows, a.dh, blk.np / 2, words(w.p.data()), blk.n / 2, 1, bf16gemm::rows_of(w.vr.data(), a.dh),
                   w.o.data(), a.dh, false, {Causal::kDepthTo, i0});
    store_bf16(w.o.data(), a.dh, blk.rows, a.dh, out + a.q_off(bi, i0, hi), a.ldq(), w.inv.data());
  }
}

void attention_forward(const Attn& a, const u16* q, const u16* k, const u16* v, u16* out, float* lse) {
  const int64_t rep = a.h / a.hkv;
  at::parallel_for(0, a.b * a.hkv, 1, [&](int64_t t0, int64_t t1) {
    Scratch& w = Scratch::of_this_thread(a, false);
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t bi = task / a.hkv, g = task % a.hkv;
      pack_keys_transposed(a, k + a.k_off(bi, g), w.kc.data());
      bf16gemm::pack_rows(v + a.k_off(bi, g), a.ldk(), a.t, a.dh, w.vr.data());
      for (int64_t hi = g * rep; hi < (g + 1) * rep; ++hi) forward_head(a, bi, hi, q, out, lse, w);
    }
    bf16gemm::release();
  });
}

struct Grads {
  const u16 *q, *k, *v, *out, *dout;
  const float* lse;
  u16 *dq, *dk, *dv;
};

// One query head's share of the backward: dQ of its rows, and its terms of its KV head's dK, dV
// (w.dk, w.dv; w.kc, w.vc, w.kr hold that KV head's K and V packed).
void backward_head(const Attn& a, int64_t bi, int64_t hi, const Grads& gr, Scratch& w) {
  const AttnKernels& K = attn_kernels();
  const u16 *qb = gr.q + a.q_off(bi, 0, hi), *ob = gr.out + a.q_off(bi, 0, hi), *dob = gr.dout + a.q_off(bi, 0, hi);
  const float* lse = gr.lse + (bi * a.h + hi) * a.t;
  const int64_t dp2 = a.dh / 2, ldq = a.ldq();
  for (int64_t i = 0; i < a.t; ++i) w.dsum[i] = K.dot(dob + i * ldq, ob + i * ldq, a.dh);
  for (int64_t i0 = 0; i0 < a.t; i0 += kAttnBlock) {
    const Block blk(a, i0);
    const int64_t np = blk.np, n = blk.n, rp = (blk.rows + 1) / 2;
    bf16gemm::gemm(blk.rows, n, dp2, words(qb + i0 * ldq), ldq / 2, 1, bf16gemm::panels_of(w.kc.data(), dp2),
                   w.s.data(), n, false, {Causal::kCols, i0});
    bf16gemm::gemm(blk.rows, n, dp2, words(dob + i0 * ldq), ldq / 2, 1, bf16gemm::panels_of(w.vc.data(), dp2),
                   w.dp.data(), n, false, {Causal::kCols, i0});
    K.softmax_grad_rows(w.s.data(), w.dp.data(), blk.rows, n, i0, block_mask(a, bi, blk, w.mask), a.scale, lse + i0,
                        w.dsum.data() + i0, w.pr.data(), w.dsr.data(), w.ds.data());
    bf16gemm::gemm(blk.rows, a.dh, np / 2, words(w.ds.data()), n / 2, 1, bf16gemm::rows_of(w.kr.data(), a.dh),
                   w.o.data(), a.dh, false, {Causal::kDepthTo, i0});
    store_bf16(w.o.data(), a.dh, blk.rows, a.dh, gr.dq + a.q_off(bi, i0, hi), ldq);
    bf16gemm::pack_rows(qb + i0 * ldq, ldq, blk.rows, a.dh, w.qr.data());
    bf16gemm::pack_rows(dob + i0 * ldq, ldq, blk.rows, a.dh, w.dor.data());
    bf16gemm::gemm(np, a.dh, rp, w.pr.data(), 1, n, bf16gemm::rows_of(w.dor.data(), a.dh), w.dv.data(), a.dh, true,
                   {Causal::kDepthFrom, i0});
    bf16gemm::gemm(np, a.dh, rp, w.dsr.data(), 1, n, bf16gemm::rows_of(w.qr.data(), a.dh), w.dk.data(), a.dh, true,
                   {Causal::kDepthFrom, i0});
  }
}

void attention_backward(const Attn& a, const Grads& gr) {
  const int64_t rep = a.h / a.hkv;
  at::parallel_for(0, a.b * a.hkv, 1, [&](int64_t t0, int64_t t1) {
    Scratch& w = Scratch::of_this_thread(a, true);
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t bi = task / a.hkv, g = task % a.hkv;
      pack_keys_transposed(a, gr.k + a.k_off(bi, g), w.kc.data());
      pack_keys_transposed(a, gr.v + a.k_off(bi, g), w.vc.data());
      bf16gemm::pack_rows(gr.k + a.k_off(bi, g), a.ldk(), a.t, a.dh, w.kr.data());
      std::fill_n(w.dk.begin(), a.tp() * a.dh, 0.0f);
      std::fill_n(w.dv.begin(), a.tp() * a.dh, 0.0f);
      for (int64_t hi = g * rep; hi < (g + 1) * rep; ++hi) backward_head(a, bi, hi, gr, w);
      store_bf16(w.dk.data(), a.dh, a.t, a.dh, gr.dk + a.k_off(bi, g), a.ldk());
      store_bf16(w.dv.data(), a.dh, a.t, a.dh, gr.dv + a.k_off(bi, g), a.ldk());
    }
    bf16gemm::release();
  });
}

// ---- The fp32 route: the same blocks, keys up to the block's last row, products through ATen's
// cpublas fp32 GEMM (MKL's sgemm where LibTorch has it), P and dS kept in fp32 (issue 32) ----

// One thread's buffers (grown, never shrunk, as Scratch): s, p (forward) or dp (backward) of a block,
// rows x n fp32; the block's mask rows; the forward rows' 1 / sum; the backward's rowsum(dO * O).
struct ScratchF32 {
  std::vector<float> s, p, inv, dsum;
  std::vector<uint8_t> mask;
  static ScratchF32& of_this_thread(const Attn& a) {
    thread_local ScratchF32 w;
    const auto grow = [](auto& v, int64_t n) {
      if (static_cast<int64_t>(v.size()) < n) v.resize(n);
    };
    grow(w.s, kAttnBlock * a.tn());
    grow(w.p, kAttnBlock * a.tn());
    grow(w.inv, kAttnBlock);
    grow(w.dsum, a.t);
    if (a.mask != nullptr) grow(w.mask, kAttnBlock * a.tn());
    return w;
  }
};

// One task per (batch, query head): per block, S = Q_blk K[:keys]^T, the softmax rows (fp32 P, not
// yet divided by the row sums), O_blk = P V[:keys] written in place, then scaled by 1 / sum.
void attention_forward_f32(const Attn& a, const float* q, const float* k, const float* v, float* out, float* lse) {
  const int64_t rep = a.h / a.hkv;
  at::parallel_for(0, a.b * a.h, 1, [&](int64_t t0, int64_t t1) {
    ScratchF32& w = ScratchF32::of_this_thread(a);
    const AttnKernels& K = attn_kernels();
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t bi = task / a.h, hi = task % a.h;
      const float *kb = k + a.k_off(bi, hi / rep), *vb = v + a.k_off(bi, hi / rep);
      for (int64_t i0 = 0; i0 < a.t; i0 += kAttnBlock) {
        const Block blk(a, i0);
        const int64_t keys = i0 + blk.rows;
        blas::sgemm(false, true, blk.rows, keys, a.dh, q + a.q_off(bi, i0, hi), a.ldq(), kb, a.ldk(), 0.0f, w.s.data(), blk.n);
        K.softmax_rows_f32(w.s.data(), blk.rows, blk.n, i0, block_mask(a, bi, blk, w.mask), a.scale, w.p.data(),
                           lse + (bi * a.h + hi) * a.t + i0, w.inv.data());
        float* o = out + a.q_off(bi, i0, hi);
        blas::sgemm(false, false, blk.rows, a.dh, keys, w.p.data(), blk.n, vb, a.ldk(), 0.0f, o, a.ldq());
        for (int64_t r = 0; r < blk.rows; ++r)
          for (int64_t c = 0; c < a.dh; ++c) o[r * a.ldq() + c] *= w.inv[r];
      }
    }
  });
}

struct GradsF32 {
  const float *q, *k, *v, *out, *dout, *lse;
  float *dq, *dk, *dv;
};

// One task per (batch, KV head), its query heads in turn (dK, dV sum over them and over the blocks
// in place, in fp32): per block, S = Q_blk K^T and dP = dO_blk V^T, the rows' P and dS (scale folded
// in) over them, dQ_blk = dS K, dV += P^T dO_blk, dK += dS^T Q_blk.
void attention_backward_f32(const Attn& a, const GradsF32& gr) {
  const int64_t rep = a.h / a.hkv, ldq = a.ldq(), ldk = a.ldk();
  at::parallel_for(0, a.b * a.hkv, 1, [&](int64_t t0, int64_t t1) {
    ScratchF32& w = ScratchF32::of_this_thread(a);
    const AttnKernels& K = attn_kernels();
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t bi = task / a.hkv, g = task % a.hkv;
      const float *kb = gr.k + a.k_off(bi, g), *vb = gr.v + a.k_off(bi, g);
      float *dkb = gr.dk + a.k_off(bi, g), *dvb = gr.dv + a.k_off(bi, g);
      for (int64_t i = 0; i < a.t; ++i) {
        std::fill_n(dkb + i * ldk, a.dh, 0.0f);
        std::fill_n(dvb + i * ldk, a.dh, 0.0f);
      }
      for (int64_t hi = g * rep; hi < (g + 1) * rep; ++hi) {
        const float *qb = gr.q + a.q_off(bi, 0, hi), *ob = gr.out + a.q_off(bi, 0, hi), *dob = gr.dout + a.q_off(bi, 0, hi);
        const float* lse = gr.lse + (bi * a.h + hi) * a.t;
        for (int64_t i = 0; i < a.t; ++i) w.dsum[i] = K.dot_f32(dob + i * ldq, ob + i * ldq, a.dh);
        for (int64_t i0 = 0; i0 < a.t; i0 += kAttnBlock) {
          const Block blk(a, i0);
          const int64_t keys = i0 + blk.rows, n = blk.n;
          blas::sgemm(false, true, blk.rows, keys, a.dh, qb + i0 * ldq, ldq, kb, ldk, 0.0f, w.s.data(), n);
          blas::sgemm(false, true, blk.rows, keys, a.dh, dob + i0 * ldq, ldq, vb, ldk, 0.0f, w.p.data(), n);
          K.softmax_grad_rows_f32(w.s.data(), w.p.data(), blk.rows, n, i0, block_mask(a, bi, blk, w.mask), a.scale,
                                  lse + i0, w.dsum.data() + i0);
          blas::sgemm(false, false, blk.rows, a.dh, keys, w.p.data(), n, kb, ldk, 0.0f, gr.dq + a.q_off(bi, i0, hi), ldq);
          blas::sgemm(true, false, keys, a.dh, blk.rows, w.s.data(), n, dob + i0 * ldq, ldq, 1.0f, dvb, ldk);
          blas::sgemm(true, false, keys, a.dh, blk.rows, w.p.data(), n, qb + i0 * ldq, ldq, 1.0f, dkb, ldk);
        }
      }
    }
  });
}

const u16* bits(const at::Tensor& t) { return reinterpret_cast<const u16*>(t.const_data_ptr<at::BFloat16>()); }
u16* mbits(at::Tensor& t) { return reinterpret_cast<u16*>(t.mutable_data_ptr<at::BFloat16>()); }

Attn problem(const at::Tensor& q, const at::Tensor& k, double scale, const at::Tensor& mask) {
  Attn a{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), static_cast<float>(scale), nullptr, 0};
  if (mask.numel() > 0) {
    a.mask = reinterpret_cast<const uint8_t*>(mask.const_data_ptr<bool>());
    a.mask_bstride = mask.size(0) == 1 ? 0 : a.t * a.t;
  }
  return a;
}

// q (B, T, H, Dh), k and v (B, T, Hkv, Dh) contiguous bf16; mask (B or 1, T, T) contiguous bool, or
// empty for pure causal (autograd's apply takes no undefined tensor).
struct GemmAttentionFn : public torch::autograd::Function<GemmAttentionFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double scale, const at::Tensor& mask) {
    const Attn a = problem(q, k, scale, mask);
    at::Tensor out = at::empty_like(q);
    at::Tensor lse = at::empty({a.b, a.h, a.t}, q.options().dtype(at::kFloat));
    {
      ALPACA_TRACE_BYTES("alpaca::gemm_attention", util::nbytes_of({q, k, v, mask}));
      attention_forward(a, bits(q), bits(k), bits(v), mbits(out), lse.mutable_data_ptr<float>());
    }
    ctx->save_for_backward({q, k, v, out, lse, mask});
    ctx->saved_data["scale"] = scale;
    return out;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4], &mask = saved[5];
    const at::Tensor dout = grad_out[0].to(at::kBFloat16).contiguous();
    at::Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
    const Attn a = problem(q, k, ctx->saved_data["scale"].toDouble(), mask);
    const Grads gr{bits(q), bits(k), bits(v), bits(out), bits(dout), lse.const_data_ptr<float>(),
                   mbits(dq), mbits(dk), mbits(dv)};
    ALPACA_TRACE_BYTES("alpaca::gemm_attention_backward", util::nbytes_of({q, k, v, out, dout, lse, mask}));
    attention_backward(a, gr);
    return {dq, dk, dv, at::Tensor(), at::Tensor()};
  }
};

// The fp32 route's autograd function: as GemmAttentionFn, computed in fp32. bf16 q, k, v (an AVX2-only
// CPU's bf16 training, matmul.h's kFp32 mode) are upcast for the kernels and saved as they came (upcast
// again in backward); the output and the gradients are returned in the inputs' dtype, out and lse kept
// in fp32 (the backward's rowsum(dO * O) on a rounded O would cost dQ and dK ~1% of their scale).
struct GemmAttentionF32Fn : public torch::autograd::Function<GemmAttentionF32Fn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double scale, const at::Tensor& mask) {
    const Attn a = problem(q, k, scale, mask);
    const at::Tensor q32 = q.to(at::kFloat), k32 = k.to(at::kFloat), v32 = v.to(at::kFloat);
    at::Tensor out = at::empty_like(q32);
    at::Tensor lse = at::empty({a.b, a.h, a.t}, q32.options());
    {
      ALPACA_TRACE_BYTES("alpaca::gemm_attention_f32", util::nbytes_of({q, k, v, mask}));
      attention_forward_f32(a, q32.const_data_ptr<float>(), k32.const_data_ptr<float>(), v32.const_data_ptr<float>(),
                            out.mutable_data_ptr<float>(), lse.mutable_data_ptr<float>());
    }
    ctx->save_for_backward({q, k, v, out, lse, mask});
    ctx->saved_data["scale"] = scale;
    return out.to(q.scalar_type());
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4], &mask = saved[5];
    const at::Tensor q32 = q.to(at::kFloat), k32 = k.to(at::kFloat), v32 = v.to(at::kFloat);
    const at::Tensor dout = grad_out[0].to(at::kFloat).contiguous();
    at::Tensor dq = at::empty_like(q32), dk = at::empty_like(k32), dv = at::empty_like(v32);
    const Attn a = problem(q, k, ctx->saved_data["scale"].toDouble(), mask);
    const GradsF32 gr{q32.const_data_ptr<float>(), k32.const_data_ptr<float>(), v32.const_data_ptr<float>(),
                      out.const_data_ptr<float>(), dout.const_data_ptr<float>(), lse.const_data_ptr<float>(),
                      dq.mutable_data_ptr<float>(), dk.mutable_data_ptr<float>(), dv.mutable_data_ptr<float>()};
    ALPACA_TRACE_BYTES("alpaca::gemm_attention_f32_backward", util::nbytes_of({q, k, v, out, dout, lse, mask}));
    attention_backward_f32(a, gr);
    const at::ScalarType t = q.scalar_type();
    return {dq.to(t), dk.to(t), dv.to(t), at::Tensor(), at::Tensor()};
  }
};

std::atomic<bool>& enabled_slot() {
  static std::atomic<bool> slot{[] {
    const char* env = std::getenv("ALPACA_CPU_ATTN");
    if (env == nullptr || *env == '\0') return true;
    ALPACA_CHECK(std::strcmp(env, "0") == 0 || std::strcmp(env, "1") == 0,
                 "ALPACA_CPU_ATTN=" << env << " is not understood; use 1 (GEMM attention for bf16 and fp32 CPU training) or 0 "
                                       "(ATen's scaled_dot_product_attention)");
    return env[0] == '1';
  }()};
  return slot;
}

}  // namespace

bool gemm_attention_applies(const at::Tensor& q) {
  // Only with fast products (our AVX512-BF16 kernel, oneDNN's on AMX): on the cpublas fallback (MKL's
  // fp32-converting bf16 GEMM here) it measured 0.7-1.1x SDPA, so AVX2-only CPUs keep SDPA
  // (docs/profile_bf16.md).
  return fused_cpu_bf16_applies(q) && cpu_attention_routes_on() && bf16gemm::fast();
}

bool mask_within_causal(const at::Tensor& allow_b1tt) {
  if (!allow_b1tt.defined()) return true;
  if (allow_b1tt.dim() != 4 || allow_b1tt.scalar_type() != at::kBool || !allow_b1tt.is_cpu()) return false;
  const at::Tensor m = allow_b1tt.select(1, 0);  // (B, T, K), any strides (make_context's is expanded)
  const int64_t b = m.size(0), t = m.size(1), k = m.size(2), s0 = m.stride(0), s1 = m.stride(1), s2 = m.stride(2);
  const bool* p = m.const_data_ptr<bool>();
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t i = 0; i < t; ++i)
      for (int64_t j = i + 1; j < k; ++j)
        if (p[bi * s0 + i * s1 + j * s2]) return false;
  return true;
}

void set_gemm_attention(bool on) { enabled_slot().store(on, std::memory_order_relaxed); }

bool cpu_attention_routes_on() { return enabled_slot().load(std::memory_order_relaxed); }

const char* cpu_bf16_gemm_backend() { return bf16gemm::name(bf16gemm::backend()); }

namespace {

// The checks both routes share, then fn(q, k, v (B, T, heads, Dh) contiguous, mask (B or 1, T, T) or empty).
template <typename Fn>
at::Tensor causal_attention_cpu(const char* what, at::ScalarType dtype, bool even_dh, const at::Tensor& q_bhtd,
                                const at::Tensor& k_bhtd, const at::Tensor& v_bhtd, const at::Tensor& allow_b1tt,
                                Fn fn) {
  const bool ok = q_bhtd.dim() == 4 && k_bhtd.dim() == 4 && v_bhtd.sizes() == k_bhtd.sizes() &&
                  q_bhtd.scalar_type() == dtype && k_bhtd.scalar_type() == dtype && v_bhtd.scalar_type() == dtype &&
                  q_bhtd.is_cpu() && k_bhtd.is_cpu() && v_bhtd.is_cpu() && k_bhtd.size(0) == q_bhtd.size(0) &&
                  k_bhtd.size(2) == q_bhtd.size(2) && k_bhtd.size(3) == q_bhtd.size(3) &&
                  (!even_dh || q_bhtd.size(3) % 2 == 0) && k_bhtd.size(1) > 0 && q_bhtd.size(1) % k_bhtd.size(1) == 0;
  ALPACA_CHECK(ok, what << ": needs " << dtype << " CPU q (B, H, T, Dh) and k, v (B, Hkv, T, Dh) with H a multiple of Hkv"
                        << (even_dh ? " and Dh even" : "") << ", got q " << q_bhtd.sizes() << " " << q_bhtd.scalar_type()
                        << ", k " << k_bhtd.sizes() << ", v " << v_bhtd.sizes());
  const int64_t b = q_bhtd.size(0), t = q_bhtd.size(2);
  at::Tensor mask = at::empty({0}, at::kBool);
  if (allow_b1tt.defined()) {
    ALPACA_CHECK(allow_b1tt.scalar_type() == at::kBool && allow_b1tt.dim() == 4 && allow_b1tt.size(1) == 1 &&
                     (allow_b1tt.size(0) == 1 || allow_b1tt.size(0) == b) && allow_b1tt.size(2) == t &&
                     allow_b1tt.size(3) == t && allow_b1tt.is_cpu(),
                 what << ": the mask must be a CPU bool (" << b << " or 1, 1, " << t << ", " << t << "), got "
                      << allow_b1tt.sizes() << " " << allow_b1tt.scalar_type());
    mask = allow_b1tt.select(1, 0).contiguous();
  }
  const at::Tensor q = q_bhtd.transpose(1, 2).contiguous(), k = k_bhtd.transpose(1, 2).contiguous(),
                   v = v_bhtd.transpose(1, 2).contiguous();
  return fn(q, k, v, mask).transpose(1, 2);
}

}  // namespace

at::Tensor causal_attention_bf16(const at::Tensor& q_bhtd, const at::Tensor& k_bhtd, const at::Tensor& v_bhtd,
                                 double scale, const at::Tensor& allow_b1tt) {
  return causal_attention_cpu("causal_attention_bf16", at::kBFloat16, /*even_dh=*/true, q_bhtd, k_bhtd, v_bhtd,
                              allow_b1tt, [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                              const at::Tensor& mask) { return GemmAttentionFn::apply(q, k, v, scale, mask); });
}

at::Tensor causal_attention_fp32(const at::Tensor& q_bhtd, const at::Tensor& k_bhtd, const at::Tensor& v_bhtd,
                                 double scale, const at::Tensor& allow_b1tt) {
  ALPACA_CHECK(blas::sgemm_available(), "causal_attention_fp32: this LibTorch exports no BLAS sgemm_; use SDPA");
  ALPACA_CHECK(q_bhtd.numel() < (int64_t{1} << 31) && k_bhtd.numel() < (int64_t{1} << 31),
               "causal_attention_fp32: tensors of 2^31 or more elements exceed the BLAS's 32-bit sizes");
  const at::ScalarType dtype = q_bhtd.scalar_type() == at::kBFloat16 ? at::kBFloat16 : at::kFloat;
  return causal_attention_cpu("causal_attention_fp32", dtype, /*even_dh=*/false, q_bhtd, k_bhtd, v_bhtd,
                              allow_b1tt, [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                              const at::Tensor& mask) { return GemmAttentionF32Fn::apply(q, k, v, scale, mask); });
}

bool gemm_attention_fp32_applies(const at::Tensor& q) {
  // Needs LibTorch's BLAS (every x86 wheel: MKL), found at run time (blas.h).
  return blas::sgemm_available() && q.defined() && (q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16) &&
         q.is_cpu() && fused_cpu_enabled() && cpu_attention_routes_on();
}

}  // namespace alpaca::model
