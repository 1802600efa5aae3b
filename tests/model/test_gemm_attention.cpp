// The bf16 GEMM attention (model::causal_attention_bf16, src/model/attention_cpu.cpp) against a float64
// math reference computed from the same bf16 inputs, and against the path it replaces (ATen's
// scaled_dot_product_attention in bf16), forward output and dQ / dK / dV, on: causal, GQA, padding
// masks from LlamaForCausalLM::make_context (left padding, a fully padded row, packed segments),
// lengths below, at and off the 64-row block, batch > 1. Tolerances, per output tensor:
// - |ours - reference| <= 1.5% of the reference's largest magnitude. P is rounded to bf16 before
//   P V (relative 2^-9 per weight) and every output to bf16 (2^-9 of its value); the gradients
//   go through two rounded operands (P or dS, and the output's own rounding) and dS = P (dP - D)
//   cancels, so their error is a few 2^-8 of the largest value: 1.5% leaves room above the ~0.5-1%
//   measured and still fails a wrong mask, a missed block or a wrong scale (errors of 10-100%);
// - and |ours - reference| <= 2x SDPA's own |sdpa - reference| + 1 bf16 ulp of the largest value:
//   at least about as accurate as the kernel it replaces.
// The fp32 route (causal_attention_fp32) is held to fp32 tolerances against the same float64 reference
// and fp32 SDPA. The instruction-set variants of the softmax rows agree bit for bit; bf16 training
// layers take their path (its autograd node is in the graph), fp32 training layers theirs.
#include <gtest/gtest.h>

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>  // defines: torch::autograd::Node (graph_has walks it)

#include <array>
#include <cstdio>
#include <functional>
#include <set>
#include <string>

#include "alpaca/model/fused_ops.h"
#include "alpaca/model/layers.h"
#include "alpaca/model/llama.h"
#include "alpaca/model/matmul.h"
#include "alpaca/model/rope.h"
#include "bf16_gemm.h"  // src/model/, internal: the GEMM backends
#include "model_test_util.h"

namespace test_gemm_attention {

using namespace alpaca::model;

namespace {

class GemmAttention : public ::testing::Test {
 protected:
  void TearDown() override {
    set_fused_cpu_isa(best_fused_cpu_isa());
    set_gemm_attention(true);
    bf16gemm::set_backend(backend_);
  }
  const bf16gemm::Backend backend_ = bf16gemm::backend();
};

// The bf16 GEMM backends this CPU runs (bf16_gemm.h): cpublas everywhere, oneDNN's ukernel on AVX-512
// and AMX CPUs, ours with AVX512-BF16.
std::vector<bf16gemm::Backend> backends_here() {
  std::vector<bf16gemm::Backend> v;
  for (auto b : {bf16gemm::Backend::kCpublas, bf16gemm::Backend::kOnednn, bf16gemm::Backend::kOwn})
    if (bf16gemm::runs(b)) v.push_back(b);
  return v;
}

struct Case {
  int64_t b, h, hkv, t, dh;
};

struct Result {
  at::Tensor out, dq, dk, dv;
};

at::Tensor repeat_kv(const at::Tensor& x, int64_t n_rep) {
  return x.repeat_interleave(n_rep, /*dim=*/1);
}

// Runs `attn` on leaves made from q, k, v (converted to `dtype`) and backpropagates g.
Result run(const std::function<at::Tensor(at::Tensor, at::Tensor, at::Tensor)>& attn, const at::Tensor& q,
           const at::Tensor& k, const at::Tensor& v, const at::Tensor& g, at::ScalarType dtype) {
  at::Tensor ql = q.to(dtype).detach().requires_grad_(true), kl = k.to(dtype).detach().requires_grad_(true),
             vl = v.to(dtype).detach().requires_grad_(true);
  const at::Tensor out = attn(ql, kl, vl);
  const auto grads = torch::autograd::grad({out}, {ql, kl, vl}, {g.to(dtype)});
  return {out.detach(), grads[0], grads[1], grads[2]};
}

// softmax(q k^T * scale) v in float64, keys after the query or outside the mask at -inf.
at::Tensor math_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                          const at::Tensor& allow_b1tt) {
  const int64_t rep = q.size(1) / k.size(1), t = q.size(2);
  at::Tensor allow = at::ones({t, t}, at::kBool).tril().view({1, 1, t, t});
  if (allow_b1tt.defined()) allow = allow & allow_b1tt;
  const at::Tensor s = at::matmul(q, repeat_kv(k, rep).transpose(-1, -2)) * scale;
  return at::matmul(at::softmax(s.masked_fill(allow.logical_not(), -INFINITY), -1), repeat_kv(v, rep));
}

at::Tensor sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                const at::Tensor& allow_b1tt) {
  const int64_t rep = q.size(1) / k.size(1);
  if (!allow_b1tt.defined())
    return at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, true, scale, rep > 1);
  return at::scaled_dot_product_attention(q, repeat_kv(k, rep), repeat_kv(v, rep), allow_b1tt, 0.0, false, scale);
}

double max_err(const at::Tensor& got, const at::Tensor& ref) {
  return (got.to(at::kDouble) - ref.to(at::kDouble)).abs().max().item<double>();
}

// Each output's three versions side by side: (name, {ours, the path replaced, the reference}).
std::vector<std::pair<const char*, std::array<at::Tensor, 3>>> parts_of(const Result& ours, const Result& old,
                                                                        const Result& ref) {
  return {{"out", {ours.out, old.out, ref.out}},
          {"dq", {ours.dq, old.dq, ref.dq}},
          {"dk", {ours.dk, old.dk, ref.dk}},
          {"dv", {ours.dv, old.dv, ref.dv}}};
}

void expect_accurate(const Result& ours, const Result& old, const Result& ref, const std::string& what) {
  const auto parts = parts_of(ours, old, ref);
  for (const auto& [name, t] : parts) {
    const double scale = t[2].abs().max().item<double>();
    const double err = max_err(t[0], t[2]), old_err = max_err(t[1], t[2]);
    std::printf("%-28s %-3s max |ref| %.3g, error: ours %.3g (%.2f%%), SDPA %.3g (%.2f%%)\n", what.c_str(), name, scale,
                err, 100 * err / scale, old_err, 100 * old_err / scale);
    EXPECT_LE(err, 0.015 * scale) << what << " " << name << ": error " << err << " of max " << scale;
    EXPECT_LE(err, 2 * old_err + scale / 128) << what << " " << name << ": error " << err << ", SDPA's " << old_err;
  }
}

// The three runs every accuracy check compares, on random q, k, v and an output gradient in `dtype`:
// `attn`, SDPA (the path it replaces) and the float64 math reference from the same inputs.
struct Runs {
  Result ours, old, ref;
};
Runs run_three(const Case& c, at::ScalarType dtype, const at::Tensor& allow_b1tt,
               const std::function<at::Tensor(at::Tensor, at::Tensor, at::Tensor, double)>& attn) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.dh));
  const at::Tensor q = (at::randn({c.b, c.h, c.t, c.dh}) * 2).to(dtype);
  const at::Tensor k = at::randn({c.b, c.hkv, c.t, c.dh}).to(dtype);
  const at::Tensor v = at::randn({c.b, c.hkv, c.t, c.dh}).to(dtype);
  const at::Tensor g = at::randn({c.b, c.h, c.t, c.dh}).to(dtype);
  return {run([&](at::Tensor a, at::Tensor b, at::Tensor d) { return attn(a, b, d, scale); }, q, k, v, g, dtype),
          run([&](at::Tensor a, at::Tensor b, at::Tensor d) { return sdpa(a, b, d, scale, allow_b1tt); }, q, k, v, g,
              dtype),
          run([&](at::Tensor a, at::Tensor b, at::Tensor d) { return math_attention(a, b, d, scale, allow_b1tt); }, q,
              k, v, g, at::kDouble)};
}

void check_case(const Case& c, const at::Tensor& allow_b1tt, const std::string& what) {
  const Runs r = run_three(c, at::kBFloat16, allow_b1tt, [&](at::Tensor a, at::Tensor b, at::Tensor d, double scale) {
    return causal_attention_bf16(a, b, d, scale, allow_b1tt);
  });
  expect_accurate(r.ours, r.old, r.ref, what);
}

std::string name(const Case& c) {
  return "B" + std::to_string(c.b) + " H" + std::to_string(c.h) + "/" + std::to_string(c.hkv) + " T" +
         std::to_string(c.t) + " Dh" + std::to_string(c.dh);
}

TEST_F(GemmAttention, CausalAndGqaMatchTheMathReference) {
  at::manual_seed(1);
  for (const Case& c : {Case{2, 4, 4, 100, 32}, Case{1, 6, 2, 130, 64}, Case{3, 2, 1, 64, 16}, Case{2, 3, 3, 1, 8},
                        Case{1, 2, 2, 7, 64}, Case{2, 12, 12, 256, 64}})
    check_case(c, {}, name(c));
}

// Every GEMM backend this CPU runs (oneDNN's ukernel: AMX CPUs' default; ATen's cpublas: AVX2-only
// CPUs'; our AVX512-BF16 kernel), on the same cases, against the reference and each other.
TEST_F(GemmAttention, EveryGemmBackendMatchesAndTheyAgree) {
  at::manual_seed(5);
  const Case c{2, 4, 2, 75, 32};
  const at::Tensor q = at::randn({c.b, c.h, c.t, c.dh}).to(at::kBFloat16).requires_grad_(true);
  const at::Tensor k = at::randn({c.b, c.hkv, c.t, c.dh}).to(at::kBFloat16).requires_grad_(true);
  const at::Tensor v = at::randn({c.b, c.hkv, c.t, c.dh}).to(at::kBFloat16).requires_grad_(true);
  const at::Tensor g = at::randn({c.b, c.h, c.t, c.dh}).to(at::kBFloat16);
  std::vector<at::Tensor> runs;
  for (bf16gemm::Backend b : backends_here()) {
    bf16gemm::set_backend(b);
    check_case({3, 4, 2, 90, 32}, {}, bf16gemm::name(b));
    check_case({2, 6, 2, 200, 64}, {}, bf16gemm::name(b));
    const at::Tensor y = causal_attention_bf16(q, k, v, 0.25);
    const auto grads = torch::autograd::grad({y}, {q, k, v}, {g});
    runs.push_back(at::cat({y.flatten(), grads[0].flatten(), grads[1].flatten(), grads[2].flatten()}).to(at::kFloat));
  }
  // fp32 sums in another order, then the same bf16 roundings: a bf16 ulp or two apart
  for (size_t i = 1; i < runs.size(); ++i) {
    const double scale = runs[0].abs().max().item<double>();
    EXPECT_LE(max_err(runs[i], runs[0]), scale / 64) << bf16gemm::name(backends_here()[i]);
    EXPECT_GE(runs[i].eq(runs[0]).to(at::kFloat).mean().item<double>(), 0.9) << bf16gemm::name(backends_here()[i]);
  }
}

// Random bf16 bits, rows x cols (zero where keep is given and false).
std::vector<uint16_t> random_bf16(int64_t rows, int64_t cols, const std::function<bool(int64_t, int64_t)>& keep = {}) {
  const at::Tensor x = at::randn({rows, cols}).to(at::kBFloat16).contiguous();
  const auto* p = reinterpret_cast<const uint16_t*>(x.const_data_ptr<at::BFloat16>());
  std::vector<uint16_t> v(p, p + rows * cols);
  for (int64_t r = 0; r < rows && keep; ++r)
    for (int64_t c = 0; c < cols; ++c)
      if (!keep(r, c)) v[r * cols + c] = 0;
  return v;
}

// bf16gemm's packs against the layouts bf16_gemm.h states, with our AVX-512 packs (the fast backends')
// and with the loops (cpublas'), on sizes off the 16-word blocks and 32-column panels.
TEST_F(GemmAttention, PacksWriteTheStatedLayouts) {
  at::manual_seed(6);
  for (bf16gemm::Backend b : backends_here()) {
    bf16gemm::set_backend(b);
    for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{75, 24}, {33, 64}, {7, 8}, {64, 64}}) {
      const int64_t ld = cols + 6, kp = cols / 2, panel = bf16gemm::kPanel * kp;
      const std::vector<uint16_t> src = random_bf16(rows, ld);
      std::vector<uint32_t> dst(bf16gemm::panels_size(kp, rows), 0xFFFFFFFFu);
      bf16gemm::pack_cols(src.data(), ld, rows, cols, dst.data());
      int64_t wrong = 0;
      for (int64_t i = 0; i < static_cast<int64_t>(dst.size()) / kp; ++i)
        for (int64_t p = 0; p < kp; ++p) {
          const uint32_t pair = src[i * ld + 2 * p] | static_cast<uint32_t>(src[i * ld + 2 * p + 1]) << 16;
          const uint32_t want = i < rows ? pair : 0;
          wrong += dst[i / bf16gemm::kPanel * panel + p * bf16gemm::kPanel + i % bf16gemm::kPanel] != want;
        }
      std::vector<uint32_t> pairs((rows + 1) / 2 * cols);
      bf16gemm::pack_rows(src.data(), ld, rows, cols, pairs.data());
      for (int64_t p = 0; p < (rows + 1) / 2; ++p)
        for (int64_t j = 0; j < cols; ++j) {
          const uint32_t hi = 2 * p + 1 < rows ? src[(2 * p + 1) * ld + j] : 0;
          wrong += pairs[p * cols + j] != (src[2 * p * ld + j] | hi << 16);
        }
      EXPECT_EQ(wrong, 0) << bf16gemm::name(b) << ", " << rows << " x " << cols;
    }
  }
}

// The causal hints skip only work on zeros: with them, each backend gives the same values as without
// (kCols: at the columns the softmax reads), on a block of 37 queries from 64 (an odd, short block).
// Our kernel honours every hint, oneDNN's the kCols one (whole panels of rows), cpublas none.
TEST_F(GemmAttention, CausalHintsSkipOnlyZeros) {
  for (bf16gemm::Backend b : backends_here()) {
    SCOPED_TRACE(bf16gemm::name(b));
    bf16gemm::set_backend(b);
    at::manual_seed(7);
    using bf16gemm::Causal;
    const int64_t i0 = 64, rows = 37, np = 102, dh = 64, rp = (rows + 1) / 2;
    const auto seen = [&](int64_t r, int64_t key) { return key <= i0 + r; };
    const std::vector<uint16_t> p =
        random_bf16(rows + 1, np, [&](int64_t r, int64_t c) { return r < rows && seen(r, c); });
    const std::vector<uint16_t> vb = random_bf16(np, dh), q = random_bf16(rows, dh), kb = random_bf16(np, dh);
    std::vector<uint32_t> v(np / 2 * dh), pr(rp * np), qr(rp * dh), kc(bf16gemm::panels_size(dh / 2, np));
    bf16gemm::pack_rows(vb.data(), dh, np, dh, v.data());
    bf16gemm::pack_rows(p.data(), np, rows, np, pr.data());
    bf16gemm::pack_rows(q.data(), dh, rows, dh, qr.data());
    bf16gemm::pack_cols(kb.data(), dh, np, dh, kc.data());
    const auto* pw = reinterpret_cast<const uint32_t*>(p.data());
    const auto* qw = reinterpret_cast<const uint32_t*>(q.data());
    const auto run = [&](const std::function<void(float*, Causal)>& f, int64_t n, Causal hint) {
      std::vector<float> c(np * n, 0.5f);  // (dV += ...: adds to 0.5)
      f(c.data(), hint);
      return c;
    };
    using bf16gemm::rows_of, bf16gemm::panels_of;
    const auto pv = [&](float* c, Causal h) {
      bf16gemm::gemm(rows, dh, np / 2, pw, np / 2, 1, rows_of(v.data(), dh), c, dh, false, h);
    };
    const auto dv = [&](float* c, Causal h) {
      bf16gemm::gemm(np, dh, rp, pr.data(), 1, np, rows_of(qr.data(), dh), c, dh, true, h);
    };
    const auto s = [&](float* c, Causal h) {
      bf16gemm::gemm(rows, np, dh / 2, qw, dh / 2, 1, panels_of(kc.data(), dh / 2), c, np, false, h);
    };
    EXPECT_EQ(run(pv, dh, {Causal::kDepthTo, i0}), run(pv, dh, {}));
    EXPECT_EQ(run(dv, dh, {Causal::kDepthFrom, i0}), run(dv, dh, {}));
    const std::vector<float> hinted = run(s, np, {Causal::kCols, i0}), full = run(s, np, {});
    int64_t wrong = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c <= i0 + r && c < np; ++c) wrong += hinted[r * np + c] != full[r * np + c];
    EXPECT_EQ(wrong, 0);
  }
}

// The masks the trainer's batches make: LlamaForCausalLM::make_context on a padding mask / segments.
at::Tensor context_mask(int64_t b, int64_t t, const at::Tensor& attention_mask, const at::Tensor& segments) {
  LlamaForCausalLM m(alpaca::testing::llama_config({32, 16, 32, 1, 2, 2, 8}));
  const at::Tensor ids = at::zeros({b, t}, at::kLong);
  return m->make_context(ids, attention_mask, {}, segments, at::kBFloat16).attn_mask;
}

TEST_F(GemmAttention, PaddingAndPackingMasksMatchTheMathReference) {
  at::manual_seed(2);
  const int64_t t = 90;
  at::Tensor pad = at::ones({3, t}, at::kLong);
  pad[0].narrow(0, 0, 17).zero_();  // left padding: rows 0-16 see only themselves
  pad[1].narrow(0, 70, 20).zero_();  // right padding
  const at::Tensor padded = context_mask(3, t, pad, {});
  ASSERT_TRUE(padded.defined());
  EXPECT_TRUE(mask_within_causal(padded));
  check_case({3, 4, 2, t, 32}, padded, "padding");
  at::Tensor seg = at::zeros({2, t}, at::kLong);
  seg[0].narrow(0, 30, 60).fill_(1);
  seg[1].narrow(0, 65, 25).fill_(1);
  const at::Tensor packed = context_mask(2, t, {}, seg);
  EXPECT_TRUE(mask_within_causal(packed));
  check_case({2, 4, 4, t, 32}, packed, "packed segments");
}

// Output and gradients of `attn` on random (2, 4 / 2, 75, 24) inputs in `dtype` with a padding mask are
// the same bits under every instruction set of the softmax rows.
void expect_isa_variants_agree(at::ScalarType dtype, uint64_t seed,
                               const std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                              const at::Tensor&)>& attn) {
  at::manual_seed(seed);
  const at::Tensor q = at::randn({2, 4, 75, 24}).to(dtype).requires_grad_(true);
  const at::Tensor k = at::randn({2, 2, 75, 24}).to(dtype).requires_grad_(true);
  const at::Tensor v = at::randn({2, 2, 75, 24}).to(dtype).requires_grad_(true);
  const at::Tensor g = at::randn({2, 4, 75, 24}).to(dtype);
  at::Tensor pad = at::ones({2, 75}, at::kLong);
  pad[1].narrow(0, 0, 9).zero_();
  const at::Tensor mask = context_mask(2, 75, pad, {});
  at::Tensor first;
  for (int i = 0; i <= static_cast<int>(best_fused_cpu_isa()); ++i) {
    set_fused_cpu_isa(static_cast<FusedCpuIsa>(i));
    const at::Tensor y = attn(q, k, v, mask);
    const auto grads = torch::autograd::grad({y}, {q, k, v}, {g});
    const at::Tensor all = at::cat({y.flatten(), grads[0].flatten(), grads[1].flatten(), grads[2].flatten()});
    if (!first.defined()) first = all;
    EXPECT_TRUE(at::equal(all, first)) << "isa " << i;
  }
}

TEST_F(GemmAttention, InstructionSetVariantsAgreeBitForBit) {
  expect_isa_variants_agree(at::kBFloat16, 3, [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                 const at::Tensor& m) { return causal_attention_bf16(q, k, v, 0.2, m); });
}

bool graph_has(const torch::autograd::Node* node, const std::string& what, std::set<const void*>& seen) {
  if (node == nullptr || !seen.insert(node).second) return false;
  if (node->name().find(what) != std::string::npos) return true;
  for (const auto& e : node->next_edges())
    if (graph_has(e.function.get(), what, seen)) return true;
  return false;
}

TEST_F(GemmAttention, TrainingLayersTakeTheirDtypesRoute) {
  at::manual_seed(4);
  const LlamaConfig cfg = alpaca::testing::llama_config({32, 64, 160, 1, 4, 2, 16});
  for (at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
    LlamaAttention attn(cfg, at::TensorOptions().dtype(dtype));
    {
      at::NoGradGuard no_grad;
      for (auto& p : attn->parameters()) p.copy_(at::randn(p.sizes()) * 0.2);
    }
    LayerContext ctx;
    std::tie(ctx.cos, ctx.sin) = rope_cos_sin(cfg, at::arange(20).unsqueeze(0).expand({2, 20}), dtype);
    const at::Tensor x = at::randn({2, 20, 64}).to(dtype);
    std::set<const void*> seen;
    const bool taken = graph_has(attn->forward(x, ctx).grad_fn().get(), "GemmAttentionFn", seen);
    // Only where fast products run (ours, oneDNN's on AMX; elsewhere SDPA is as fast): try cpublas too.
    EXPECT_EQ(taken, dtype == at::kBFloat16 && bf16gemm::fast()) << dtype;
    seen.clear();
    // fp32, and bf16 where its products go through fp32 (an AVX2-only CPU, or capped) and the bf16 route did not.
    const bool via_fp32 = dtype == at::kBFloat16 && !taken && cpu_bf16_gemm() == CpuBf16Gemm::kFp32;
    EXPECT_EQ(graph_has(attn->forward(x, ctx).grad_fn().get(), "GemmAttentionF32Fn", seen),
              dtype == at::kFloat || via_fp32) << dtype;
    if (dtype == at::kBFloat16 && bf16gemm::fast()) {
      bf16gemm::set_backend(bf16gemm::Backend::kCpublas);
      seen.clear();
      EXPECT_FALSE(graph_has(attn->forward(x, ctx).grad_fn().get(), "GemmAttentionFn", seen));
      bf16gemm::set_backend(backend_);
    }
    {
      // An activation-checkpointed layer's first forward (no grad, in a TrainingForwardScope: the FSDP
      // engine's checkpoint) takes the routes its recompute in backward takes: the same bits.
      const at::Tensor with_grad = attn->forward(x, ctx).detach();
      TrainingForwardScope training;
      at::NoGradGuard no_grad;
      EXPECT_TRUE(at::equal(attn->forward(x, ctx), with_grad)) << dtype;
    }
    set_gemm_attention(false);  // ALPACA_CPU_ATTN=0: the SDPA path again
    seen.clear();
    EXPECT_FALSE(graph_has(attn->forward(x, ctx).grad_fn().get(), "GemmAttention", seen));
    set_gemm_attention(true);
    set_fused_cpu_bf16(false);  // ALPACA_CPU_FUSED=0: likewise
    seen.clear();
    EXPECT_FALSE(graph_has(attn->forward(x, ctx).grad_fn().get(), "GemmAttention", seen));
    set_fused_cpu_bf16(true);
  }
}

// The fp32 route (causal_attention_fp32) against the float64 reference from the same fp32 inputs and
// against ATen's fp32 SDPA (flash): every output within 1e-5 of the reference's largest magnitude
// (fp32 products and sums over <= 130 keys: ~1e-6 measured; a wrong mask, block or scale is off by
// 10-100%) and within 4x SDPA's own error + 2e-6 of it.
void check_case_f32(const Case& c, const at::Tensor& allow_b1tt, const std::string& what) {
  const Runs r = run_three(c, at::kFloat, allow_b1tt, [&](at::Tensor a, at::Tensor b, at::Tensor d, double scale) {
    return causal_attention_fp32(a, b, d, scale, allow_b1tt);
  });
  for (const auto& [part, t] : parts_of(r.ours, r.old, r.ref)) {
    const double big = t[2].abs().max().item<double>();
    const double err = max_err(t[0], t[2]), old_err = max_err(t[1], t[2]);
    std::printf("fp32 %-23s %-3s max |ref| %.3g, error: ours %.3g, SDPA %.3g\n", what.c_str(), part, big, err, old_err);
    EXPECT_LE(err, 1e-5 * big) << what << " " << part;
    EXPECT_LE(err, 4 * old_err + 2e-6 * big) << what << " " << part << ": SDPA's " << old_err;
  }
}

TEST_F(GemmAttention, Fp32RouteMatchesTheMathReference) {
  at::manual_seed(5);
  for (const Case& c : std::vector<Case>{{1, 2, 2, 1, 16}, {2, 4, 4, 64, 32}, {1, 4, 2, 130, 64}, {2, 6, 2, 37, 24},
                                         {1, 2, 1, 65, 15}}) {
    check_case_f32(c, {}, name(c));
  }
  const int64_t t = 90;
  at::Tensor pad = at::ones({3, t}, at::kLong);
  pad[0].narrow(0, 0, 17).zero_();
  pad[1].narrow(0, 70, 20).zero_();
  check_case_f32({3, 4, 2, t, 32}, context_mask(3, t, pad, {}), "padding");
  at::Tensor seg = at::zeros({2, t}, at::kLong);
  seg[0].narrow(0, 30, 60).fill_(1);
  check_case_f32({2, 4, 4, t, 32}, context_mask(2, t, {}, seg), "packed segments");
}

TEST_F(GemmAttention, Fp32InstructionSetVariantsAgreeBitForBit) {
  expect_isa_variants_agree(at::kFloat, 6, [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                              const at::Tensor& m) { return causal_attention_fp32(q, k, v, 0.2, m); });
}

// bf16 training where bf16 products go through fp32 (matmul.h's kFp32: AVX2-only CPUs; chosen here):
// causal_attention_fp32 on bf16 q, k, v replaces ATen's fp32 flash kernel on their upcasts
// (attention_via_fp32). Both compute in fp32 and round once: within one bf16 ulp of the largest value
// of each other, and within 1% of the float64 reference; the training layer takes the new route.
TEST_F(GemmAttention, Bf16ViaFp32ReplacesTheFlashRoute) {
  const CpuBf16Gemm was = cpu_bf16_gemm();
  set_cpu_bf16_gemm(CpuBf16Gemm::kFp32);
  at::manual_seed(8);
  const int64_t t = 90;
  at::Tensor pad = at::ones({2, t}, at::kLong);
  pad[0].narrow(0, 0, 17).zero_();
  for (const at::Tensor& mask : {at::Tensor(), context_mask(2, t, pad, {})}) {
    const Case c{2, 4, 2, t, 32};
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.dh));
    const at::Tensor q = (at::randn({c.b, c.h, c.t, c.dh}) * 2).to(at::kBFloat16);
    const at::Tensor k = at::randn({c.b, c.hkv, c.t, c.dh}).to(at::kBFloat16);
    const at::Tensor v = at::randn({c.b, c.hkv, c.t, c.dh}).to(at::kBFloat16);
    const at::Tensor g = at::randn({c.b, c.h, c.t, c.dh}).to(at::kBFloat16);
    const auto ours = run([&](at::Tensor a, at::Tensor b, at::Tensor d) {
      return causal_attention_fp32(a, b, d, scale, mask);
    }, q, k, v, g, at::kBFloat16);
    const auto old = run([&](at::Tensor a, at::Tensor b, at::Tensor d) {
      return attention_via_fp32(a, b, d, mask, /*is_causal=*/!mask.defined(), scale);
    }, q, k, v, g, at::kBFloat16);
    const auto ref = run([&](at::Tensor a, at::Tensor b, at::Tensor d) { return math_attention(a, b, d, scale, mask); },
                         q, k, v, g, at::kDouble);
    EXPECT_EQ(ours.out.scalar_type(), at::kBFloat16);
    EXPECT_EQ(ours.dk.scalar_type(), at::kBFloat16);
    const auto parts = parts_of(ours, old, ref);
    for (const auto& [part, tr] : parts) {
      const double big = tr[2].abs().max().item<double>();
      EXPECT_LE(max_err(tr[0], tr[1]), big / 128) << part << (mask.defined() ? " (mask)" : "");
      EXPECT_LE(max_err(tr[0], tr[2]), 0.01 * big) << part << (mask.defined() ? " (mask)" : "");
    }
  }
  const LlamaConfig cfg = alpaca::testing::llama_config({32, 64, 160, 1, 4, 2, 16});
  LlamaAttention attn(cfg, at::TensorOptions().dtype(at::kBFloat16));
  LayerContext ctx;
  std::tie(ctx.cos, ctx.sin) = rope_cos_sin(cfg, at::arange(20).unsqueeze(0).expand({2, 20}), at::kBFloat16);
  const at::Tensor x = at::randn({2, 20, 64}).to(at::kBFloat16);
  std::set<const void*> seen;
  const bool fast_bf16 = bf16gemm::fast();  // there the bf16 route comes first
  EXPECT_EQ(graph_has(attn->forward(x, ctx).grad_fn().get(), "GemmAttentionF32Fn", seen), !fast_bf16);
  set_cpu_bf16_gemm(was);
}

TEST_F(GemmAttention, MasksReachingLaterKeysAndBadInputsAreRefused) {
  at::Tensor upper = at::ones({1, 1, 5, 5}, at::kBool);  // every query sees every key
  EXPECT_FALSE(mask_within_causal(upper));
  EXPECT_TRUE(mask_within_causal(upper.tril()));
  EXPECT_TRUE(mask_within_causal({}));
  const at::Tensor f = at::randn({1, 2, 5, 8});
  EXPECT_THROW(causal_attention_bf16(f, f, f, 0.3), std::exception);  // fp32
  EXPECT_THROW(causal_attention_fp32(f.to(at::kBFloat16), f, f, 0.3), std::exception);
  EXPECT_THROW(causal_attention_fp32(f, at::randn({1, 3, 5, 8}), at::randn({1, 3, 5, 8}), 0.3), std::exception);
  const at::Tensor q = f.to(at::kBFloat16), k3 = at::randn({1, 3, 5, 8}).to(at::kBFloat16);
  EXPECT_THROW(causal_attention_bf16(q, k3, k3, 0.3), std::exception);  // 2 heads over 3 KV heads
  EXPECT_THROW(causal_attention_bf16(q, q, q, 0.3, at::ones({1, 1, 4, 4}, at::kBool)), std::exception);
}

}  // namespace

}  // namespace test_gemm_attention
