// Fused cross-entropy rows over bf16 logits (see loss_rows.h). Three passes over one row (its max,
// exp(z - max) into an fp32 scratch row and its sum, the gradient written over the logits) while
// the row (64 KB, its scratch 128 KB at a 32k vocabulary) stays in L2, against seven passes over a chunk's fp32 copy (~34 MB) before. Compiled
// like fused_ops.cpp (-O3 -ffp-contract=off -fno-trapping-math, CMakeLists.txt); exp is
// fused_math.h's (within ~1 fp32 ulp of ATen's), so bf16 losses and gradients differ from the
// ATen passes' only in the last fp32 bits before a rounding.
#include "loss_rows.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "alpaca/model/fused_ops.h"
#include "alpaca/model/loss_gemm.h"
#include "alpaca/util/error.h"
#include "alpaca/util/trace.h"

#include "bf16_gemm.h"
#include "blas.h"
#include "fused_math.h"

namespace alpaca::model {
namespace {

using namespace fused;  // u16, In, Out, Acc, f32, bf16, exp_f, kLanes (fused_math.h)

// A logit as fp32: bf16 words widened, fp32 as is (the row loops below take either).
ALPACA_INLINE float logit(u16 x) { return f32(x); }
ALPACA_INLINE float logit(float x) { return x; }

template <class T>
ALPACA_INLINE float row_max_impl(const T* __restrict z, int64_t v) {
  float acc[kLanes];
  for (int l = 0; l < kLanes; ++l) acc[l] = -INFINITY;
  int64_t i = 0;
  for (; i + kLanes <= v; i += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const float x = logit(z[i + l]);
      acc[l] = x > acc[l] ? x : acc[l];
    }
  float m = -INFINITY;
  for (int l = 0; l < kLanes; ++l) m = acc[l] > m ? acc[l] : m;
  for (; i < v; ++i) m = logit(z[i]) > m ? logit(z[i]) : m;
  return m;
}

// Returns s = sum_i exp(z[i] - m). kStore: e[i] = exp(z[i] - m) kept for the gradient (the row's
// fp32 scratch stays in L2). kXe: *xe = sum_i e[i] (z[i] - m), so the row's softmax entropy is
// log(s) - xe / s (TRL's log_z - sum_v exp(z_v - m) z_v / s, the max taken out of both terms).
template <class T, bool kStore, bool kXe>
ALPACA_INLINE float row_sumexp_impl(const T* __restrict z, int64_t v, float m, float* __restrict e, float* xe) {
  float acc[kLanes] = {}, acc_xe[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= v; i += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const float x = logit(z[i + l]) - m;
      const float ex = exp_f(x);
      if constexpr (kStore) e[i + l] = ex;
      acc[l] += ex;
      if constexpr (kXe) acc_xe[l] += ex * x;
    }
  float s = 0, sxe = 0;
  for (int l = 0; l < kLanes; ++l) {
    s += acc[l];
    sxe += acc_xe[l];
  }
  for (; i < v; ++i) {
    const float x = logit(z[i]) - m;
    const float ex = exp_f(x);
    if constexpr (kStore) e[i] = ex;
    s += ex;
    if constexpr (kXe) sxe += ex * x;
  }
  if constexpr (kXe) *xe = sxe;
  return s;
}

// z[i] = bf16(e[i] / s): the softmax, rounded once.
ALPACA_INLINE void row_softmax_impl(const float* __restrict e, int64_t v, float s, Out z) {
  for (int64_t i = 0; i < v; ++i) z[i] = bf16(e[i] / s);
}

struct LossRowKernels {
  float (*row_max)(const u16*, int64_t);
  float (*row_sumexp)(const u16*, int64_t, float, float*);
  float (*row_sumexp_xe)(const u16*, int64_t, float, float*, float*);
  void (*row_softmax)(const float*, int64_t, float, u16*);
  float (*f32_row_max)(const float*, int64_t);
  float (*f32_row_sumexp_xe)(const float*, int64_t, float, float*);  // read only: no e kept
};

#define ALPACA_LOSS_ROW_KERNELS(NS, ATTR)                                                                      \
  namespace NS {                                                                                               \
  ATTR float row_max(const u16* z, int64_t v) { return row_max_impl(z, v); }                                  \
  ATTR float row_sumexp(const u16* z, int64_t v, float m, float* e) {                                          \
    return row_sumexp_impl<u16, true, false>(z, v, m, e, nullptr);                                             \
  }                                                                                                            \
  ATTR float row_sumexp_xe(const u16* z, int64_t v, float m, float* e, float* xe) {                            \
    return row_sumexp_impl<u16, true, true>(z, v, m, e, xe);                                                   \
  }                                                                                                            \
  ATTR void row_softmax(const float* e, int64_t v, float s, u16* z) { row_softmax_impl(e, v, s, z); }        \
  ATTR float f32_row_max(const float* z, int64_t v) { return row_max_impl(z, v); }                            \
  ATTR float f32_row_sumexp_xe(const float* z, int64_t v, float m, float* xe) {                                \
    return row_sumexp_impl<float, false, true>(z, v, m, nullptr, xe);                                          \
  }                                                                                                            \
  const LossRowKernels kernels{row_max, row_sumexp, row_sumexp_xe, row_softmax, f32_row_max, f32_row_sumexp_xe}; \
  }

ALPACA_FOR_EACH_CPU_ISA(ALPACA_LOSS_ROW_KERNELS)

const LossRowKernels& loss_row_kernels() { return ALPACA_ISA_KERNELS(static_cast<int>(fused_cpu_isa())); }

// Each row's token statistics, written by the parallel row loop and summed in row order (the same
// for any thread count).
class RowStatsBuffer {
 public:
  explicit RowStatsBuffer(int64_t n) : entropy_(static_cast<size_t>(n)), hit_(static_cast<size_t>(n)) {}
  // Row r's softmax entropy from its sum s and xe (row_sumexp_impl), and whether its target t is the
  // first index holding the row's maximum m (`max_of(row, k)`: the maximum of its first k logits).
  template <class T, class MaxOf>
  void set(int64_t r, const T* row, int64_t t, float m, float s, float xe, MaxOf max_of) {
    entropy_[static_cast<size_t>(r)] = std::log(s) - xe / s;
    hit_[static_cast<size_t>(r)] = logit(row[t]) >= m && (t == 0 || max_of(row, t) < m);
  }
  void add_to(RowTokenStats& stats) const {
    for (size_t r = 0; r < entropy_.size(); ++r) {
      stats.entropy_sum += entropy_[r];
      stats.top1 += hit_[r];
    }
  }

 private:
  std::vector<float> entropy_;
  std::vector<uint8_t> hit_;
};

}  // namespace

double cross_entropy_rows_bf16(at::Tensor& z, const at::Tensor& targets, bool write_grad, RowTokenStats* stats) {
  ALPACA_CHECK(z.dim() == 2 && z.scalar_type() == at::kBFloat16 && z.is_cpu() && z.is_contiguous() &&
                   targets.dim() == 1 && targets.size(0) == z.size(0) && targets.scalar_type() == at::kLong &&
                   targets.is_cpu() && targets.is_contiguous(),
               "cross_entropy_rows_bf16: needs contiguous CPU bf16 logits (n, V) and int64 targets (n), got "
                   << z.sizes() << " " << z.scalar_type() << " and " << targets.sizes() << " " << targets.scalar_type());
  const int64_t n = z.size(0), v = z.size(1);
  u16* zp = reinterpret_cast<u16*>(z.mutable_data_ptr<at::BFloat16>());
  const int64_t* tp = targets.const_data_ptr<int64_t>();
  for (int64_t r = 0; r < n; ++r)
    ALPACA_CHECK(tp[r] >= 0 && tp[r] < v, "cross_entropy_rows_bf16: target " << tp[r] << " of row " << r
                                                                             << " outside the vocabulary [0, " << v << ")");
  std::vector<float> row_loss(static_cast<size_t>(n));
  RowStatsBuffer row_stats(stats ? n : 0);
  const LossRowKernels& K = loss_row_kernels();
  ALPACA_TRACE_BYTES("alpaca::cross_entropy_rows", util::nbytes_of({z, targets}));
  at::parallel_for(0, n, 4, [&](int64_t r0, int64_t r1) {
    std::vector<float> e(static_cast<size_t>(v));
    for (int64_t r = r0; r < r1; ++r) {
      u16* row = zp + r * v;
      const int64_t t = tp[r];
      const float zt = f32(row[t]);
      const float m = K.row_max(row, v);
      float xe = 0;
      const float s = stats ? K.row_sumexp_xe(row, v, m, e.data(), &xe) : K.row_sumexp(row, v, m, e.data());
      row_loss[static_cast<size_t>(r)] = (std::log(s) + m) - zt;
      if (stats) row_stats.set(r, row, t, m, s, xe, K.row_max);
      if (!write_grad) continue;
      K.row_softmax(e.data(), v, s, row);
      row[t] = bf16(e[static_cast<size_t>(t)] / s + -1.0f);
    }
  });
  double sum = 0;
  for (float l : row_loss) sum += l;
  if (stats) row_stats.add_to(*stats);
  return sum;
}

at::Tensor token_stats_rows_f32(const at::Tensor& z, const at::Tensor& targets, RowTokenStats& stats) {
  ALPACA_CHECK(z.dim() == 2 && z.scalar_type() == at::kFloat && z.is_cpu() && z.stride(1) == 1 &&
                   targets.dim() == 1 && targets.size(0) == z.size(0) && targets.scalar_type() == at::kLong &&
                   targets.is_cpu() && targets.is_contiguous(),
               "token_stats_rows_f32: needs CPU fp32 logits (n, V) with unit column stride and int64 targets (n), got "
                   << z.sizes() << " " << z.scalar_type() << " and " << targets.sizes() << " " << targets.scalar_type());
  const int64_t n = z.size(0), v = z.size(1), ld = z.stride(0);
  const float* zp = z.const_data_ptr<float>();
  const int64_t* tp = targets.const_data_ptr<int64_t>();
  at::Tensor row_max = at::empty({n, 1}, z.options());
  float* mp = row_max.mutable_data_ptr<float>();
  for (int64_t r = 0; r < n; ++r)
    ALPACA_CHECK(tp[r] >= 0 && tp[r] < v, "token_stats_rows_f32: target " << tp[r] << " of row " << r
                                                                          << " outside the vocabulary [0, " << v << ")");
  RowStatsBuffer row_stats(n);
  const LossRowKernels& K = loss_row_kernels();
  ALPACA_TRACE_BYTES("alpaca::token_stats_rows", util::nbytes_of({z, targets}));
  at::parallel_for(0, n, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = zp + r * ld;
      const float m = K.f32_row_max(row, v);
      float xe = 0;
      const float s = K.f32_row_sumexp_xe(row, v, m, &xe);
      mp[r] = m;
      row_stats.set(r, row, tp[r], m, s, xe, K.f32_row_max);
    }
  });
  row_stats.add_to(stats);
  return row_max;
}

namespace {

// B(p, j) = (h[2p][j], h[2p + 1][j]) in panels (bf16_gemm.h: panels_of), a zero partner for an odd
// last row and zero columns to the end of the last panel.
std::vector<uint32_t> pack_hidden_panels(const u16* h, int64_t n, int64_t d, int64_t kp) {
  std::vector<uint32_t> b(static_cast<size_t>(bf16gemm::panels_size(kp, d)), 0u);
  const int64_t panel = bf16gemm::kPanel * kp;
  for (int64_t p = 0; p < kp; ++p) {
    const u16* r0 = h + 2 * p * d;
    const u16* r1 = 2 * p + 1 < n ? r0 + d : nullptr;
    for (int64_t j = 0; j < d; ++j)
      b[static_cast<size_t>(j / bf16gemm::kPanel * panel + p * bf16gemm::kPanel + j % bf16gemm::kPanel)] =
          static_cast<uint32_t>(r0[j]) | (r1 ? static_cast<uint32_t>(r1[j]) << 16 : 0u);
  }
  return b;
}

// Rows of grad_w (vocabulary entries) a packed A block holds: kp x 64 words (~33 KB at a 262-row
// chunk), in L1/L2 while the kernel walks the B panels over it.
constexpr int64_t kVocabBlock = 64;

}  // namespace

int64_t fp32_logits_row_stride(const at::Tensor& w) {
  constexpr int64_t kFloatsPer64Bytes = 16;
  const int64_t v = w.size(0);
  if (!fused_cpu_enabled() || w.scalar_type() != at::kFloat || !w.is_cpu() || v % kFloatsPer64Bytes == 0 ||
      !blas::sgemm_available() || w.numel() >= (int64_t{1} << 31))
    return 0;
  return (v + kFloatsPer64Bytes - 1) / kFloatsPer64Bytes * kFloatsPer64Bytes;
}

bool head_grad_summed_in_cpu_gemm() {
  return bf16gemm::fast() && fused_cpu_enabled();
}

bool head_weight_grad_bf16(at::Tensor& grad_w, const at::Tensor& g, const at::Tensor& h) {
  if (!bf16gemm::fast() || g.scalar_type() != at::kBFloat16 || h.scalar_type() != at::kBFloat16) return false;
  ALPACA_CHECK(g.dim() == 2 && h.dim() == 2 && g.size(0) == h.size(0) && g.is_cpu() && h.is_cpu() &&
                   g.is_contiguous() && h.is_contiguous(),
               "head_weight_grad_bf16: needs contiguous CPU bf16 g (n, V) and h (n, D), got " << g.sizes() << " and "
                                                                                             << h.sizes());
  const int64_t n = g.size(0), v = g.size(1), d = h.size(1), kp = (n + 1) / 2;
  const bool add = grad_w.defined();
  if (!add) grad_w = at::empty({v, d}, g.options().dtype(at::kFloat));
  ALPACA_CHECK(grad_w.sizes() == at::IntArrayRef({v, d}) && grad_w.scalar_type() == at::kFloat && grad_w.is_cpu() &&
                   grad_w.is_contiguous(),
               "head_weight_grad_bf16: grad_w must be a contiguous CPU fp32 (" << v << ", " << d << "), got "
                                                                              << grad_w.sizes() << " " << grad_w.scalar_type());
  if (n == 0) {
    if (!add) grad_w.zero_();
    return true;
  }
  const auto* gp = reinterpret_cast<const u16*>(g.const_data_ptr<at::BFloat16>());
  const std::vector<uint32_t> b = pack_hidden_panels(reinterpret_cast<const u16*>(h.const_data_ptr<at::BFloat16>()), n, d, kp);
  float* c = grad_w.mutable_data_ptr<float>();
  const int64_t blocks = (v + kVocabBlock - 1) / kVocabBlock;
  ALPACA_TRACE_BYTES("alpaca::head_weight_grad", util::nbytes_of({g, h, add ? grad_w : at::Tensor()}));
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    std::vector<uint32_t> a(static_cast<size_t>(kp * kVocabBlock));
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t i0 = blk * kVocabBlock, m = std::min(kVocabBlock, v - i0);
      bf16gemm::pack_rows(gp + i0, v, n, m, a.data());  // A = g[:, i0:i0+m]^T: word (i, p) at p * m + i
      bf16gemm::gemm(m, d, kp, a.data(), /*a_rs=*/1, /*a_ks=*/m, bf16gemm::panels_of(b.data(), kp), c + i0 * d, d, add);
    }
    bf16gemm::release();
  });
  return true;
}

void accumulate_head_weight_grad(at::Tensor& grad_w, at::Tensor& scratch, const at::Tensor& g, const at::Tensor& h) {
  const bool fused = fused_cpu_bf16_applies(g);
  if (fused && head_weight_grad_bf16(grad_w, g.contiguous(), h.contiguous())) return;
  if (!fused) {  // GPUs, fp16, the module path (ALPACA_CPU_FUSED=0)
    const at::Tensor product = at::mm(g.t(), h);
    grad_w = grad_w.defined() ? grad_w.add_(product) : product.to(at::kFloat);
    return;
  }
  const int64_t v = g.size(1), d = h.size(1);
  if (!scratch.defined() || scratch.sizes() != at::IntArrayRef({v, d}) || scratch.scalar_type() != g.scalar_type())
    scratch = at::empty({v, d}, g.options());
  at::mm_out(scratch, g.t(), h);
  if (!grad_w.defined()) {
    grad_w = scratch.to(at::kFloat);
    return;
  }
  add_bf16_into_fp32(grad_w, scratch);
}

}  // namespace alpaca::model
