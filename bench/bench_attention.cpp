// Causal bf16 attention, forward and forward + backward, ATen's scaled_dot_product_attention (its
// flash-attention CPU kernel, the path before issue 32's fix) against model::causal_attention_bf16
// (the GEMM attention), alternating, on the small bench model's shapes (docs/profile_bf16.md).
//
//   build/tests/model/bench_attention [reps=5] [threads=1] [T ...]      default T: 256 512 1024
//
// Thread CPU time (CLOCK_THREAD_CPUTIME_ID, immune to lost time slices on a shared machine; with
// threads > 1 process CPU time), the best of `reps` rounds. GFLOP/s count the causal FLOPs only:
// forward 2 * B * H * T^2 * Dh (Q K^T and P V over the lower triangle), backward twice that
// (dV, dP, dQ, dK; the recomputation of S is not counted).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "alpaca/model/fused_ops.h"

namespace {

double cpu_s(bool process) {
  timespec ts{};
  clock_gettime(process ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

std::string first_line_with(const char* path, const std::string& key) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (key.empty() || line.rfind(key, 0) == 0) return line;
  return "?";
}

using Attn = std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>;

// Seconds of one call: forward only (no graph) or forward + backward.
double time_one(const Attn& f, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                bool backward, bool process) {
  const double t0 = cpu_s(process);
  if (backward) {
    const at::Tensor y = f(q, k, v);
    torch::autograd::grad({y}, {q, k, v}, {g});
  } else {
    at::NoGradGuard no_grad;
    f(q, k, v);
  }
  return cpu_s(process) - t0;
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 5;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 1;
  std::vector<int64_t> lengths;
  for (int i = 3; i < argc; ++i) lengths.push_back(std::atoll(argv[i]));
  if (lengths.empty()) lengths = {256, 512, 1024};
  if (reps < 1 || threads < 1) {
    std::fprintf(stderr, "usage: bench_attention [reps>=1] [threads>=1] [T ...]\n");
    return 2;
  }
  at::set_num_threads(threads);
  const bool process = threads > 1;
  // ALPACA_BENCH_ONLY=sdpa|gemm times one side only (for perf record).
  const char* only_env = std::getenv("ALPACA_BENCH_ONLY");
  const int only = only_env == nullptr ? -1 : std::string(only_env) == "sdpa" ? 0 : 1;
  const int64_t b = 2, h = 12, dh = 64;
  const double scale = 1.0 / 8.0;
  std::printf("CPU: %s\nload: %s\nB %lld, %lld heads, head_dim %lld, bf16, %d thread(s), best of %d, %s CPU time\n",
              first_line_with("/proc/cpuinfo", "model name").c_str(), first_line_with("/proc/loadavg", "").c_str(),
              static_cast<long long>(b), static_cast<long long>(h), static_cast<long long>(dh), threads, reps,
              process ? "process" : "thread");
  const Attn sdpa = [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    return at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, true, scale);
  };
  const Attn gemm = [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    return alpaca::model::causal_attention_bf16(q, k, v, scale);
  };
  std::printf("| T | fwd ms SDPA / GEMM | fwd GFLOP/s SDPA / GEMM | fwd+bwd ms SDPA / GEMM | fwd+bwd GFLOP/s SDPA / GEMM | speed-up fwd, fwd+bwd |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|\n");
  for (int64_t t : lengths) {
    // The layer's layout: (B, T, H, Dh) projections viewed as (B, H, T, Dh).
    auto input = [&] { return at::randn({b, t, h, dh}).to(at::kBFloat16).transpose(1, 2).requires_grad_(true); };
    const at::Tensor q = input(), k = input(), v = input();
    const at::Tensor g = at::randn({b, h, t, dh}).to(at::kBFloat16);
    double best[2][2] = {{1e30, 1e30}, {1e30, 1e30}};  // [sdpa, gemm][fwd, fwd+bwd]
    for (int r = 0; r <= reps; ++r)  // round 0 warms up
      for (int which = 0; which < 2; ++which)
        for (int bwd = 0; bwd < 2; ++bwd) {
          if (only >= 0 && which != only) continue;
          const double s = time_one(which == 0 ? sdpa : gemm, q, k, v, g, bwd == 1, process);
          if (r > 0) best[which][bwd] = std::min(best[which][bwd], s);
        }
    const double fwd_flop = 2.0 * static_cast<double>(b * h * t * t * dh);
    std::printf("| %lld | %.2f / %.2f | %.1f / %.1f | %.2f / %.2f | %.1f / %.1f | %.2fx, %.2fx |\n",
                static_cast<long long>(t), 1e3 * best[0][0], 1e3 * best[1][0], fwd_flop / best[0][0] / 1e9,
                fwd_flop / best[1][0] / 1e9, 1e3 * best[0][1], 1e3 * best[1][1], 3 * fwd_flop / best[0][1] / 1e9,
                3 * fwd_flop / best[1][1] / 1e9, best[0][0] / best[1][0], best[0][1] / best[1][1]);
  }
  std::printf("load after: %s\n", first_line_with("/proc/loadavg", "").c_str());
  return 0;
}
