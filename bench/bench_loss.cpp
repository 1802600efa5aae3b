// The fused head loss (model::causal_lm_head_loss_sum) in bf16, forward + backward, with the
// cross-entropy rows of model/loss_rows.h against the ATen passes they replaced (the fused kernels
// off: set_fused_cpu_bf16(false)), alternating, on the small bench model's head (D 768, V 32001;
// docs/profile_bf16.md), and, on CPUs with our AVX512-BF16 GEMM, the lm_head gradient summed in fp32
// inside that GEMM (loss_rows.h: head_weight_grad_bf16) against ATen's bf16 product per chunk added
// into fp32 (bf16gemm::set_backend(kCpublas)). ALPACA_BF16_GEMM picks the GEMM summing it (bf16_gemm.h).
// Then the trainer's form, with LossOptions::token_stats (TRL's entropy and top-1), against without,
// in bf16 and fp32.
//
//   build/tests/model/bench_loss [reps=5] [tokens=1024]
//
// Thread CPU time (CLOCK_THREAD_CPUTIME_ID: immune to lost time slices on a shared machine), one
// intra-op thread, the best of `reps` rounds.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <string>

#include "alpaca/model/fused_ops.h"
#include "alpaca/model/loss.h"
#include "alpaca/util/sys.h"
#include "bf16_gemm.h"
#include "loss_rows.h"

namespace {

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "?";
}

double time_one(const at::Tensor& h, const at::Tensor& w, const at::Tensor& labels, bool token_stats = false) {
  alpaca::model::LossOptions o;
  o.token_stats = token_stats;
  const double t0 = thread_cpu_s();
  const alpaca::model::LossSum ls = alpaca::model::causal_lm_head_loss_sum(h, w, labels, 0, {}, {}, o);
  torch::autograd::grad({ls.sum}, {h, w});
  return thread_cpu_s() - t0;
}

// One chunk's cross-entropy and logits gradient alone (no GEMM), as loss.cpp's ATen passes.
double time_rows_aten(const at::Tensor& z_c, const at::Tensor& target) {
  const double t0 = thread_cpu_s();
  at::Tensor z = z_c.to(at::kFloat);
  const at::Tensor tl = z.gather(1, target.unsqueeze(1));
  const at::Tensor zmax = z.amax(1, true);
  z.sub_(zmax).exp_();
  const at::Tensor sumexp = z.sum(1, true);
  const double loss = (sumexp.log() + zmax - tl).sum().item<double>();
  z.div_(sumexp);
  z.scatter_add_(1, target.unsqueeze(1), at::full_like(tl, -1.0));
  const at::Tensor g = z.to(at::kBFloat16);
  return thread_cpu_s() - t0 + 0 * loss;
}

double time_rows_fused(const at::Tensor& z_c, const at::Tensor& target) {
  at::Tensor z = z_c.clone();
  const double t0 = thread_cpu_s();
  alpaca::model::cross_entropy_rows_bf16(z, target, true);
  return thread_cpu_s() - t0;
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 5;
  const int64_t tokens = argc > 2 ? std::atoll(argv[2]) : 1024;
  if (reps < 1 || tokens < 2) {
    std::fprintf(stderr, "usage: bench_loss [reps >= 1] [tokens >= 2]\n");
    return 2;
  }
  alpaca::sys::keep_host_heap();  // the trainer's allocator policy: freed buffers are reused, not refaulted
  at::set_num_threads(1);
  at::manual_seed(0);
  const int64_t d = 768, v = 32001;
  const at::Tensor h = (at::randn({1, tokens, d}) * 0.5).to(at::kBFloat16).requires_grad_(true);
  const at::Tensor w = (at::randn({v, d}) * 0.05).to(at::kBFloat16).requires_grad_(true);
  const at::Tensor labels = at::randint(0, v, {1, tokens}, at::kLong);
  // Sides: 0 the ATen passes, 1 the fused rows with ATen's lm_head product, 2 the fused rows with the
  // product summed inside our GEMM (where this CPU has it).
  namespace g = alpaca::model::bf16gemm;
  const g::Backend fast_backend = g::backend();
  const bool fast = g::fast();
  const int sides = fast ? 3 : 2;
  double best[3] = {1e30, 1e30, 1e30};
  for (int r = 0; r < reps + 1; ++r) {  // round 0 warms up every side
    for (int side = 0; side < sides; ++side) {
      alpaca::model::set_fused_cpu_bf16(side >= 1);
      if (fast) g::set_backend(side == 2 ? fast_backend : g::Backend::kCpublas);
      const double t = time_one(h, w, labels);
      if (r > 0) best[side] = std::min(best[side], t);
    }
  }
  // The trainer's loss: with TRL's token statistics (loss.h), on the default rows and in fp32.
  const at::Tensor h32 = h.detach().to(at::kFloat).requires_grad_(true), w32 = w.detach().to(at::kFloat).requires_grad_(true);
  double stats[4] = {1e30, 1e30, 1e30, 1e30};  // bf16 without / with, fp32 without / with
  if (fast) g::set_backend(fast_backend);
  alpaca::model::set_fused_cpu_bf16(true);
  for (int r = 0; r < reps + 1; ++r)
    for (int side = 0; side < 4; ++side) {
      const double t = side < 2 ? time_one(h, w, labels, side == 1) : time_one(h32, w32, labels, side == 3);
      if (r > 0) stats[side] = std::min(stats[side], t);
    }
  // The rows alone: one chunk of the loss (2^23 / V rows).
  const int64_t chunk = (int64_t{1} << 23) / v;
  const at::Tensor z_c = (at::randn({chunk, v}) * 3).to(at::kBFloat16);
  const at::Tensor target = at::randint(0, v, {chunk}, at::kLong);
  double rows[2] = {1e30, 1e30};
  for (int r = 0; r < reps + 1; ++r) {
    const double a = time_rows_aten(z_c, target), f = time_rows_fused(z_c, target);
    if (r > 0) rows[0] = std::min(rows[0], a), rows[1] = std::min(rows[1], f);
  }
  const double gemm_gflop = 3 * 2.0 * static_cast<double>(tokens - 1) * d * v * 1e-9;
  std::printf("CPU: %s; bf16 head loss, %lld tokens x D %lld x V %lld, 1 thread, best of %d (thread CPU s)\n",
              cpu_model().c_str(), static_cast<long long>(tokens), static_cast<long long>(d),
              static_cast<long long>(v), reps);
  std::printf("ATen passes: %.4f s   fused rows: %.4f s   speed-up %.2fx   (the three GEMMs: %.1f GFLOP)\n", best[0],
              best[1], best[0] / best[1], gemm_gflop);
  if (fast)
    std::printf("fused rows + lm_head gradient summed in the %s GEMM: %.4f s   %.2fx the fused rows alone\n",
                g::name(fast_backend), best[2], best[1] / best[2]);
  std::printf("with the trainer's token statistics (entropy, top-1): bf16 %.4f -> %.4f s (%+.1f%%), fp32 %.4f -> %.4f s "
              "(%+.1f%%)\n", stats[0], stats[1], 100 * (stats[1] / stats[0] - 1), stats[2], stats[3],
              100 * (stats[3] / stats[2] - 1));
  std::printf("one chunk (%lld x %lld logits) without the GEMMs: ATen passes %.4f s, fused rows %.4f s, %.2fx\n",
              static_cast<long long>(chunk), static_cast<long long>(v), rows[0], rows[1], rows[0] / rows[1]);
  return 0;
}
