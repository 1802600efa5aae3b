// New tokens per second of our generation (not part of ctest; bench/generate_bench.py drives it).
//   bench_generate <model_dir> <prompts.json> <batch_size> <max_new_tokens> [bf16] [threads=N] [unfused] [profile]
// prompts.json: {"prompts": [[ids...], ...]} (tokenized by the caller, so both sides decode the
// same inputs). Greedy, EOS from the prompts file's "eos_token_id". One warm-up batch first.
// threads=N sets LibTorch's intra-op threads (default: what OMP_NUM_THREADS gave it); the number
// in force is printed back, so the driver can check it. `unfused` turns the fused CPU decode step
// (model::CpuDecoder) off, so every step runs the module graph (the path before it existed).
// Prints one JSON line: {"new_tokens", "seconds", "cpu_seconds", "tokens_per_s", "threads", "generations"}
// (cpu_seconds: process CPU time, which a busy shared machine distorts less than wall time).
//
// `profile` instead measures where a decode step's time goes (stderr table, JSON line on stdout):
// a single-thread streaming read of a buffer the size of the weights (the memory-bandwidth
// floor), the weight products alone (every linear of one step back to back on the real weights),
// and the decode steps themselves under a RecordFunction observer that times each top-level ATen
// op (linear split by weight shape), leaving the rest as host work between ops. All of it in
// thread CPU time; run it with threads=1. Those steps are the module path (forward_cached); last,
// the fused step (model::CpuDecoder) on the same inputs, which is what generate runs at 1-2 rows.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <algorithm>
#include <chrono>
#include <ctime>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "alpaca/generate/generator.h"
#include "alpaca/io/hf_model.h"
#include "alpaca/model/cpu_decode.h"
#include "alpaca/model/kv_cache.h"
#include "alpaca/model/matmul.h"
#include "alpaca/util/error.h"

using namespace alpaca;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Profile mode times with this thread's CPU clock: on a shared machine a time slice lost to
// another process then counts for nothing (run it with threads=1 so every op is on this thread).
double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// --- the per-op observer (profile mode) ---------------------------------------------------------
struct OpStat {
  double seconds = 0;
  int64_t calls = 0;
};
thread_local int g_depth = 0;
std::map<std::string, OpStat> g_ops;

struct OpContext : at::ObserverContext {
  double t0 = 0;
  std::string key;
  bool top = false;
};

std::unique_ptr<at::ObserverContext> op_start(const at::RecordFunction& fn) {
  auto ctx = std::make_unique<OpContext>();
  ctx->top = g_depth++ == 0;
  if (ctx->top) {
    ctx->key = fn.name();
    if (ctx->key == "aten::linear" && fn.inputs().size() >= 2 && fn.inputs()[1].isTensor()) {
      const auto s = fn.inputs()[1].toTensor().sizes();
      ctx->key += " " + std::to_string(s[0]) + "x" + std::to_string(s[1]);
    }
    ctx->t0 = thread_cpu_s();
  }
  return ctx;
}

void op_end(const at::RecordFunction&, at::ObserverContext* c) {
  --g_depth;
  auto* ctx = static_cast<OpContext*>(c);
  if (!ctx->top) return;
  OpStat& s = g_ops[ctx->key];
  s.seconds += thread_cpu_s() - ctx->t0;
  ++s.calls;
}

// Every linear weight of one decode step, in forward order (layers, then lm_head).
std::vector<at::Tensor> step_weights(model::LlamaForCausalLM& m) {
  std::vector<at::Tensor> ws;
  for (auto& l : m->layers())
    for (const auto* lin : {&l->self_attn->q_proj, &l->self_attn->k_proj, &l->self_attn->v_proj,
                            &l->self_attn->o_proj, &l->mlp->gate_proj, &l->mlp->up_proj, &l->mlp->down_proj})
      ws.push_back((*lin)->weight);
  ws.push_back(m->lm_head_weight());
  return ws;
}

nlohmann::json profile(model::LlamaForCausalLM& m, const std::vector<std::vector<int64_t>>& prompts,
                       const generate::GenerateOptions& opts, int64_t batch) {
  at::NoGradGuard no_grad;
  nlohmann::json out;
  int64_t weight_bytes = 0;
  for (const auto& p : m->parameters()) weight_bytes += p.numel() * p.element_size();
  out["weight_bytes"] = weight_bytes;

  // 1. Streaming read of weight_bytes (fp32 sum, vectorised, one thread): the bandwidth floor.
  {
    at::Tensor buf = at::ones({weight_bytes / 4}, at::kFloat);
    const int saved = at::get_num_threads();
    at::set_num_threads(1);
    double best = 1e9;
    for (int r = 0; r < 5; ++r) {
      const double t0 = thread_cpu_s();
      volatile float s = buf.sum().item<float>();
      (void)s;
      best = std::min(best, thread_cpu_s() - t0);
    }
    at::set_num_threads(saved);
    out["stream_read_s"] = best;
    out["stream_read_GBps"] = weight_bytes / best / 1e9;
  }

  // 2. The weight products alone: one step's linears back to back on the real weights, through
  //    at::linear (the library kernel) and through model::linear (what the model calls).
  {
    const std::vector<at::Tensor> ws = step_weights(m);
    const at::Tensor w0 = m->lm_head_weight();
    at::Tensor x_d = at::randn({batch, 1, w0.size(1)}, w0.options());
    at::Tensor x_f = at::randn({batch, 1, m->config().intermediate_size}, w0.options());
    for (const bool ours : {false, true}) {
      auto pass = [&](bool head_only, bool layers_only) {
        const double t0 = thread_cpu_s();
        for (size_t i = 0; i < ws.size(); ++i) {
          const bool is_head = i + 1 == ws.size();
          if ((head_only && !is_head) || (layers_only && is_head)) continue;
          const at::Tensor& x = ws[i].size(1) == x_d.size(2) ? x_d : x_f;
          if (ours) {
            model::linear(x, ws[i]);
          } else {
            at::linear(x, ws[i]);
          }
        }
        return thread_cpu_s() - t0;
      };
      for (int r = 0; r < 2; ++r) pass(false, false);
      double all = 1e9, head = 1e9, layers = 1e9;
      for (int r = 0; r < 5; ++r) {
        all = std::min(all, pass(false, false));
        head = std::min(head, pass(true, false));
        layers = std::min(layers, pass(false, true));
      }
      const std::string p = ours ? "model_linear_" : "at_linear_";
      out[p + "all_s"] = all;
      out[p + "lm_head_s"] = head;
      out[p + "layers_s"] = layers;
      out[p + "GBps"] = weight_bytes / all / 1e9;
    }
  }

  // 3. Decode steps under the observer: the calls generate_batch makes for a greedy step
  //    (forward_cached of one token per row, then argmax), after a prefill of `batch` prompts.
  std::vector<std::vector<int64_t>> group(prompts.begin(), prompts.begin() + std::min<size_t>(batch, prompts.size()));
  while (static_cast<int64_t>(group.size()) < batch) group.push_back(prompts[0]);
  size_t t = 0;
  for (const auto& p : group) t = std::max(t, p.size());
  // Equal-length rows (cut to the shortest) so the step has no mask, as for a single prompt.
  size_t shortest = t;
  for (const auto& p : group) shortest = std::min(shortest, p.size());
  at::Tensor ids = at::empty({batch, static_cast<int64_t>(shortest)}, at::kLong);
  for (int64_t r = 0; r < batch; ++r)
    for (size_t j = 0; j < shortest; ++j) ids[r][j] = group[r][j];
  const int64_t steps = opts.max_new_tokens;
  auto run_steps = [&](bool observe) {
    model::KvCache cache(m->config(), batch, shortest + steps + 1, m->lm_head_weight().options());
    at::Tensor logits = m->forward_cached(ids, cache);
    at::CallbackHandle h = 0;
    if (observe) {
      g_ops.clear();
      h = at::addThreadLocalCallback(
          at::RecordFunctionCallback(op_start, op_end).needsInputs(true).scopes({at::RecordScope::FUNCTION}));
    }
    const double t0 = thread_cpu_s();
    for (int64_t s = 0; s < steps; ++s) {
      at::Tensor next = logits.argmax(-1).cpu();
      logits = m->forward_cached(next.view({batch, 1}), cache);
    }
    const double secs = thread_cpu_s() - t0;
    if (observe) at::removeCallback(h);
    return secs;
  };
  run_steps(false);  // warm-up
  const double plain = std::min(run_steps(false), run_steps(false));
  const double observed = run_steps(true);
  out["step_s"] = plain / steps;
  out["observed_step_s"] = observed / steps;
  double in_ops = 0;
  int64_t calls = 0;
  nlohmann::json ops = nlohmann::json::object();
  std::vector<std::pair<std::string, OpStat>> sorted(g_ops.begin(), g_ops.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  std::cerr << std::fixed << std::setprecision(3) << "decode step, batch " << batch << ", " << at::get_num_threads()
            << " thread(s): " << 1e3 * plain / steps << " ms (" << 1e3 * observed / steps << " ms observed)\n";
  for (const auto& [name, s] : sorted) {
    in_ops += s.seconds;
    calls += s.calls;
    ops[name] = {{"ms_per_step", 1e3 * s.seconds / steps}, {"calls_per_step", s.calls / steps}};
    std::cerr << "  " << std::setw(28) << std::left << name << std::right << std::setw(9) << 1e3 * s.seconds / steps
              << " ms " << std::setw(6) << std::setprecision(1) << 100 * s.seconds / observed << "% "
              << std::setw(5) << s.calls / steps << " calls/step\n"
              << std::setprecision(3);
  }
  std::cerr << "  " << std::setw(28) << std::left << "(host work between ops)" << std::right << std::setw(9)
            << 1e3 * (observed - in_ops) / steps << " ms " << std::setw(6) << std::setprecision(1)
            << 100 * (observed - in_ops) / observed << "%\n"
            << std::setprecision(3);
  out["ops"] = ops;
  out["top_level_ops_per_step"] = calls / steps;

  // 4. The fused step (model::CpuDecoder, what generate_batch runs at 1-2 rows), same inputs.
  const std::string why = model::CpuDecoder::unsupported(*m, batch);
  if (why.empty()) {
    auto fused_steps = [&] {
      model::KvCache cache(m->config(), batch, shortest + steps + 1, m->lm_head_weight().options());
      at::Tensor logits = m->forward_cached(ids, cache).to(at::kFloat);
      model::CpuDecoder dec(*m, batch);
      const double t0 = thread_cpu_s();
      for (int64_t s = 0; s < steps; ++s) {
        at::Tensor next = logits.argmax(-1);
        logits = dec.step(next, cache, {}, at::full({batch}, cache.length(), at::kLong));
      }
      return thread_cpu_s() - t0;
    };
    fused_steps();  // warm-up
    const double fused = std::min(fused_steps(), fused_steps());
    out["fused_step_s"] = fused / steps;
    std::cerr << "fused decode step (model::CpuDecoder): " << 1e3 * fused / steps << " ms\n";
  } else {
    out["fused_step_s"] = nullptr;
    std::cerr << "fused decode step: does not run here (" << why << ")\n";
  }
  out["host_between_ops_s"] = (observed - in_ops) / steps;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    ALPACA_CHECK(argc >= 5, "usage: bench_generate <model_dir> <prompts.json> <batch_size> <max_new_tokens> [bf16] "
                            "[threads=N] [unfused] [profile]");
    bool bf16 = false, do_profile = false, fused = true;
    for (int i = 5; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "bf16") {
        bf16 = true;
      } else if (a == "unfused") {
        fused = false;
      } else if (a == "profile") {
        do_profile = true;
      } else if (a.rfind("threads=", 0) == 0) {
        at::set_num_threads(std::stoi(a.substr(8)));
      } else {
        ALPACA_FAIL("bench_generate: unknown argument " << a);
      }
    }
    nlohmann::json j = nlohmann::json::parse(std::ifstream(argv[2]));
    auto prompts = j["prompts"].get<std::vector<std::vector<int64_t>>>();
    generate::GenerateOptions opts;
    opts.max_new_tokens = std::stoll(argv[4]);
    opts.eos_token_ids = j["eos_token_id"].get<std::vector<int64_t>>();
    opts.pad_token_id = j["pad_token_id"].get<int64_t>();
    opts.fused_cpu_decode = fused;
    const int64_t batch = std::stoll(argv[3]);
    model::LlamaForCausalLM m = io::load_hf_model(argv[1], bf16 ? at::kBFloat16 : at::kFloat);
    m->eval();
    if (do_profile) {
      nlohmann::json p = profile(m, prompts, opts, batch);
      p["threads"] = at::get_num_threads();
      p["batch"] = batch;
      p["dtype"] = bf16 ? "bf16" : "fp32";
      std::cout << p.dump() << "\n";
      return 0;
    }
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(0);
    {
      generate::GenerateOptions warm = opts;
      warm.max_new_tokens = 4;
      generate::generate_batch(m, {prompts[0]}, warm, gen);
    }
    const auto t0 = Clock::now();
    const std::clock_t c0 = std::clock();
    auto gens = generate::generate_all(m, prompts, opts, batch, gen);
    const double secs = seconds_since(t0);
    const double cpu_secs = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
    int64_t n = 0;
    nlohmann::json out_ids = nlohmann::json::array();
    for (const auto& g : gens) {
      n += static_cast<int64_t>(g.ids.size());
      out_ids.push_back(g.ids);
    }
    std::cout << nlohmann::json{{"new_tokens", n},         {"seconds", secs},
                                {"cpu_seconds", cpu_secs}, {"tokens_per_s", n / secs},
                                {"threads", at::get_num_threads()}, {"fused", fused},
                                {"generations", out_ids}}
                     .dump()
              << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_generate: " << e.what() << "\n";
    return 1;
  }
}
