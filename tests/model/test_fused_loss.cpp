// The fused chunked head loss (causal_lm_head_loss_sum) against the plain path (logits, then
// causal_lm_loss_sum), and the CPU bf16 GEMM policy (matmul.h) against the native kernels.
// Tolerances: fp32 loss 1e-6 rel, gradients 1e-5 of their max; bf16 against the fp32 reference
// 2e-2 rel (a bf16 rounding of the logits and gradients).
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <utility>

#include "alpaca/model/fused_ops.h"
#include "alpaca/model/loss.h"
#include "alpaca/model/loss_gemm.h"
#include "alpaca/model/matmul.h"
#include "bf16_gemm.h"  // src/model/, internal: the GEMM backends
#include "loss_rows.h"  // src/model/, internal: the lm_head gradient's accumulation

namespace test_fused_loss {

using namespace alpaca::model;

namespace {

struct Case {
  at::Tensor h, w, labels;
};

// (B, T, D) hidden, (V, D) weight, labels with ignored prompt positions, an ignored tail and one
// row that is ignored throughout (as Alpaca's masked prompts and right padding).
Case make_case(at::ScalarType dtype, int64_t b = 3, int64_t t = 37, int64_t d = 16, int64_t v = 101) {
  at::manual_seed(7);
  Case c;
  c.h = at::randn({b, t, d}).to(dtype);
  c.w = (at::randn({v, d}) * 0.5).to(dtype);
  c.labels = at::randint(0, v, {b, t}, at::kLong);
  c.labels.index_put_({0, at::indexing::Slice(0, 9)}, kIgnoreIndex);
  c.labels.index_put_({1, at::indexing::Slice(30, at::indexing::None)}, kIgnoreIndex);
  c.labels.index_put_({2}, kIgnoreIndex);
  return c;
}

struct Result {
  double loss;
  int64_t count;
  at::Tensor grad_h, grad_w;
};

Result run(const Case& c, bool fused, int64_t chunk = 0, double grad_scale = 0.37) {
  at::Tensor h = c.h.detach().clone().requires_grad_(true);
  at::Tensor w = c.w.detach().clone().requires_grad_(true);
  LossSum ls = fused ? causal_lm_head_loss_sum(h, w, c.labels, chunk)
                     : causal_lm_loss_sum(alpaca::model::linear(h, w), c.labels);
  (ls.sum * grad_scale).backward();
  return {ls.sum.item<double>(), ls.num_tokens, h.grad().to(at::kFloat), w.grad().to(at::kFloat)};
}

double rel_max(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(b.abs().max().item<double>(), 1e-30);
}

class ModeGuard {
 public:
  explicit ModeGuard(CpuBf16Gemm m) : saved_(cpu_bf16_gemm()) { set_cpu_bf16_gemm(m); }
  ~ModeGuard() { set_cpu_bf16_gemm(saved_); }

 private:
  CpuBf16Gemm saved_;
};

}  // namespace

// Label smoothing (transformers' LabelSmoother: (1 - e) nll + e mean_v(-log p)) and TRL's DFT
// (nll * p, p detached), fused, against those formulas on the full logits with autograd: fp32 to
// 1e-6 (loss) / 1e-5 (gradients), every chunking, the fp32 padded-row path included (V = 101); bf16
// logits within 2e-2 of fp32.
TEST(FusedLoss, LabelSmoothingAndDftMatchTheirFormulas) {
  for (const bool dft : {false, true}) {
    SCOPED_TRACE(dft ? "dft" : "label smoothing 0.1");
    LossOptions o;
    o.dft = dft;
    o.label_smoothing = dft ? 0.0 : 0.1;
    const Case c = make_case(at::kFloat);
    at::Tensor h = c.h.detach().clone().requires_grad_(true), w = c.w.detach().clone().requires_grad_(true);
    const at::Tensor logits = alpaca::model::linear(h, w).narrow(1, 0, c.h.size(1) - 1).reshape({-1, c.w.size(0)});
    const at::Tensor labels = c.labels.narrow(1, 1, c.labels.size(1) - 1).reshape({-1});
    const at::Tensor mask = labels.ne(kIgnoreIndex);
    const at::Tensor logp = at::log_softmax(logits, -1);
    const at::Tensor nll = -logp.gather(1, labels.clamp_min(0).unsqueeze(1)).squeeze(1);
    const at::Tensor per_token = dft ? nll * (-nll).exp().detach() : nll * 0.9 + (-logp).mean(-1) * 0.1;
    const at::Tensor want = (per_token * mask).sum();
    (want * 0.37).backward();
    const at::Tensor want_gh = h.grad().clone(), want_gw = w.grad().clone();
    for (int64_t chunk : {1, 7, 1000}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk));
      at::Tensor h2 = c.h.detach().clone().requires_grad_(true), w2 = c.w.detach().clone().requires_grad_(true);
      const LossSum ls = causal_lm_head_loss_sum(h2, w2, c.labels, chunk, {}, {}, o);
      (ls.sum * 0.37).backward();
      EXPECT_LE(std::abs(ls.sum.item<double>() - want.item<double>()) / want.item<double>(), 1e-6);
      EXPECT_LE(rel_max(h2.grad(), want_gh), 1e-5);
      EXPECT_LE(rel_max(w2.grad(), want_gw), 1e-5);
      // Not the plain cross-entropy.
      EXPECT_GT(std::abs(ls.sum.item<double>() - nll.masked_select(mask).sum().item<double>()), 1e-3);
    }
    const Case cb = make_case(at::kBFloat16);
    at::Tensor hb = cb.h.detach().clone().requires_grad_(true), wb = cb.w.detach().clone().requires_grad_(true);
    const LossSum lb = causal_lm_head_loss_sum(hb, wb, cb.labels, 0, {}, {}, o);
    (lb.sum * 0.37).backward();
    EXPECT_LE(std::abs(lb.sum.item<double>() - want.item<double>()) / want.item<double>(), 2e-2);
    EXPECT_LE(rel_max(hb.grad().to(at::kFloat), want_gh), 2e-2);
  }
}

TEST(FusedLoss, MatchesLogitsPathInFp32ForEveryChunking) {
  const Case c = make_case(at::kFloat);
  const Result ref = run(c, /*fused=*/false);
  EXPECT_EQ(ref.count, c.labels.narrow(1, 1, c.labels.size(1) - 1).ne(kIgnoreIndex).sum().item<int64_t>());
  for (int64_t chunk : {1, 7, 64, 1000, 0}) {
    const Result got = run(c, /*fused=*/true, chunk);
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    EXPECT_EQ(got.count, ref.count);
    EXPECT_LE(std::abs(got.loss - ref.loss) / ref.loss, 1e-6);
    EXPECT_LE(rel_max(got.grad_h, ref.grad_h), 1e-5);
    EXPECT_LE(rel_max(got.grad_w, ref.grad_w), 1e-5);
  }
}

// fp32 logits on the CPU are computed into one buffer whose rows are padded to 64 bytes where the
// vocabulary is not a multiple of 16 (Alpaca's 32001; loss_rows.h: fp32_logits_row_stride): the
// same loss and gradients, bit for bit, as ATen's fresh contiguous logits (ALPACA_CPU_FUSED=0).
TEST(FusedLoss, Fp32PaddedLogitRowsAreThePlainFormBitForBit) {
  for (const auto& [v, d] : {std::pair<int64_t, int64_t>{101, 16}, {1001, 128}, {112, 16}}) {
    const Case c = make_case(at::kFloat, 3, 300, d, v);
    EXPECT_EQ(fp32_logits_row_stride(c.w), v % 16 == 0 ? 0 : (v + 15) / 16 * 16);
    for (int64_t chunk : {97, 0}) {
      SCOPED_TRACE("V " + std::to_string(v) + ", chunk " + std::to_string(chunk));
      set_fused_cpu_bf16(false);
      EXPECT_EQ(fp32_logits_row_stride(c.w), 0);
      const Result plain = run(c, /*fused=*/true, chunk);
      set_fused_cpu_bf16(true);
      const Result got = run(c, /*fused=*/true, chunk);
      EXPECT_EQ(got.loss, plain.loss);
      EXPECT_TRUE(at::equal(got.grad_h, plain.grad_h));
      EXPECT_TRUE(at::equal(got.grad_w, plain.grad_w));
    }
  }
  EXPECT_EQ(fp32_logits_row_stride(at::empty({101, 16}, at::kBFloat16)), 0);
}

TEST(FusedLoss, IgnoredPositionsGetNoGradient) {
  const Case c = make_case(at::kFloat);
  const Result got = run(c, /*fused=*/true, 5);
  // Row 2 has no label at all; row 0's first 8 positions predict ignored labels.
  EXPECT_EQ(got.grad_h[2].abs().max().item<double>(), 0.0);
  EXPECT_EQ(got.grad_h[0].narrow(0, 0, 8).abs().max().item<double>(), 0.0);
  EXPECT_GT(got.grad_h[0][8].abs().max().item<double>(), 0.0);
  // The last position of every row predicts nothing (shift).
  EXPECT_EQ(got.grad_h.select(1, c.h.size(1) - 1).abs().max().item<double>(), 0.0);
}

TEST(FusedLoss, NoLabelsGivesZeroLossAndZeroGradients) {
  Case c = make_case(at::kFloat);
  c.labels.fill_(kIgnoreIndex);
  const Result got = run(c, /*fused=*/true);
  EXPECT_EQ(got.count, 0);
  EXPECT_EQ(got.loss, 0.0);
  EXPECT_EQ(got.grad_w.abs().max().item<double>(), 0.0);
}

TEST(FusedLoss, WithoutGradModeOnlyTheLoss) {
  const Case c = make_case(at::kFloat);
  const Result ref = run(c, /*fused=*/false);
  at::NoGradGuard no_grad;
  const LossSum ls = causal_lm_head_loss_sum(c.h, c.w, c.labels, 9);
  EXPECT_FALSE(ls.sum.requires_grad());
  EXPECT_LE(std::abs(ls.sum.item<double>() - ref.loss) / ref.loss, 1e-6);
}

TEST(FusedLoss, Bf16CloseToFp32UnderBothGemmRoutes) {
  const Case c32 = make_case(at::kFloat);
  const Result ref = run(c32, /*fused=*/false);
  Case c16 = c32;
  c16.h = c32.h.to(at::kBFloat16);
  c16.w = c32.w.to(at::kBFloat16);
  for (CpuBf16Gemm mode : {CpuBf16Gemm::kNative, CpuBf16Gemm::kFp32}) {
    ModeGuard guard(mode);
    SCOPED_TRACE(mode == CpuBf16Gemm::kNative ? "native" : "fp32");
    for (bool fused : {false, true}) {
      const Result got = run(c16, fused, 11);
      EXPECT_LE(std::abs(got.loss - ref.loss) / ref.loss, 2e-2) << (fused ? "fused" : "logits");
      EXPECT_LE(rel_max(got.grad_h, ref.grad_h), 2e-2) << (fused ? "fused" : "logits");
      EXPECT_LE(rel_max(got.grad_w, ref.grad_w), 2e-2) << (fused ? "fused" : "logits");
    }
  }
}

TEST(FusedLoss, LabelOutsideVocabularyIsAnError) {
  Case c = make_case(at::kFloat);
  c.labels[1][5] = c.w.size(0);
  try {
    causal_lm_head_loss_sum(c.h, c.w, c.labels);
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("outside the vocabulary"), std::string::npos) << e.what();
  }
}

TEST(CpuBf16Gemm, Fp32RouteIsOneRoundingOfTheFp32Product) {
  at::manual_seed(3);
  const at::Tensor x = at::randn({2, 5, 24}).to(at::kBFloat16);
  const at::Tensor w = at::randn({12, 24}).to(at::kBFloat16);
  const at::Tensor b = at::randn({12}).to(at::kBFloat16);
  ModeGuard guard(CpuBf16Gemm::kFp32);
  const at::Tensor want = at::linear(x.to(at::kFloat), w.to(at::kFloat), b.to(at::kFloat)).to(at::kBFloat16);
  EXPECT_TRUE(at::equal(alpaca::model::linear(x, w, b), want));
  // Gradients: the fp32 products of the upcast bf16 operands, rounded once.
  at::Tensor xg = x.clone().requires_grad_(true), wg = w.clone().requires_grad_(true),
             bg = b.clone().requires_grad_(true);
  const at::Tensor gy = at::randn({2, 5, 12}).to(at::kBFloat16);
  alpaca::model::linear(xg, wg, bg).backward(gy);
  const at::Tensor g = gy.to(at::kFloat).reshape({-1, 12});
  EXPECT_TRUE(at::equal(xg.grad(), at::mm(g, w.to(at::kFloat)).to(at::kBFloat16).view({2, 5, 24})));
  EXPECT_TRUE(at::equal(wg.grad(), at::mm(g.t(), x.to(at::kFloat).reshape({-1, 24})).to(at::kBFloat16)));
  EXPECT_TRUE(at::equal(bg.grad(), g.sum(0).to(at::kBFloat16)));
  EXPECT_EQ(xg.grad().scalar_type(), at::kBFloat16);
  // Against the native kernel: within a bf16 rounding.
  ModeGuard native(CpuBf16Gemm::kNative);
  EXPECT_LE(rel_max(alpaca::model::linear(x, w, b).to(at::kFloat), want.to(at::kFloat)), 1e-2);
}

TEST(CpuBf16Gemm, Fp32AndOtherDtypesAreUntouched) {
  ModeGuard guard(CpuBf16Gemm::kFp32);
  at::manual_seed(4);
  const at::Tensor x = at::randn({4, 8}), w = at::randn({3, 8});
  EXPECT_TRUE(at::equal(alpaca::model::linear(x, w), at::linear(x, w)));
  EXPECT_FALSE(bf16_gemm_via_fp32(x, w));
  EXPECT_TRUE(bf16_gemm_via_fp32(x.to(at::kBFloat16), w.to(at::kBFloat16)));
}

// The bf16 CPU row kernels (loss_rows.cpp) against the ATen passes they replace (the module path,
// ALPACA_CPU_FUSED=0): the same fp32 softmax up to exp's last bits, rounded to bf16 once, so the
// loss within 1e-5 and the gradients within 1e-2 of their max (a rare bf16 ulp of the softmax
// carried through the bf16 products); and the instruction-set variants bit for bit.
TEST(FusedLoss, Bf16RowKernelsMatchTheAtenPassesOnEveryIsa) {
  for (int64_t v : {101, 32, 7}) {  // off, at and below the 16-lane width
    SCOPED_TRACE("V " + std::to_string(v));
    Case c = make_case(at::kBFloat16, 3, 37, 16, v);
    c.h = c.h * 3;  // logits spread over several units, so exp and max matter
    set_fused_cpu_bf16(false);
    const Result ref = run(c, /*fused=*/true, 13);
    set_fused_cpu_bf16(true);
    std::optional<Result> first;
    for (int i = 0; i <= static_cast<int>(best_fused_cpu_isa()); ++i) {
      set_fused_cpu_isa(static_cast<FusedCpuIsa>(i));
      const Result got = run(c, /*fused=*/true, 13);
      EXPECT_LE(std::abs(got.loss - ref.loss) / ref.loss, 1e-5) << "isa " << i;
      EXPECT_LE(rel_max(got.grad_h, ref.grad_h), 1e-2) << "isa " << i;
      EXPECT_LE(rel_max(got.grad_w, ref.grad_w), 1e-2) << "isa " << i;
      if (!first) {
        first = got;
        continue;
      }
      EXPECT_EQ(got.loss, first->loss) << "isa " << i;
      EXPECT_TRUE(at::equal(got.grad_h, first->grad_h) && at::equal(got.grad_w, first->grad_w)) << "isa " << i;
    }
    set_fused_cpu_isa(best_fused_cpu_isa());
  }
}

// Where bf16 CPU training sums the lm_head gradient in fp32 inside our GEMM (model/loss.h), the
// chunking no longer rounds it: each chunk's product was rounded to bf16 before it was added into
// fp32, so 11-row chunks and one chunk disagreed in the last bf16 bit of many entries; now they
// differ only by fp32 reassociation, which a final bf16 rounding hides in all but a few entries.
TEST(FusedLoss, Bf16HeadGradientIsNotRoundedPerChunk) {
  const bf16gemm::Backend was = bf16gemm::backend();
  for (auto b : {bf16gemm::Backend::kOwn, bf16gemm::Backend::kOnednn}) {
    if (!bf16gemm::runs(b)) continue;
    bf16gemm::set_backend(b);
    SCOPED_TRACE(bf16gemm::name(b));
    if (!head_grad_summed_in_cpu_gemm()) continue;  // oneDNN's without native bf16 (AVX-512 without BF16 / AMX)
    Case c = make_case(at::kBFloat16, 3, 37, 64, 203);
    const Result chunked = run(c, /*fused=*/true, 11);
    const Result whole = run(c, /*fused=*/true, 1000);
    EXPECT_NEAR(chunked.loss, whole.loss, 1e-5 * whole.loss);
    const double differ = chunked.grad_w.ne(whole.grad_w).to(at::kDouble).mean().item<double>();
    EXPECT_LE(differ, 0.01) << "a fraction " << differ << " of the lm_head gradient depends on the chunking";
    EXPECT_LE(rel_max(chunked.grad_w, whole.grad_w), 1e-2);
  }
  bf16gemm::set_backend(was);
}

// Where ATen's GEMM makes the lm_head gradient's per-chunk product (the cpublas backend on a CPU with
// native bf16 products; here chosen), it goes into one scratch buffer kept across the chunks and is added into
// fp32 in one pass: the same bits as the plain form (each chunk's product added with add_, the first
// upcast), on every instruction set the add's row loops have.
TEST(FusedLoss, Bf16HeadGradientThroughAtenGemmIsThePlainFormBitForBit) {
  const bf16gemm::Backend was = bf16gemm::backend();
  bf16gemm::set_backend(bf16gemm::Backend::kCpublas);
  for (int i = 0; i <= static_cast<int>(best_fused_cpu_isa()); ++i) {
    set_fused_cpu_isa(static_cast<FusedCpuIsa>(i));
    at::manual_seed(11 + i);
    const int64_t v = 203, d = 64;
    at::Tensor grad_w, scratch, want;
    const void* buffer = nullptr;
    for (int64_t rows : {11, 7, 11, 1}) {
      const at::Tensor g = at::randn({rows, v}).to(at::kBFloat16);
      const at::Tensor h = (at::randn({rows, d}) * 3).to(at::kBFloat16);
      accumulate_head_weight_grad(grad_w, scratch, g, h);
      const at::Tensor product = at::mm(g.t(), h);
      want = want.defined() ? want.add_(product) : product.to(at::kFloat);
      ASSERT_TRUE(at::equal(grad_w, want)) << "isa " << i << ", a chunk of " << rows << " rows";
      if (buffer == nullptr) buffer = scratch.const_data_ptr();
      EXPECT_EQ(scratch.const_data_ptr(), buffer) << "the product's buffer is allocated once, not per chunk";
    }
  }
  set_fused_cpu_isa(best_fused_cpu_isa());
  bf16gemm::set_backend(was);
}

}  // namespace test_fused_loss

namespace test_fused_loss {
namespace {

// The label tokens' entropy sum and top-1 count from the full logits (TRL's fused head: entropy of
// the softmax, and whether the label is the argmax, the first index among equal maxima).
std::pair<double, int64_t> stats_from_logits(const Case& c) {
  const int64_t v = c.w.size(0);
  const at::Tensor logits =
      alpaca::model::linear(c.h, c.w).to(at::kFloat).narrow(1, 0, c.h.size(1) - 1).reshape({-1, v});
  const at::Tensor labels = c.labels.narrow(1, 1, c.labels.size(1) - 1).reshape({-1});
  const at::Tensor mask = labels.ne(kIgnoreIndex);
  const at::Tensor z = logits.index({mask}).to(at::kDouble);
  const at::Tensor entropy = -(at::softmax(z, -1) * at::log_softmax(z, -1)).sum(-1);
  const int64_t top1 = z.argmax(-1).eq(labels.index({mask})).sum().item<int64_t>();
  return {entropy.sum().item<double>(), top1};
}

LossSum loss_with_stats(const Case& c, int64_t chunk, LossOptions o, bool grad) {
  o.token_stats = true;
  at::Tensor h = c.h.detach().clone().requires_grad_(grad), w = c.w.detach().clone().requires_grad_(grad);
  LossSum ls = causal_lm_head_loss_sum(h, w, c.labels, chunk, {}, {}, o);
  if (grad) ls.sum.backward();
  return ls;
}

}  // namespace

// LossOptions::token_stats (TRL SFTTrainer's entropy and mean_token_accuracy inputs): the label
// tokens' entropy sum within 1e-6 (fp32) of the full logits' in fp64, the top-1 count exact, for
// every chunking, with and without gradients, under each loss form, on the fused CPU pass and ATen's;
// the loss and gradients are the same bits as without the statistics. V = 101: the fp32 logits' rows
// are padded (loss_rows.h), so the row pass reads strided views.
TEST(FusedLoss, TokenStatsAreTheEntropyAndTop1OfTheLabelTokens) {
  Case c = make_case(at::kFloat);
  c.h = c.h * 3;  // spread logits: an entropy well below log V, and some top-1 hits
  const auto [want_entropy, want_top1] = stats_from_logits(c);
  ASSERT_GT(want_top1, 0);
  for (const bool dft : {false, true})
  for (const bool fused : {true, false}) {  // the fused CPU row pass; ATen's argmax and xlogy
    set_fused_cpu_bf16(fused);
    LossOptions o;
    o.dft = dft;
    for (int64_t chunk : {1, 7, 1000}) {
      SCOPED_TRACE(std::string(dft ? "dft" : "cross-entropy") + (fused ? ", fused" : ", ATen") + ", chunk " +
                   std::to_string(chunk));
      for (const bool grad : {false, true}) {
        const LossSum ls = loss_with_stats(c, chunk, o, grad);
        ASSERT_TRUE(ls.token_stats.defined());
        EXPECT_NEAR(ls.token_stats[0].item<double>(), want_entropy, 1e-6 * want_entropy);
        EXPECT_EQ(ls.token_stats[1].item<double>(), static_cast<double>(want_top1));
      }
      at::Tensor h = c.h.detach().clone().requires_grad_(true), w = c.w.detach().clone().requires_grad_(true);
      const LossSum plain = causal_lm_head_loss_sum(h, w, c.labels, chunk, {}, {}, o);
      plain.sum.backward();
      EXPECT_FALSE(plain.token_stats.defined());
      o.token_stats = true;
      at::Tensor h2 = c.h.detach().clone().requires_grad_(true), w2 = c.w.detach().clone().requires_grad_(true);
      const LossSum with = causal_lm_head_loss_sum(h2, w2, c.labels, chunk, {}, {}, o);
      with.sum.backward();
      o.token_stats = false;
      EXPECT_EQ(plain.sum.item<double>(), with.sum.item<double>());
      EXPECT_TRUE(at::equal(h.grad(), h2.grad()) && at::equal(w.grad(), w2.grad()));
    }
  }
  set_fused_cpu_bf16(true);
}

// bf16 logits: the row kernel (every ISA) and the ATen passes give the same top-1 count as the
// argmax of the bf16 logits and entropies within 1e-5; exact ties (logits made by an identity head)
// count only the first maximum, as TRL's is_top1; the row kernel's loss and gradient bits do not
// change with the statistics.
TEST(FusedLoss, Bf16TokenStatsOnBothRowPathsAndTiesTakeTheFirstMaximum) {
  const ModeGuard native(CpuBf16Gemm::kNative);  // bf16 logits (the fp32 route's are fp32 rows: the ATen passes)
  Case c = make_case(at::kBFloat16, 3, 37, 16, 101);
  c.h = c.h * 3;
  const auto [want_entropy, want_top1] = stats_from_logits(c);
  ASSERT_GT(want_top1, 0);
  // Ties: D = V = 5, the head the identity, so the logits are the hidden rows exactly.
  Case t;
  t.w = at::eye(5).to(at::kBFloat16);
  t.h = at::tensor({0.f, 2.f, 2.f, 1.f, 2.f, 2.f, 2.f, 0.f, 0.f, 0.f, 3.f, 3.f, 3.f, 3.f, 3.f, 0.f, 0.f, 0.f, 0.f, 0.f})
            .reshape({1, 4, 5}).to(at::kBFloat16);
  // Position p predicts label p + 1: row 0 (max 2 at 1, 2, 4) -> label 1 hits; row 1 (max 2 at 0, 1) ->
  // label 1 misses; row 2 (all 3) -> label 0 hits.
  t.labels = at::tensor(std::vector<int64_t>{-100, 1, 1, 0}, at::kLong).reshape({1, 4});
  for (const bool fused : {false, true}) {
    set_fused_cpu_bf16(fused);
    for (int i = 0; i <= (fused ? static_cast<int>(best_fused_cpu_isa()) : 0); ++i) {
      if (fused) set_fused_cpu_isa(static_cast<FusedCpuIsa>(i));
      SCOPED_TRACE(std::string(fused ? "row kernel, isa " : "ATen passes ") + std::to_string(i));
      const LossSum ls = loss_with_stats(c, 13, {}, true);
      EXPECT_NEAR(ls.token_stats[0].item<double>(), want_entropy, 1e-5 * want_entropy);
      EXPECT_EQ(ls.token_stats[1].item<double>(), static_cast<double>(want_top1));
      const LossSum tie = loss_with_stats(t, 0, {}, false);
      EXPECT_EQ(tie.token_stats[1].item<double>(), 2.0);
      // Row 2: uniform over 5 (entropy log 5); rows 0 and 1 from their logits.
      EXPECT_NEAR(tie.token_stats[0].item<double>(), stats_from_logits(t).first, 1e-5);
      if (fused) {
        at::Tensor h = c.h.detach().clone().requires_grad_(true), w = c.w.detach().clone().requires_grad_(true);
        const LossSum plain = causal_lm_head_loss_sum(h, w, c.labels, 13);
        plain.sum.backward();
        at::Tensor h2 = c.h.detach().clone().requires_grad_(true), w2 = c.w.detach().clone().requires_grad_(true);
        LossOptions o;
        o.token_stats = true;
        const LossSum with = causal_lm_head_loss_sum(h2, w2, c.labels, 13, {}, {}, o);
        with.sum.backward();
        EXPECT_EQ(plain.sum.item<double>(), with.sum.item<double>());
        EXPECT_TRUE(at::equal(h.grad(), h2.grad()) && at::equal(w.grad(), w2.grad()));
      }
    }
  }
  set_fused_cpu_isa(best_fused_cpu_isa());
}

}  // namespace test_fused_loss
