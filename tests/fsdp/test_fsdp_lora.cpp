// LoRA under the FSDP engine, under real mpirun (worlds 1, 2, 4): the frozen base lives in its
// own flat buffer in param_dtype only (no master, grad or optimizer state), the adapters train with
// fp32 masters and sharded AdamW; per-rank model state = 2 Psi / N + 16 psi / N; training matches
// a plain single-process LibTorch loop for every strategy (with offload / checkpointing);
// dropout under activation checkpointing replays the same masks; adapter-only export and row
// gathers never need the base in full.
#include <gtest/gtest.h>

#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include <iostream>
#include <map>

#include "alpaca/fsdp/fsdp_llama.h"
#include "alpaca/model/llama.h"
#include "alpaca/model/lora.h"
#include "alpaca/optim/grad_clip.h"
#include "fsdp_test_env.h"
#include "llama_reference.h"
#include "model_test_util.h"

namespace alpaca::testing::test_fsdp_lora {
namespace {

const auto* g_env = register_job_comm(fsdp_job_options());

constexpr int64_t kVocab = 37;

model::LlamaConfig tiny() { return llama_config({kVocab, 16, 22, 3, 4, 2, 4, 32}); }

model::LoraOptions lora(double dropout = 0.0) {
  model::LoraOptions o;
  o.r = 4;
  o.alpha = 8;
  o.dropout = dropout;
  o.target_modules = {"q_proj", "v_proj", "down_proj"};
  return o;
}

model::LlamaForCausalLM make(double dropout = 0.0) {
  model::LlamaForCausalLM m(tiny());
  model::init_weights(m, 11);
  model::apply_lora(*m, lora(dropout), 5);
  // B = 0 at init would make the first step's A gradient zero; perturb B so A trains from step 1.
  at::NoGradGuard ng;
  at::Generator gen = at::detail::createCPUGenerator(9);
  for (auto& item : m->named_parameters(true))
    if (item.key().ends_with("lora_B.weight")) item.value().normal_(0.0, 0.1, gen);
  return m;
}

// Plain LibTorch: the whole global batch, torch AdamW on the trainable parameters only.
ParamMap reference(int steps) {
  model::LlamaForCausalLM m = make();
  std::vector<at::Tensor> trainable = trainable_parameters(m);
  torch::optim::AdamW opt(trainable, torch::optim::AdamWOptions(kLr).weight_decay(kWd));
  return run_llama_reference(m, opt, trainable, make_global_batch(kVocab, kGlobal, kSeqLen, 5), steps, kMaxNorm);
}

struct TrainRun {
  std::unique_ptr<fsdp::FsdpLlama> fsdp;
  std::unique_ptr<optim::ShardedAdamW> opt;
};

TrainRun train(const FsdpPolicy& policy, int accum, int steps, double dropout = 0.0, uint64_t rng_seed = 0) {
  TrainRun r;
  r.fsdp = fsdp::apply_fsdp(make(dropout), job_comm(), policy);
  r.opt = std::make_unique<optim::ShardedAdamW>(r.fsdp->engine().optim_shards(), optim::AdamWOptions{0.9, 0.999, 1e-8, kWd});
  dist::Communicator& comm = *job_comm();
  at::manual_seed(rng_seed + static_cast<uint64_t>(comm.rank()));
  train_fsdp_steps(*r.fsdp, *r.opt, make_global_batch(kVocab, kGlobal, kSeqLen, 5), accum, steps, kLr, kMaxNorm, comm);
  return r;
}

ParamMap exported(fsdp::FsdpEngine& eng, bool trainable_only = false) {
  ParamMap out;
  auto sink = [&](const std::string& n, const at::Tensor& t) { out[n] = t; };
  if (trainable_only) eng.export_trainable_state(sink, /*all_ranks=*/true);
  else eng.export_full_state(sink, /*all_ranks=*/true);
  return out;
}

TEST(FsdpLora, TrainingMatchesUnshardedLoopForEveryStrategy) {
  const int world = job_comm()->world_size();
  const ParamMap ref = reference(3);
  const ParamMap init = [] {
    ParamMap m;
    for (const auto& p : make()->named_parameters()) m[p.key()] = p.value().detach().clone();
    return m;
  }();
  for (const StrategyCase& c : strategy_cases(world)) {
    TrainRun r = train(policy_of(c), c.accum, 3);
    const std::string what = c.name();
    ParamMap got = exported(r.fsdp->engine());
    ASSERT_EQ(got.size(), ref.size()) << what;
    double worst = 0;
    for (const auto& [n, w] : ref) {
      const bool adapter = model::is_lora_param(n);
      if (!adapter) {  // frozen: bitwise the initial values (fp32 param_dtype here)
        EXPECT_TRUE(at::equal(got.at(n), init.at(n))) << what << " frozen " << n << " changed";
        continue;
      }
      EXPECT_FALSE(at::equal(w, init.at(n))) << n << " did not train in the reference";
      const double e = (got.at(n) - w).abs().max().item<double>() / w.abs().max().item<double>();
      worst = std::max(worst, e);
      EXPECT_LE(e, 1e-5) << what << " " << n;
    }
    if (job_comm()->rank() == 0) std::cout << "[lora] world " << world << " " << what << ": worst " << worst << "\n";
    // Adapter-only export: exactly the adapters, the same values.
    ParamMap adapters = exported(r.fsdp->engine(), /*trainable_only=*/true);
    EXPECT_EQ(adapters.size(), 3u * 3u * 2u) << what;
    for (const auto& [n, t] : adapters) EXPECT_TRUE(at::equal(t, got.at(n))) << n;
    EXPECT_EQ(r.fsdp->engine().memory_account().grad_bytes, r.fsdp->engine().memory_account().param_bytes);
  }
}

TEST(FsdpLora, PerRankModelStateIsTwoPsiPlusSixteenPsiOverN) {
  // A ~100M-parameter LLaMA on the meta device (no values needed: the counters are what is tested),
  // bf16 compute, LoRA r = 16 on every linear but lm_head.
  const model::LlamaConfig c = llama_100m();
  model::LlamaForCausalLM m(c, at::TensorOptions().device(at::kMeta));
  model::LoraOptions o;
  o.r = 16;
  o.target_modules = {"all-linear"};
  model::apply_lora(*m, o, 1);
  int64_t base = 0, adapters = 0;
  for (const auto& p : m->parameters()) (p.requires_grad() ? adapters : base) += p.numel();
  FsdpPolicy p;
  p.param_dtype = at::kBFloat16;
  p.reduce_dtype = at::kBFloat16;
  p.sync_module_states = false;
  auto f = fsdp::apply_fsdp(std::move(m), job_comm(), p);
  optim::ShardedAdamW opt(f->engine().optim_shards(), optim::AdamWOptions{});
  const fsdp::MemoryAccount acc = f->engine().memory_account(&opt);
  const int n = job_comm()->world_size();
  const int units = f->engine().num_units();
  // Exact up to each unit's padding (fewer than N elements per flat buffer).
  const double want = (2.0 * static_cast<double>(base) + 16.0 * static_cast<double>(adapters)) / n;
  const double slack = 2.0 * units * n * 16.0;
  EXPECT_NEAR(static_cast<double>(acc.persistent_bytes()), want, slack);
  EXPECT_NEAR(static_cast<double>(acc.frozen_bytes), 2.0 * base / n, 2.0 * units * n);
  EXPECT_NEAR(static_cast<double>(acc.param_bytes), 4.0 * adapters / n, 4.0 * units * n);
  EXPECT_EQ(acc.grad_bytes, acc.param_bytes);           // fp32 grads for the adapters only
  EXPECT_EQ(acc.optimizer_bytes, 2 * acc.param_bytes);  // exp_avg + exp_avg_sq, adapters only
  if (job_comm()->rank() == 0)
    std::cout << "[lora memory] world " << n << ": base Psi = " << base << ", adapters psi = " << adapters
              << "; per-rank model state " << acc.persistent_bytes() << " B, formula 2Psi/N + 16psi/N = "
              << static_cast<int64_t>(want) << " B (frozen " << acc.frozen_bytes << ", masters " << acc.param_bytes
              << ", grads " << acc.grad_bytes << ", adam " << acc.optimizer_bytes << ")\n";
}

TEST(FsdpLora, CheckpointedDropoutReplaysTheForwardMasks) {
  FsdpPolicy plain, ckpt;
  ckpt.activation_checkpointing = true;
  TrainRun a = train(plain, 1, 2, /*dropout=*/0.3, /*rng_seed=*/77);
  TrainRun b = train(ckpt, 1, 2, /*dropout=*/0.3, /*rng_seed=*/77);
  TrainRun c = train(plain, 1, 2, /*dropout=*/0.3, /*rng_seed=*/78);
  ParamMap pa = exported(a.fsdp->engine(), true), pb = exported(b.fsdp->engine(), true),
           pc = exported(c.fsdp->engine(), true);
  double worst = 0, other = 0;
  for (const auto& [n, t] : pa) {
    worst = std::max(worst, (t - pb.at(n)).abs().max().item<double>());
    other = std::max(other, (t - pc.at(n)).abs().max().item<double>());
  }
  EXPECT_LE(worst, 1e-6) << "checkpointing changed the dropout masks";
  EXPECT_GT(other, 1e-4) << "dropout had no effect (another seed gives the same result)";
}

TEST(FsdpLora, GatherRowsAndPartialLoads) {
  FsdpPolicy p;
  TrainRun r = train(p, 1, 1);
  fsdp::FsdpEngine& eng = r.fsdp->engine();
  ParamMap full = exported(eng);
  for (const char* name : {"model.embed_tokens.weight", "lm_head.weight"}) {
    at::Tensor rows = eng.gather_rows(name, kVocab - 2, kVocab);
    EXPECT_TRUE(at::equal(rows, full.at(name).narrow(0, kVocab - 2, 2))) << name;
  }
  // Load only the adapters from a map: the base keeps its values.
  ParamMap changed;
  for (const auto& [n, t] : full) changed[n] = model::is_lora_param(n) ? t + 1.0 : t * 0.0;
  auto reader = [&](const std::string& n, const std::vector<int64_t>&, int64_t begin, int64_t end, at::Tensor out) {
    out.copy_(changed.at(n).reshape({-1}).narrow(0, begin, end - begin));
  };
  for (bool rank0_only : {false, true}) {
    TrainRun fresh;
    fresh.fsdp = fsdp::apply_fsdp(make(), job_comm(), p);
    fresh.fsdp->engine().load_parameters(reader, rank0_only, [](const std::string& n) { return model::is_lora_param(n); });
    ParamMap again = exported(fresh.fsdp->engine());
    for (const auto& [n, t] : again) {
      if (model::is_lora_param(n)) EXPECT_TRUE(at::equal(t, changed.at(n))) << n;
      else EXPECT_GT(t.abs().max().item<double>(), 0.0) << n << " was overwritten";
    }
  }
}

}  // namespace
}  // namespace alpaca::testing::test_fsdp_lora
