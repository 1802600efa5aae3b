// The fused bf16 CPU kernels (model/fused_ops.h) against the module path they replace, forward and
// backward, on every instruction-set variant this CPU runs:
// - RoPE: bit for bit (same roundings in the same places);
// - SiLU*mul: each output the module path's value or its bf16 neighbour (our exp and Sleef's differ
//   in the last fp32 bit), and at least 99% of them identical;
// - RMSNorm: forward likewise (fp32 sums in another order), gradients within 2 bf16 ulps of the
//   module path's plus 1e-3 of their largest magnitude (the module path rounds its own way too);
// - the variants agree with each other bit for bit;
// - a bf16 decoder layer's output and gradients match the module path's within bf16 tolerance;
// - fp32 never takes them (the fp32 parity tests need the module path's exact numbers);
// - under ALPACA_CPU_ISA=avx2 (ctest runs this file and the attention / decode tests a second time
//   so, *_avx2) every dispatcher sees an AVX2-only CPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include <torch/csrc/autograd/autograd.h>

#include "alpaca/model/config.h"
#include "alpaca/model/fused_ops.h"
#include "alpaca/model/layers.h"
#include "alpaca/model/matmul.h"
#include "alpaca/model/rope.h"
#include "alpaca/util/cpu_features.h"
#include "model_test_util.h"

namespace test_fused_ops {

using namespace alpaca::model;

namespace {

std::vector<FusedCpuIsa> isas() {
  std::vector<FusedCpuIsa> out;
  for (int i = 0; i <= static_cast<int>(best_fused_cpu_isa()); ++i) out.push_back(static_cast<FusedCpuIsa>(i));
  return out;
}

class FusedOps : public ::testing::Test {
 protected:
  void TearDown() override {
    set_fused_cpu_isa(best_fused_cpu_isa());
    set_fused_cpu_bf16(true);
  }
};

at::Tensor bf16_randn(at::IntArrayRef sizes, double scale = 1.0) {
  return (at::randn(sizes) * scale).to(at::kBFloat16).requires_grad_(true);
}

// Distance in units of the bf16 spacing at the reference value.
at::Tensor ulps(const at::Tensor& got, const at::Tensor& ref) {
  const at::Tensor r = ref.to(at::kFloat);
  const at::Tensor ulp = at::pow(2.0, at::floor(at::log2(r.abs().clamp_min(1e-30))) - 7);
  return (got.to(at::kFloat) - r).abs() / ulp;
}

void expect_close_bf16(const at::Tensor& got, const at::Tensor& ref, const char* what) {
  const at::Tensor diff = (got.to(at::kFloat) - ref.to(at::kFloat)).abs();
  const double floor = 1e-3 * ref.to(at::kFloat).abs().max().item<double>();
  const at::Tensor allowed = 2 * at::pow(2.0, at::floor(at::log2(ref.to(at::kFloat).abs().clamp_min(1e-30))) - 7) + floor;
  EXPECT_TRUE((diff <= allowed).all().item<bool>()) << what << ": max diff " << diff.max().item<double>();
}

TEST_F(FusedOps, RopeIsTheModulePathBitForBit) {
  at::manual_seed(1);
  for (int64_t dh : {8, 64, 40}) {  // halves below, at and off the 16-lane width
    const at::Tensor x = bf16_randn({2, 5, 3, dh}, 3.0);
    const at::Tensor cos = at::rand({2, 5, dh}).mul(2).sub(1).to(at::kBFloat16);
    const at::Tensor sin = at::rand({2, 5, dh}).mul(2).sub(1).to(at::kBFloat16);
    const at::Tensor g = at::randn({2, 3, 5, dh}).to(at::kBFloat16);
    const at::Tensor ref = apply_rope(x.transpose(1, 2), cos, sin);
    const at::Tensor ref_grad = torch::autograd::grad({ref}, {x}, {g})[0];
    for (FusedCpuIsa isa : isas()) {
      set_fused_cpu_isa(isa);
      const at::Tensor y = rope_bf16(x, cos, sin).transpose(1, 2);
      EXPECT_TRUE(at::equal(y, ref)) << "isa " << static_cast<int>(isa) << " dh " << dh;
      EXPECT_TRUE(at::equal(torch::autograd::grad({y}, {x}, {g})[0], ref_grad)) << "isa " << static_cast<int>(isa);
    }
  }
}

TEST_F(FusedOps, SiluMulIsTheModulePathWithinOneUlp) {
  at::manual_seed(2);
  const at::Tensor a = bf16_randn({3, 7, 70}, 4.0), b = bf16_randn({3, 7, 70}, 2.0);
  const at::Tensor g = at::randn({3, 7, 70}).to(at::kBFloat16);
  const at::Tensor ref = at::silu(a) * b;
  const auto ref_grads = torch::autograd::grad({ref}, {a, b}, {g});
  at::Tensor first;
  std::vector<at::Tensor> first_grads;
  for (FusedCpuIsa isa : isas()) {
    set_fused_cpu_isa(isa);
    const at::Tensor y = silu_mul_bf16(a, b);
    const auto grads = torch::autograd::grad({y}, {a, b}, {g});
    const std::vector<std::pair<at::Tensor, at::Tensor>> pairs = {{y, ref}, {grads[0], ref_grads[0]}, {grads[1], ref_grads[1]}};
    for (const auto& [got, want] : pairs) {
      EXPECT_LE(ulps(got, want).max().item<double>(), 1.0);
      EXPECT_GE(got.eq(want).to(at::kFloat).mean().item<double>(), 0.99);
    }
    if (!first.defined()) {
      first = y;
      first_grads = {grads[0], grads[1]};
    } else {  // every instruction-set variant computes the same bits
      EXPECT_TRUE(at::equal(y, first) && at::equal(grads[0], first_grads[0]) && at::equal(grads[1], first_grads[1]));
    }
  }
}

TEST_F(FusedOps, RmsNormIsTheModulePathWithinBf16Rounding) {
  at::manual_seed(3);
  for (int64_t d : {64, 100}) {
    RMSNorm norm(d, 1e-5, at::TensorOptions().dtype(at::kBFloat16));
    {
      at::NoGradGuard no_grad;
      norm->weight.copy_(at::rand({d}).add(0.5));
    }
    const at::Tensor x = bf16_randn({4, 9, d}, 2.0);
    const at::Tensor g = at::randn({4, 9, d}).to(at::kBFloat16);
    set_fused_cpu_bf16(false);
    const at::Tensor ref = norm->forward(x);
    const auto ref_grads = torch::autograd::grad({ref}, {x, norm->weight}, {g});
    set_fused_cpu_bf16(true);
    at::Tensor first;
    for (FusedCpuIsa isa : isas()) {
      set_fused_cpu_isa(isa);
      const at::Tensor y = norm->forward(x);  // the module takes the kernel
      const auto grads = torch::autograd::grad({y}, {x, norm->weight}, {g});
      EXPECT_LE(ulps(y, ref).max().item<double>(), 1.0);
      EXPECT_GE(y.eq(ref).to(at::kFloat).mean().item<double>(), 0.99);
      expect_close_bf16(grads[0], ref_grads[0], "dx");
      expect_close_bf16(grads[1], ref_grads[1], "dweight");
      if (!first.defined()) first = at::cat({y.flatten(), grads[0].flatten(), grads[1].flatten()});
      EXPECT_TRUE(at::equal(at::cat({y.flatten(), grads[0].flatten(), grads[1].flatten()}), first));
    }
  }
}

LlamaConfig tiny_config() { return alpaca::testing::llama_config({32, 64, 160, 1, 4, 2, 16}); }

TEST_F(FusedOps, Bf16DecoderLayerMatchesTheModulePath) {
  at::manual_seed(4);
  const LlamaConfig cfg = tiny_config();
  LlamaDecoderLayer layer(cfg, at::TensorOptions().dtype(at::kBFloat16));
  {
    at::NoGradGuard no_grad;
    for (auto& p : layer->parameters()) p.copy_(at::randn(p.sizes()).mul(p.dim() == 1 ? 0.1 : 0.1).add(p.dim() == 1 ? 1 : 0));
  }
  const at::Tensor x = bf16_randn({2, 12, cfg.hidden_size});
  LayerContext ctx;
  std::tie(ctx.cos, ctx.sin) = rope_cos_sin(cfg, at::arange(12).unsqueeze(0).expand({2, 12}), at::kBFloat16);
  std::vector<at::Tensor> inputs = {x};
  for (auto& p : layer->parameters()) inputs.push_back(p);
  auto run = [&] {
    const at::Tensor y = layer->forward(x, ctx);
    const at::Tensor loss = y.to(at::kFloat).pow(2).sum();
    std::vector<at::Tensor> out = torch::autograd::grad({loss}, inputs);
    out.insert(out.begin(), y);
    return out;
  };
  set_fused_cpu_bf16(false);
  const auto ref = run();
  set_fused_cpu_bf16(true);
  const auto got = run();
  for (size_t i = 0; i < ref.size(); ++i) {
    const double scale = ref[i].to(at::kFloat).abs().max().item<double>();
    const double err = (got[i].to(at::kFloat) - ref[i].to(at::kFloat)).abs().max().item<double>();
    EXPECT_LE(err, 0.02 * scale) << "output/gradient " << i;
  }
}

// The reduce-scatter ring's folds (dist's MPI backend): the ATen ops they replace (upcast copy_,
// add_, finish_avg's div_, the rounding copy_) bit for bit, on every variant, lengths around the vector
// widths, with signed zeros, infinities, NaN and subnormals, dividing by 1 (a sum), 2 and 3, in place
// (a NaN result is NaN; its bf16 encoding is not compared).
TEST_F(FusedOps, RingFoldsAreTheAtenOpsBitForBit) {
  at::manual_seed(5);
  // Pairs (bf16, fp32) whose sum divided by 3 rounds to another bf16 than the sum times 1/3 does (~1 in
  // 2^19): a division done another way than ATen's div_ shows in these.
  const at::Tensor pa = (at::randn({1 << 23}) * 1e3).to(at::kBFloat16), pb = at::randn({1 << 23}) * 1e3;
  const at::Tensor psum = pa.to(at::kFloat) + pb;
  const at::Tensor hard = at::nonzero(psum.div(3).to(at::kBFloat16).ne(psum.mul(1.0f / 3).to(at::kBFloat16))).view(-1);
  ASSERT_GE(hard.numel(), 4) << "too few rounding-sensitive pairs to test the division";
  for (int64_t n : {1, 15, 16, 17, 33, 1000}) {
    at::Tensor a = (at::randn({n}) * 1e3).to(at::kBFloat16), b = (at::randn({n}) * 1e3).to(at::kBFloat16);
    at::Tensor b32 = at::randn({n}) * 1e3;
    if (n == 1000) {
      const int64_t k = std::min<int64_t>(hard.numel(), 500);
      a.narrow(0, 500, k).copy_(pa.index({hard.narrow(0, 0, k)}));
      b32.narrow(0, 500, k).copy_(pb.index({hard.narrow(0, 0, k)}));
    }
    if (n > 8) {
      a[0] = -0.0, b[0] = -0.0;
      a[1] = std::numeric_limits<float>::infinity(), b[1] = -std::numeric_limits<float>::infinity();
      a[2] = std::numeric_limits<float>::quiet_NaN();
      a[3] = 1e-40, b[3] = -3e-40;  // subnormals
      b[4] = std::numeric_limits<float>::quiet_NaN();
    }
    for (FusedCpuIsa isa : isas()) {
      set_fused_cpu_isa(isa);
      const std::string where = "isa " + std::to_string(static_cast<int>(isa)) + " n " + std::to_string(n);
      for (const at::Tensor& other : {b, b32}) {
        const at::Tensor ref = a.to(at::kFloat).add_(other.to(at::kFloat));
        at::Tensor got = at::empty({n});
        if (other.scalar_type() == at::kBFloat16) {
          ring_fold::sum(got.data_ptr<float>(), a.const_data_ptr<at::BFloat16>(), other.const_data_ptr<at::BFloat16>(), n);
        } else {
          ring_fold::sum(got.data_ptr<float>(), a.const_data_ptr<at::BFloat16>(), other.const_data_ptr<float>(), n);
        }
        EXPECT_EQ(std::memcmp(got.data_ptr(), ref.data_ptr(), n * 4), 0) << where;
        for (int div : {1, 2, 3}) {
          at::Tensor acc = ref.clone();
          if (div > 1) acc.div_(div);
          const at::Tensor want = acc.to(at::kBFloat16);
          for (bool in_place : {false, true}) {
            at::Tensor own = a.clone();
            at::Tensor out = in_place ? own : at::empty({n}, at::kBFloat16);
            auto* d = out.data_ptr<at::BFloat16>();
            if (other.scalar_type() == at::kBFloat16) {
              ring_fold::sum_round(d, own.const_data_ptr<at::BFloat16>(), other.const_data_ptr<at::BFloat16>(), div, n);
            } else {
              ring_fold::sum_round(d, own.const_data_ptr<at::BFloat16>(), other.const_data_ptr<float>(), div, n);
            }
            // NaN may be encoded either way: ATen's vectorised rounding writes 0xFFFF, its scalar tail and
            // ours c10's 0x7FC0.
            const at::Tensor same = out.view(at::kShort).eq(want.view(at::kShort)) | (out.isnan() & want.isnan());
            EXPECT_TRUE(same.all().item<bool>()) << where << " div " << div << " in place " << in_place;
          }
        }
      }
    }
  }
}

TEST(CpuIsaCap, EveryDispatcherSeesTheCap) {
  using alpaca::cpu::Feature;
  namespace cpu = alpaca::cpu;
  const char* env = std::getenv("ALPACA_CPU_ISA");
  const std::string cap = env != nullptr && *env != '\0' ? env : "native";
  EXPECT_EQ(cpu::isa_cap(), cap);
  if (cap == "native") {
    EXPECT_EQ(cpu::model_name().find("capped"), std::string::npos);
#if defined(__x86_64__)
    EXPECT_EQ(cpu::has(Feature::kAvx512f), __builtin_cpu_supports("avx512f") != 0);
    EXPECT_EQ(cpu::has(Feature::kAvx512bf16), __builtin_cpu_supports("avx512bf16") != 0);
#endif
    return;
  }
  EXPECT_NE(cpu::model_name().find("capped at " + cap), std::string::npos) << cpu::model_name();
  for (Feature f : {Feature::kAvx512f, Feature::kAvx512bw, Feature::kAvx512bf16, Feature::kAmxBf16})
    EXPECT_FALSE(cpu::has(f));
  EXPECT_LE(static_cast<int>(best_fused_cpu_isa()), static_cast<int>(cap == "avx2" ? FusedCpuIsa::kAvx2 : FusedCpuIsa::kBaseline));
  // An AVX2-only CPU has no bf16 dot product: bf16 GEMMs run on fp32 upcasts (matmul.h).
  EXPECT_FALSE(cpu_has_native_bf16());
  EXPECT_EQ(cpu_bf16_gemm(), CpuBf16Gemm::kFp32);
}

// attention_via_fp32 (matmul.h, what bf16 attention runs on a CPU without native bf16): ATen's flash
// kernel in fp32 on the operands' exact upcasts, output and gradients rounded to bf16 once. So each
// is within one bf16 rounding (2^-8 relative, i.e. a bf16 ulp) of a float64 reference, plus 1e-5 of
// the largest value for the fp32 sums; causal with GQA, and a left-padding mask.
TEST(Fp32Attention, IsTheFloat64AttentionRoundedOnce) {
  const CpuBf16Gemm saved = cpu_bf16_gemm();
  set_cpu_bf16_gemm(CpuBf16Gemm::kFp32);
  at::manual_seed(11);
  const int64_t b = 2, h = 4, t = 37, d = 16;
  for (const bool masked : {false, true}) {
    SCOPED_TRACE(masked ? "padding mask, MHA" : "causal, GQA 4/2");
    const int64_t hkv = masked ? 4 : 2, n_rep = h / hkv;
    const at::Tensor q = at::randn({b, h, t, d}).to(at::kBFloat16).requires_grad_(true);
    const at::Tensor k = at::randn({b, hkv, t, d}).to(at::kBFloat16).requires_grad_(true);
    const at::Tensor v = at::randn({b, hkv, t, d}).to(at::kBFloat16).requires_grad_(true);
    const at::Tensor i = at::arange(t).view({t, 1}), j = at::arange(t).view({1, t});
    const at::Tensor pad = at::tensor({0, 5}).view({b, 1, 1, 1});  // the second row's first 5 keys are padding
    const at::Tensor allow = ((j <= i).view({1, 1, t, t}) & (j.view({1, 1, 1, t}) >= pad)) | (i == j).view({1, 1, t, t});
    const double scale = 0.25;
    const at::Tensor dout = at::randn({b, h, t, d}).to(at::kBFloat16);
    const at::Tensor out = attention_via_fp32(q, k, v, masked ? allow : at::Tensor(), !masked, scale);
    const auto got = torch::autograd::grad({out}, {q, k, v}, {dout});
    // float64 reference: softmax(q k^T * scale, masked) v, the key/value heads repeated.
    std::vector<at::Tensor> in64;
    for (const auto& x : {q, k, v}) in64.push_back(x.detach().to(at::kDouble).requires_grad_(true));
    auto rep = [&](const at::Tensor& x) { return x.repeat_interleave(n_rep, 1); };
    const at::Tensor keep = masked ? allow : (j <= i).view({1, 1, t, t});
    const at::Tensor scores = at::matmul(in64[0], rep(in64[1]).transpose(-1, -2)).mul(scale).masked_fill(keep.logical_not(), -INFINITY);
    const at::Tensor ref = at::matmul(at::softmax(scores, -1), rep(in64[2]));
    const auto ref_grads = torch::autograd::grad({ref}, in64, {dout.to(at::kDouble)});
    auto expect_one_rounding = [](const at::Tensor& g, const at::Tensor& r, const char* what) {
      const at::Tensor diff = (g.to(at::kDouble) - r).abs();
      const at::Tensor allowed = r.abs() * std::ldexp(1.0, -8) + 1e-5 * r.abs().max();
      EXPECT_TRUE((diff <= allowed).all().item<bool>()) << what << ": max diff " << diff.max().item<double>();
    };
    expect_one_rounding(out, ref.detach(), "output");
    expect_one_rounding(got[0], ref_grads[0], "dq");
    expect_one_rounding(got[1], ref_grads[1], "dk");
    expect_one_rounding(got[2], ref_grads[2], "dv");
  }
  set_cpu_bf16_gemm(saved);
}

// The fp32 route converts a boolean mask to its float form once per mask (every layer of a
// micro-batch passes the same tensor): a call with the same mask reuses it, a mask changed in place
// or another mask is converted again, so each result is what a fresh conversion gives.
TEST(Fp32Attention, MaskConversionFollowsTheMask) {
  const CpuBf16Gemm saved = cpu_bf16_gemm();
  set_cpu_bf16_gemm(CpuBf16Gemm::kFp32);
  at::manual_seed(12);
  const int64_t b = 2, h = 2, t = 9, d = 8;
  const at::Tensor q = at::randn({b, h, t, d}).to(at::kBFloat16), k = at::randn({b, h, t, d}).to(at::kBFloat16);
  const at::Tensor v = at::randn({b, h, t, d}).to(at::kBFloat16);
  const at::Tensor causal = at::ones({t, t}, at::kBool).tril().view({1, 1, t, t});
  at::Tensor mask = causal.repeat({b, 1, 1, 1});
  const auto fresh = [&](const at::Tensor& m) { return attention_via_fp32(q, k, v, m.clone(), false, 0.3); };
  const at::Tensor first = attention_via_fp32(q, k, v, mask, false, 0.3);
  EXPECT_TRUE(at::equal(attention_via_fp32(q, k, v, mask, false, 0.3), first));
  mask.index_put_({1, 0, at::indexing::Slice(), at::indexing::Slice(0, 3)}, false);  // padding, in place
  mask.index_put_({1, 0, at::indexing::Slice(0, 3), 0}, true);                       // (no empty row)
  const at::Tensor changed = attention_via_fp32(q, k, v, mask, false, 0.3);
  EXPECT_FALSE(at::equal(changed, first));
  EXPECT_TRUE(at::equal(changed, fresh(mask)));
  EXPECT_TRUE(at::equal(attention_via_fp32(q, k, v, causal, false, 0.3), fresh(causal)));
  set_cpu_bf16_gemm(saved);
}

TEST_F(FusedOps, Fp32KeepsTheModulePath) {
  at::manual_seed(5);
  EXPECT_FALSE(fused_cpu_bf16_applies(at::zeros({2}, at::kFloat)));
  RMSNorm norm(32, 1e-6, at::TensorOptions().dtype(at::kFloat));
  const at::Tensor x = at::randn({3, 32}, at::kFloat);
  const at::Tensor h = x * at::rsqrt(x.pow(2).mean(-1, true) + 1e-6);
  EXPECT_TRUE(at::equal(norm->forward(x), norm->weight * h));
}

}  // namespace

}  // namespace test_fused_ops
