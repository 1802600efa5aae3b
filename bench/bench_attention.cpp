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
//
// ALPACA_BENCH_ONLY=kernel times the packed bf16 GEMM alone (bf16_gemm.h, hot in cache) at the
// attention's three product shapes for each T: S = Q K^T (64 x T, K 64), O = P V (64 x 64, K T) and
// dV += P^T dO (T x 64, K 64), in GFLOP/s.
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
#include "../src/model/bf16_gemm.h"  // internal to src/model/: the kernel alone (ALPACA_BENCH_ONLY=kernel)

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

// GFLOP/s of the packed GEMM at the attention's product shapes (operands of ones: no denormals).
void bench_kernel(const std::vector<int64_t>& lengths, int reps) {
  namespace g = alpaca::model::bf16gemm;
  std::printf("packed bf16 GEMM (backend %s), GFLOP/s, best of %d x 20 calls\n", g::name(g::backend()), reps);
  std::printf("| T | S 64 x T, K 64 | O 64 x 64, K T | dV T x 64, K 64 |\n|---:|---:|---:|---:|\n");
  for (int64_t t : lengths) {
    const uint32_t one = 0x3F803F80u;  // two bf16 1.0
    std::vector<uint32_t> a(64 * t + 64 * 64, one), b(g::panels_size(32, t) + t * 64, one);
    std::vector<float> c(t * 64 + 64 * t);
    const auto rate = [&](const std::function<void()>& f) {
      double best = 1e30;
      for (int r = 0; r <= reps; ++r) {
        const double t0 = cpu_s(false);
        for (int i = 0; i < 20; ++i) f();
        if (r > 0) best = std::min(best, (cpu_s(false) - t0) / 20);
      }
      return 2.0 * 64 * 64 * static_cast<double>(t) / best / 1e9;
    };
    const double s = rate([&] { g::gemm(64, t, 32, a.data(), 32, 1, g::panels_of(b.data(), 32), c.data(), t, false); });
    const double o =
        rate([&] { g::gemm(64, 64, t / 2, a.data(), t / 2, 1, g::rows_of(b.data(), 64), c.data(), 64, false); });
    const double dv = rate([&] { g::gemm(t, 64, 32, a.data(), 1, t, g::rows_of(b.data(), 64), c.data(), 64, true); });
    std::printf("| %lld | %.1f | %.1f | %.1f |\n", static_cast<long long>(t), s, o, dv);
  }
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
  // ALPACA_BENCH_ONLY=sdpa|gemm times one side only (for perf record); =kernel the packed GEMM alone.
  const char* only_env = std::getenv("ALPACA_BENCH_ONLY");
  const int only = only_env == nullptr ? -1 : std::string(only_env) == "sdpa" ? 0 : 1;
  const int64_t b = 2, h = 12, dh = 64;
  const double scale = 1.0 / 8.0;
  std::printf("CPU: %s\nload: %s\nB %lld, %lld heads, head_dim %lld, bf16, %d thread(s), best of %d, %s CPU time\n",
              first_line_with("/proc/cpuinfo", "model name").c_str(), first_line_with("/proc/loadavg", "").c_str(),
              static_cast<long long>(b), static_cast<long long>(h), static_cast<long long>(dh), threads, reps,
              process ? "process" : "thread");
  if (only_env != nullptr && std::string(only_env) == "kernel") {
    bench_kernel(lengths, reps);
    return 0;
  }
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
