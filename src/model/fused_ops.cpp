// Fused bf16 CPU kernels for training: RMSNorm, RoPE, SiLU*mul (see alpaca/model/fused_ops.h).
// Each is a custom autograd function over row loops on raw bf16 bits. The loops are plain C++ that
// GCC vectorises, compiled three times from one source (AVX-512F+BW, AVX2, baseline; the best this
// CPU runs is picked at run time), with -O3 -ffp-contract=off (CMakeLists.txt): no FMA
// contraction, so every copy rounds exactly where the module path's ATen ops round.
#include "alpaca/model/fused_ops.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>  // defines: at::GradMode
#include <torch/csrc/autograd/custom_function.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "alpaca/util/cpu_features.h"
#include "alpaca/util/error.h"
#include "alpaca/util/trace.h"

#include "fused_math.h"

namespace alpaca::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;
using namespace fused;  // u16, In, Out, Acc, f32, bf16, rnd, exp_f, kLanes, dot_lanes (fused_math.h)

ALPACA_INLINE void rms_forward_row_impl(In x, In w, Out y, int64_t d, float rs) {
  for (int64_t i = 0; i < d; ++i) y[i] = bf16(f32(w[i]) * rnd(f32(x[i]) * rs));
}

// Row backward: dx = bf16(rs * gh - x * rs^3 * sum(gh * x) / d), gh = bf16(g * w); the weight's
// partial gradient sum(bf16(g * bf16(x * rs))) accumulates in fp32 into gw.
ALPACA_INLINE void rms_backward_row_impl(In g, In x, In w, float rs, int64_t d, Out gx, Acc gw) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= d; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += rnd(f32(g[i + l]) * f32(w[i + l])) * f32(x[i + l]);
  float dot = 0;
  for (int l = 0; l < kLanes; ++l) dot += acc[l];
  for (; i < d; ++i) dot += rnd(f32(g[i]) * f32(w[i])) * f32(x[i]);
  const float coef = -dot * rs * rs * rs / static_cast<float>(d);
  for (int64_t j = 0; j < d; ++j) {
    const float xv = f32(x[j]);
    gx[j] = bf16(rnd(f32(g[j]) * f32(w[j])) * rs + coef * xv);
    if (gw != nullptr) gw[j] += rnd(f32(g[j]) * rnd(xv * rs));
  }
}

// RoPE on one head row: y = x * c + rotate_half(x) * s, rounded after each product and the sum.
ALPACA_INLINE void rope_row_impl(In x, In c, In s, int64_t half, Out y) {
  for (int64_t i = 0; i < half; ++i) {
    y[i] = bf16(rnd(f32(x[i]) * f32(c[i])) - rnd(f32(x[i + half]) * f32(s[i])));
    y[i + half] = bf16(rnd(f32(x[i + half]) * f32(c[i + half])) + rnd(f32(x[i]) * f32(s[i + half])));
  }
}

// Its transpose: dx = g * c + (the rotation's transpose of g * s), with the module path's roundings.
ALPACA_INLINE void rope_backward_row_impl(In g, In c, In s, int64_t half, Out gx) {
  for (int64_t i = 0; i < half; ++i) {
    gx[i] = bf16(rnd(f32(g[i]) * f32(c[i])) + rnd(f32(g[i + half]) * f32(s[i + half])));
    gx[i + half] = bf16(rnd(f32(g[i + half]) * f32(c[i + half])) - rnd(f32(g[i]) * f32(s[i])));
  }
}

ALPACA_INLINE void silu_mul_rows_impl(In gate, In up, Out out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = f32(gate[i]);
    out[i] = bf16(rnd(x / (1.0f + exp_f(-x))) * f32(up[i]));
  }
}

// d(silu(a) * b): db = bf16(g * bf16(silu(a))), da = silu'(a) * bf16(g * b), as ATen's silu_backward.
ALPACA_INLINE void silu_mul_backward_rows_impl(In g, In gate, In up, Out ggate, Out gup, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = f32(gate[i]), gv = f32(g[i]);
    const float sig = 1.0f / (1.0f + exp_f(-x));
    gup[i] = bf16(gv * rnd(x / (1.0f + exp_f(-x))));
    const float gs = rnd(gv * f32(up[i]));
    ggate[i] = bf16(gs * sig * (1.0f + x * (1.0f - sig)));
  }
}

// d += fp32(s): the upcast is exact, then one fp32 add (ATen's add_ of a bf16 tensor into an fp32 one).
ALPACA_INLINE void add_bf16_rows_impl(float* d, In s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] += f32(s[i]);
}

// The bf16 reduce-scatter folds (dist/: the MPI ring, shared memory): d = fp32(a) + b for a bf16 and
// b bf16 or fp32 (ATen's copy_ of a into fp32, then add_ of b upcast: the upcasts are exact, one fp32
// add, a first), and the last step's d = bf16((fp32(a) + b) / div) (then finish_avg's div_ and copy_'s
// rounding; div 1 for a sum, skipped). sum_round's d may be a itself (an in-place reduce-scatter's own
// block): no __restrict there.
template <typename B>
ALPACA_INLINE float widen(B v) {
  if constexpr (std::is_same_v<B, u16>) {
    return f32(v);
  } else {
    return v;
  }
}
template <typename B>
ALPACA_INLINE void sum_rows_impl(float* __restrict d, In a, const B* __restrict b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = f32(a[i]) + widen(b[i]);
}
template <typename B>
ALPACA_INLINE void sum_round_rows_impl(u16* d, const u16* a, const B* b, float div, int64_t n) {
  if (div == 1.0f) {
    for (int64_t i = 0; i < n; ++i) d[i] = bf16(f32(a[i]) + widen(b[i]));
  } else {
    for (int64_t i = 0; i < n; ++i) d[i] = bf16((f32(a[i]) + widen(b[i])) / div);
  }
}

// One compiled copy of the row loops per instruction set; the same source, so every copy rounds
// identically (tests/model/test_fused_ops.cpp compares them bit for bit).
struct RowKernels {
  float (*sum_squares)(const u16*, int64_t);
  void (*rms_forward_row)(const u16*, const u16*, u16*, int64_t, float);
  void (*rms_backward_row)(const u16*, const u16*, const u16*, float, int64_t, u16*, float*);
  void (*rope_row)(const u16*, const u16*, const u16*, int64_t, u16*);
  void (*rope_backward_row)(const u16*, const u16*, const u16*, int64_t, u16*);
  void (*silu_mul_rows)(const u16*, const u16*, u16*, int64_t);
  void (*silu_mul_backward_rows)(const u16*, const u16*, const u16*, u16*, u16*, int64_t);
  void (*add_bf16_rows)(float*, const u16*, int64_t);
  void (*sum_bf16_rows)(float*, const u16*, const u16*, int64_t);
  void (*sum_bf16_fp32_rows)(float*, const u16*, const float*, int64_t);
  void (*sum_round_bf16_rows)(u16*, const u16*, const u16*, float, int64_t);
  void (*sum_round_fp32_rows)(u16*, const u16*, const float*, float, int64_t);
};

#define ALPACA_ROW_KERNELS(NS, ATTR)                                                                              \
  namespace NS {                                                                                                  \
  ATTR float sum_squares(const u16* x, int64_t d) { return dot_lanes(x, x, d); }                              \
  ATTR void rms_forward_row(const u16* x, const u16* w, u16* y, int64_t d, float rs) {                            \
    rms_forward_row_impl(x, w, y, d, rs);                                                                         \
  }                                                                                                               \
  ATTR void rms_backward_row(const u16* g, const u16* x, const u16* w, float rs, int64_t d, u16* gx, float* gw) { \
    rms_backward_row_impl(g, x, w, rs, d, gx, gw);                                                                \
  }                                                                                                               \
  ATTR void rope_row(const u16* x, const u16* c, const u16* s, int64_t h, u16* y) { rope_row_impl(x, c, s, h, y); } \
  ATTR void rope_backward_row(const u16* g, const u16* c, const u16* s, int64_t h, u16* gx) {                     \
    rope_backward_row_impl(g, c, s, h, gx);                                                                       \
  }                                                                                                               \
  ATTR void silu_mul_rows(const u16* a, const u16* b, u16* o, int64_t n) { silu_mul_rows_impl(a, b, o, n); }      \
  ATTR void silu_mul_backward_rows(const u16* g, const u16* a, const u16* b, u16* ga, u16* gb, int64_t n) {       \
    silu_mul_backward_rows_impl(g, a, b, ga, gb, n);                                                              \
  }                                                                                                               \
  ATTR void add_bf16_rows(float* d, const u16* s, int64_t n) { add_bf16_rows_impl(d, s, n); }                   \
  ATTR void sum_bf16_rows(float* d, const u16* a, const u16* b, int64_t n) { sum_rows_impl(d, a, b, n); }        \
  ATTR void sum_bf16_fp32_rows(float* d, const u16* a, const float* b, int64_t n) { sum_rows_impl(d, a, b, n); } \
  ATTR void sum_round_bf16_rows(u16* d, const u16* a, const u16* b, float div, int64_t n) {                      \
    sum_round_rows_impl(d, a, b, div, n);                                                                         \
  }                                                                                                               \
  ATTR void sum_round_fp32_rows(u16* d, const u16* a, const float* b, float div, int64_t n) {                    \
    sum_round_rows_impl(d, a, b, div, n);                                                                         \
  }                                                                                                               \
  const RowKernels kernels{sum_squares,       rms_forward_row,     rms_backward_row,       rope_row,              \
                           rope_backward_row, silu_mul_rows,       silu_mul_backward_rows, add_bf16_rows,         \
                           sum_bf16_rows,     sum_bf16_fp32_rows,  sum_round_bf16_rows,    sum_round_fp32_rows};  \
  }

ALPACA_FOR_EACH_CPU_ISA(ALPACA_ROW_KERNELS)

std::atomic<int>& isa_slot() {
  static std::atomic<int> slot{static_cast<int>(best_fused_cpu_isa())};
  return slot;
}

const RowKernels& row_kernels() { return ALPACA_ISA_KERNELS(isa_slot().load(std::memory_order_relaxed)); }

const u16* bits(const at::Tensor& t) { return reinterpret_cast<const u16*>(t.const_data_ptr<at::BFloat16>()); }
u16* mbits(at::Tensor& t) { return reinterpret_cast<u16*>(t.mutable_data_ptr<at::BFloat16>()); }

// Rows per task: enough work per chunk for the intra-op threads (~64 KiB of input).
int64_t grain_rows(int64_t row_elems) {
  return std::max<int64_t>(1, (int64_t{32} << 10) / std::max<int64_t>(1, row_elems));
}

struct RmsNormFn : public torch::autograd::Function<RmsNormFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& w, double eps) {
    const at::Tensor x = x_in.contiguous();
    const int64_t d = x.size(-1), rows = x.numel() / d;
    at::Tensor y = at::empty_like(x);
    at::Tensor rstd = at::empty({rows}, x.options().dtype(at::kFloat));
    const u16 *xp = bits(x), *wp = bits(w);
    u16* yp = mbits(y);
    float* rp = rstd.mutable_data_ptr<float>();
    const float e = static_cast<float>(eps);
    const RowKernels& K = row_kernels();
    ALPACA_TRACE_BYTES("alpaca::rms_norm", util::nbytes_of({x, w}));
    at::parallel_for(0, rows, grain_rows(d), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        // As transformers: variance = mean(x^2) in fp32, h = x * rsqrt(variance + eps).
        rp[r] = 1.0f / std::sqrt(K.sum_squares(xp + r * d, d) / static_cast<float>(d) + e);
        K.rms_forward_row(xp + r * d, wp, yp + r * d, d, rp[r]);
      }
    });
    ctx->save_for_backward({x, w, rstd});
    return y;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1], &rstd = saved[2];
    const at::Tensor g = grad_out[0].to(at::kBFloat16).contiguous();
    const int64_t d = x.size(-1), rows = x.numel() / d;
    const bool need_w = ctx->needs_input_grad(1);
    at::Tensor gx = at::empty_like(x);
    // One fp32 partial weight gradient per thread, summed at the end.
    at::Tensor gw_parts = at::zeros({need_w ? at::get_num_threads() : 0, d}, x.options().dtype(at::kFloat));
    const u16 *gp = bits(g), *xp = bits(x), *wp = bits(w);
    u16* gxp = mbits(gx);
    const float* rp = rstd.const_data_ptr<float>();
    float* parts = need_w ? gw_parts.mutable_data_ptr<float>() : nullptr;
    const RowKernels& K = row_kernels();
    {
      ALPACA_TRACE_BYTES("alpaca::rms_norm_backward", util::nbytes_of({g, x, w, rstd, gw_parts}));
      at::parallel_for(0, rows, grain_rows(d), [&](int64_t r0, int64_t r1) {
        float* gw = need_w ? parts + at::get_thread_num() * d : nullptr;
        for (int64_t r = r0; r < r1; ++r) K.rms_backward_row(gp + r * d, xp + r * d, wp, rp[r], d, gxp + r * d, gw);
      });
    }
    at::Tensor gw = need_w ? gw_parts.sum(0).to(w.scalar_type()) : at::Tensor();
    return {gx, gw, at::Tensor()};
  }
};

struct RopeFn : public torch::autograd::Function<RopeFn> {
  // rows of Dh over (B, T, H); cos/sin rows over (B, T).
  using RowFn = void (*)(const u16*, const u16*, const u16*, int64_t, u16*);
  static void run(const at::Tensor& in, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& out, RowFn row) {
    const int64_t b = in.size(0), t = in.size(1), h = in.size(2), dh = in.size(3);
    ALPACA_TRACE_BYTES("alpaca::rope", util::nbytes_of({in, cos, sin}));
    const u16 *ip = bits(in), *cp = bits(cos), *sp = bits(sin);
    u16* op = mbits(out);
    at::parallel_for(0, b * t, grain_rows(h * dh), [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p)
        for (int64_t j = 0; j < h; ++j)
          row(ip + (p * h + j) * dh, cp + p * dh, sp + p * dh, dh / 2, op + (p * h + j) * dh);
    });
  }

  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos_btd,
                            const at::Tensor& sin_btd) {
    const at::Tensor xc = x.contiguous(), c = cos_btd.contiguous(), s = sin_btd.contiguous();
    at::Tensor y = at::empty(x.sizes(), x.options());
    run(xc, c, s, y, row_kernels().rope_row);
    ctx->save_for_backward({c, s});
    return y;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor g = grad_out[0].to(at::kBFloat16).contiguous();
    at::Tensor gx = at::empty(g.sizes(), g.options());
    run(g, saved[0], saved[1], gx, row_kernels().rope_backward_row);
    return {gx, at::Tensor(), at::Tensor()};
  }
};

struct SiluMulFn : public torch::autograd::Function<SiluMulFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    const at::Tensor a = gate.contiguous(), b = up.contiguous();
    at::Tensor out = at::empty(a.sizes(), a.options());
    const u16 *ap = bits(a), *bp = bits(b);
    u16* op = mbits(out);
    const RowKernels& K = row_kernels();
    {
      ALPACA_TRACE_BYTES("alpaca::silu_mul", util::nbytes_of({a, b}));
      at::parallel_for(0, a.numel(), int64_t{1} << 15,
                       [&](int64_t i0, int64_t i1) { K.silu_mul_rows(ap + i0, bp + i0, op + i0, i1 - i0); });
    }
    ctx->save_for_backward({a, b});
    return out;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &a = saved[0], &b = saved[1];
    const at::Tensor g = grad_out[0].to(at::kBFloat16).contiguous();
    at::Tensor ga = at::empty(a.sizes(), a.options()), gb = at::empty(b.sizes(), b.options());
    const u16 *gp = bits(g), *ap = bits(a), *bp = bits(b);
    u16 *gap = mbits(ga), *gbp = mbits(gb);
    const RowKernels& K = row_kernels();
    ALPACA_TRACE_BYTES("alpaca::silu_mul_backward", util::nbytes_of({g, a, b}));
    at::parallel_for(0, a.numel(), int64_t{1} << 15, [&](int64_t i0, int64_t i1) {
      K.silu_mul_backward_rows(gp + i0, ap + i0, bp + i0, gap + i0, gbp + i0, i1 - i0);
    });
    return {ga, gb};
  }
};

std::atomic<bool>& enabled_slot() {
  static std::atomic<bool> slot{[] {
    const char* env = std::getenv("ALPACA_CPU_FUSED");
    if (env == nullptr || *env == '\0') return true;
    ALPACA_CHECK(std::strcmp(env, "0") == 0 || std::strcmp(env, "1") == 0,
                 "ALPACA_CPU_FUSED=" << env << " is not understood; use 1 (fused bf16 CPU kernels) or 0 (module path)");
    return env[0] == '1';
  }()};
  return slot;
}

}  // namespace

FusedCpuIsa best_fused_cpu_isa() {
#if ALPACA_FUSED_X86
  if (cpu::has(cpu::Feature::kAvx512f) && cpu::has(cpu::Feature::kAvx512bw)) return FusedCpuIsa::kAvx512;
  if (cpu::has(cpu::Feature::kAvx2)) return FusedCpuIsa::kAvx2;
#endif
  return FusedCpuIsa::kBaseline;
}

FusedCpuIsa fused_cpu_isa() { return static_cast<FusedCpuIsa>(isa_slot().load(std::memory_order_relaxed)); }

void set_fused_cpu_isa(FusedCpuIsa isa) {
  ALPACA_CHECK(static_cast<int>(isa) <= static_cast<int>(best_fused_cpu_isa()),
               "set_fused_cpu_isa: this CPU cannot run the requested instruction set");
  isa_slot().store(static_cast<int>(isa), std::memory_order_relaxed);
}

void set_fused_cpu_bf16(bool on) { enabled_slot().store(on, std::memory_order_relaxed); }

namespace {
thread_local bool t_training_forward = false;
}  // namespace

bool training_forward() { return t_training_forward || at::GradMode::is_enabled(); }

TrainingForwardScope::TrainingForwardScope() : prev_(t_training_forward) { t_training_forward = true; }
TrainingForwardScope::~TrainingForwardScope() { t_training_forward = prev_; }

bool fused_cpu_enabled() { return enabled_slot().load(std::memory_order_relaxed); }

bool fused_cpu_bf16_applies(const at::Tensor& x) {
  return x.defined() && x.scalar_type() == at::kBFloat16 && x.device().is_cpu() && fused_cpu_enabled();
}

at::Tensor rms_norm_bf16(const at::Tensor& x, const at::Tensor& weight, double eps) {
  ALPACA_CHECK(fused_cpu_bf16_applies(x) && weight.scalar_type() == at::kBFloat16 && weight.dim() == 1 &&
                   x.size(-1) == weight.size(0) && weight.device().is_cpu(),
               "rms_norm_bf16: needs bf16 CPU x (..., D) and weight (D), got " << x.sizes() << " " << x.scalar_type()
                                                                             << " and " << weight.sizes());
  return RmsNormFn::apply(x, weight.contiguous(), eps);
}

at::Tensor rope_bf16(const at::Tensor& x_bthd, const at::Tensor& cos_btd, const at::Tensor& sin_btd) {
  ALPACA_CHECK(fused_cpu_bf16_applies(x_bthd) && x_bthd.dim() == 4 && x_bthd.size(3) % 2 == 0 &&
                   cos_btd.scalar_type() == at::kBFloat16 && sin_btd.scalar_type() == at::kBFloat16 &&
                   !cos_btd.requires_grad() && !sin_btd.requires_grad() && cos_btd.dim() == 3 &&
                   cos_btd.sizes() == sin_btd.sizes() && cos_btd.size(0) == x_bthd.size(0) &&
                   cos_btd.size(1) == x_bthd.size(1) && cos_btd.size(2) == x_bthd.size(3),
               "rope_bf16: needs bf16 CPU x (B, T, H, Dh) and constant bf16 cos/sin (B, T, Dh), got "
                   << x_bthd.sizes() << " and " << cos_btd.sizes());
  return RopeFn::apply(x_bthd, cos_btd, sin_btd);
}

at::Tensor silu_mul_bf16(const at::Tensor& gate, const at::Tensor& up) {
  ALPACA_CHECK(fused_cpu_bf16_applies(gate) && up.scalar_type() == at::kBFloat16 && gate.sizes() == up.sizes() &&
                   up.device().is_cpu(),
               "silu_mul_bf16: needs bf16 CPU gate and up of one shape, got " << gate.sizes() << " and " << up.sizes());
  return SiluMulFn::apply(gate, up);
}

void add_bf16_into_fp32(at::Tensor& dst, const at::Tensor& src) {
  ALPACA_CHECK(dst.is_cpu() && src.is_cpu() && dst.scalar_type() == at::kFloat && src.scalar_type() == at::kBFloat16 &&
                   dst.is_contiguous() && src.is_contiguous() && dst.numel() == src.numel(),
               "add_bf16_into_fp32: needs a contiguous CPU fp32 dst and bf16 src of as many elements, got "
                   << dst.sizes() << " " << dst.scalar_type() << " and " << src.sizes() << " " << src.scalar_type());
  float* d = dst.mutable_data_ptr<float>();
  const u16* s = bits(src);
  const RowKernels& K = row_kernels();
  ALPACA_TRACE_BYTES("alpaca::add_bf16_into_fp32", util::nbytes_of({dst, src}));
  at::parallel_for(0, dst.numel(), int64_t{1} << 16, [&](int64_t i0, int64_t i1) { K.add_bf16_rows(d + i0, s + i0, i1 - i0); });
}

namespace ring_fold {

const u16* words(const at::BFloat16* p) { return reinterpret_cast<const u16*>(p); }

void sum(float* d, const at::BFloat16* a, const at::BFloat16* b, int64_t n) {
  ALPACA_TRACE_BYTES("alpaca::ring_fold", 4 * n);
  row_kernels().sum_bf16_rows(d, words(a), words(b), n);
}
void sum(float* d, const at::BFloat16* a, const float* b, int64_t n) {
  ALPACA_TRACE_BYTES("alpaca::ring_fold", 6 * n);
  row_kernels().sum_bf16_fp32_rows(d, words(a), b, n);
}
void sum_round(at::BFloat16* d, const at::BFloat16* a, const at::BFloat16* b, float div, int64_t n) {
  ALPACA_TRACE_BYTES("alpaca::ring_fold", 4 * n);
  row_kernels().sum_round_bf16_rows(reinterpret_cast<u16*>(d), words(a), words(b), div, n);
}
void sum_round(at::BFloat16* d, const at::BFloat16* a, const float* b, float div, int64_t n) {
  ALPACA_TRACE_BYTES("alpaca::ring_fold", 6 * n);
  row_kernels().sum_round_fp32_rows(reinterpret_cast<u16*>(d), words(a), b, div, n);
}

}  // namespace ring_fold

}  // namespace alpaca::model
