// The fused chunked head loss on a GPU (skipped without CUDA): fp32 and bf16 against the logits
// path on the same device, and the CUDA result against the CPU one. Tolerances as test_fused_loss:
// fp32 1e-5 rel (loss) / 1e-4 of the max (gradients, TF32 off); bf16 2e-2.
#include <gtest/gtest.h>

#include <torch/cuda.h>

#include "alpaca/model/loss.h"
#include "alpaca/model/matmul.h"

namespace test_fused_loss_gpu {

using namespace alpaca::model;

namespace {

double rel_max(const at::Tensor& a, const at::Tensor& b) {
  return (a.cpu().to(at::kFloat) - b.cpu().to(at::kFloat)).abs().max().item<double>() /
         std::max(b.abs().max().item<double>(), 1e-30);
}

struct Grads {
  double loss;
  at::Tensor gh, gw;
};

Grads run(const at::Tensor& h0, const at::Tensor& w0, const at::Tensor& labels, bool fused) {
  at::Tensor h = h0.detach().clone().requires_grad_(true), w = w0.detach().clone().requires_grad_(true);
  LossSum ls = fused ? causal_lm_head_loss_sum(h, w, labels, 64) : causal_lm_loss_sum(alpaca::model::linear(h, w), labels);
  ls.sum.backward();
  return {ls.sum.item<double>(), h.grad(), w.grad()};
}

}  // namespace

TEST(FusedLossGpu, MatchesLogitsPathOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  at::globalContext().setAllowTF32CuBLAS(false);
  at::manual_seed(11);
  const at::Device cuda(at::kCUDA, 0);
  const at::Tensor h = at::randn({4, 300, 64}), w = at::randn({32001, 64}) * 0.2;
  at::Tensor labels = at::randint(0, 32001, {4, 300}, at::kLong);
  labels.narrow(1, 0, 40).fill_(kIgnoreIndex);
  const Grads cpu = run(h, w, labels, /*fused=*/false);
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(dt == at::kFloat ? "fp32" : "bf16");
    const double tol_loss = dt == at::kFloat ? 1e-5 : 2e-2, tol_grad = dt == at::kFloat ? 1e-4 : 2e-2;
    const at::Tensor hc = h.to(cuda).to(dt), wc = w.to(cuda).to(dt), lc = labels.to(cuda);
    const Grads ref = run(hc, wc, lc, /*fused=*/false);
    const Grads got = run(hc, wc, lc, /*fused=*/true);
    EXPECT_EQ(got.gh.device(), hc.device());
    EXPECT_LE(std::abs(got.loss - ref.loss) / ref.loss, tol_loss);
    EXPECT_LE(rel_max(got.gh, ref.gh), tol_grad);
    EXPECT_LE(rel_max(got.gw, ref.gw), tol_grad);
    EXPECT_LE(std::abs(got.loss - cpu.loss) / cpu.loss, tol_loss);
    EXPECT_LE(rel_max(got.gw, cpu.gw), tol_grad);
  }
}

}  // namespace test_fused_loss_gpu
