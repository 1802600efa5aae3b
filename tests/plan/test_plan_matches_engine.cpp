// The memory planner and the FSDP engine share one unit layout (fsdp::plan_units) and, under
// QLoRA, one 4-bit blob layout (fsdp::quant_layout): for every model type (llama untied and tied,
// mistral, qwen2 with its q/k/v biases), every sharding strategy, LoRA on and off, QLoRA nf4/fp4
// nested or not, and the job's world size (mpirun 1, 2, 4), the planner's per-unit bytes equal what
// the engine allocated on this rank, and its model-state items equal the engine's memory account.
#include <gtest/gtest.h>

#include <functional>

#include "alpaca/dist/communicator.h"
#include "alpaca/fsdp/fsdp_llama.h"
#include "alpaca/model/lora.h"
#include "alpaca/optim/adamw.h"
#include "alpaca/plan/memory_plan.h"
#include "dist_test_env.h"
#include "model_test_util.h"

namespace test_plan_matches_engine {

using namespace alpaca;
using namespace alpaca::testing;

namespace {

const auto* g_env = register_job_comm(dist::CommOptions{});

struct ModelCase {
  std::string name;
  model::LlamaConfig config;
  std::vector<std::string> modules_to_save;
};

std::vector<ModelCase> model_cases() {
  // Odd sizes: every unit's padding differs by world size.
  const model::LlamaConfig base = llama_config({101, 24, 37, 3, 4, 2, 6, 64});
  std::vector<ModelCase> cases;
  cases.push_back({"llama", base, {"lm_head"}});
  model::LlamaConfig tied = base;
  tied.tie_word_embeddings = true;
  cases.push_back({"llama tied", tied, {}});
  model::LlamaConfig mistral = base;
  mistral.model_type = "mistral";
  cases.push_back({"mistral", mistral, {}});
  model::LlamaConfig qwen2 = base;
  qwen2.model_type = "qwen2";
  qwen2.attention_bias = true;
  qwen2.tie_word_embeddings = true;
  cases.push_back({"qwen2 tied", qwen2, {"embed_tokens"}});
  return cases;
}

int64_t item_bytes(const plan::MemoryPlan& p, const std::string& name) {
  for (const auto& i : p.breakdown)
    if (i.name == name) return i.device_bytes;
  return 0;
}

fsdp::FsdpPolicy policy_for(fsdp::ShardingStrategy strategy, bool lora, int world) {
  fsdp::FsdpPolicy policy;
  policy.strategy = strategy;
  policy.hybrid_shard_size = std::max(1, world / 2);  // world 4: shard over 2, replicate over 2
  policy.param_dtype = policy.reduce_dtype = lora ? at::kBFloat16 : at::kFloat;
  return policy;
}

// The planner's inputs for `policy` on CPU ranks (LoRA r=4 when `lora`, with the [PAD] token row).
plan::MemoryPlanInputs inputs_for(const ModelCase& mc, const fsdp::FsdpPolicy& policy, bool lora, int world) {
  plan::MemoryPlanInputs in;
  in.config = mc.config;
  in.num_ranks = in.ranks_per_node = world;
  in.gpu = false;
  in.strategy = policy.strategy;
  in.hybrid_shard_size = policy.hybrid_shard_size;
  in.param_dtype = in.reduce_dtype = policy.param_dtype;
  in.micro_batch = 1;
  in.seq_len = 8;
  in.quant4_type = policy.quant4_type;
  in.quant4_nested = policy.quant4_nested;
  if (lora) {
    in.lora_rank = 4;
    in.lora_modules_to_save = mc.modules_to_save;
    in.lora_token_rows = 1;
  }
  return in;
}

// The trainer's model: the meta-device LLaMA, LoRA attached as trainer_lora.cpp does it.
model::LlamaForCausalLM model_for(const ModelCase& mc, const plan::MemoryPlanInputs& in) {
  model::LlamaForCausalLM m(mc.config, at::TensorOptions().device(at::kMeta).dtype(at::kFloat));
  if (in.lora_rank > 0) {
    model::LoraOptions o;
    o.r = in.lora_rank;
    o.dropout = in.lora_dropout;
    o.modules_to_save = mc.modules_to_save;
    o.trainable_token_indices = {mc.config.vocab_size - 1};
    model::apply_lora(*m, o, 3);
  }
  return m;
}

// The plan's per-unit bytes against the engine's buffers, and its model-state items against the
// engine's memory account (AdamW: two fp32 moments).
void expect_plan_is_engine(const plan::MemoryPlan& p, const fsdp::FsdpEngine& e, const fsdp::FsdpPolicy& policy,
                           const std::string& master, const std::string& what, bool eight_bit = false,
                           bool adafactor = false, bool lion = false) {
  ASSERT_EQ(static_cast<int>(p.units.size()), e.num_units()) << what;
  for (int u = 0; u < e.num_units(); ++u) {
    const fsdp::FlatParameter* t = e.trainable_flat(u);
    const fsdp::FlatParameter* fz = e.frozen_flat(u);
    const plan::UnitBytes& ub = p.units[static_cast<size_t>(u)];
    EXPECT_EQ(ub.label, e.unit_plan().units[static_cast<size_t>(u)].label) << what;
    EXPECT_EQ(ub.train_shard_bytes, t ? t->shard().nbytes() : 0) << what << " unit " << ub.label;
    EXPECT_EQ(ub.train_shard_bytes, t ? t->grad().nbytes() : 0) << what << " unit " << ub.label;
    EXPECT_EQ(ub.frozen_shard_bytes, e.frozen_shard_bytes(u)) << what << " unit " << ub.label;
    EXPECT_EQ(ub.full_bytes, (t ? t->full_bytes() : 0) + (fz ? fz->full_bytes() : 0)) << what << " " << ub.label;
    EXPECT_EQ(ub.full_grad_bytes,
              t ? t->shard_info().padded_numel * static_cast<int64_t>(c10::elementSize(policy.reduce_dtype)) : 0)
        << what << " unit " << ub.label;
  }
  optim::AdamWOptions adamw;
  adamw.bnb_bits = eight_bit ? 8 : lion ? 32 : 0;
  adamw.adafactor = adafactor;
  adamw.lion = lion;
  optim::ShardedAdamW opt(e.optim_shards(eight_bit || adafactor), adamw);
  const fsdp::MemoryAccount acc = e.memory_account(&opt);
  EXPECT_EQ(item_bytes(p, master), acc.param_bytes + acc.frozen_bytes) << what;
  EXPECT_EQ(item_bytes(p, "fp32 gradient shards"), acc.grad_bytes) << what;
  EXPECT_EQ(item_bytes(p, adafactor ? "Adafactor statistics (row and column means, whole on every rank)"
                          : lion    ? "Lion momentum shards (exp_avg)"
                                    : "AdamW moment shards (exp_avg, exp_avg_sq)"),
            acc.optimizer_bytes)
      << what;
}

// `check(model case, strategy, "<model> <strategy>")` for every model case and sharding strategy.
void for_each_model_and_strategy(
    const std::function<void(const ModelCase&, fsdp::ShardingStrategy, const std::string&)>& check) {
  using S = fsdp::ShardingStrategy;
  for (const ModelCase& mc : model_cases())
    for (S strategy : {S::kFullShard, S::kShardGradOp, S::kNoShard, S::kHybridShard})
      check(mc, strategy, mc.name + " " + fsdp::to_string(strategy));
}

}  // namespace

TEST(PlanMatchesEngine, PerUnitBytesEqualTheEngineForEveryModelStrategyAndLora) {
  auto comm = job_comm();
  const int world = comm->world_size();
  int checked = 0;
  for_each_model_and_strategy([&](const ModelCase& mc, fsdp::ShardingStrategy strategy, const std::string& name) {
    for (bool lora : {false, true}) {
      const std::string what = name + (lora ? " LoRA" : "") + " world " + std::to_string(world);
      const fsdp::FsdpPolicy policy = policy_for(strategy, lora, world);
      const plan::MemoryPlanInputs in = inputs_for(mc, policy, lora, world);
      const plan::MemoryPlan p = plan::plan_memory(in);
      auto f = fsdp::apply_fsdp(model_for(mc, in), comm, policy);
      const std::string master = lora ? "master shards (fp32 adapters, param_dtype frozen base)" : "fp32 master shards";
      expect_plan_is_engine(p, f->engine(), policy, master, what);
      ++checked;
      // bitsandbytes' 8-bit moments (--optim adamw_8bit): codes and block scales per parameter part.
      plan::MemoryPlanInputs in8 = in;
      in8.adamw_8bit = true;
      const plan::MemoryPlan p8 = plan::plan_memory(in8);
      expect_plan_is_engine(p8, f->engine(), policy, master, what + " 8-bit AdamW", true);
      // transformers' Adafactor (--optim adafactor): row and column statistics, whole on every rank.
      plan::MemoryPlanInputs inf = in;
      inf.adafactor = true;
      expect_plan_is_engine(plan::plan_memory(inf), f->engine(), policy, master, what + " Adafactor", false, true);
      // bitsandbytes' Lion (--optim lion_8bit / lion_32bit): one moment.
      plan::MemoryPlanInputs inl = in;
      inl.lion = true;
      expect_plan_is_engine(plan::plan_memory(inl), f->engine(), policy, master, what + " Lion 32-bit", false, false, true);
      inl.adamw_8bit = true;
      expect_plan_is_engine(plan::plan_memory(inl), f->engine(), policy, master, what + " Lion 8-bit", true, false, true);
    }
  });
  EXPECT_EQ(checked, 32);
}

// QLoRA (--load_in_4bit): the planner lays each decoder layer's 4-bit blob out with the engine's own
// function (fsdp::quant_layout), so its per-unit frozen bytes are the engine's QuantStore shards,
// byte for byte, for nf4 and fp4, nested or not, every strategy and world size.
TEST(PlanMatchesEngine, QloraFrozenBytesEqualTheEnginesFourBitShards) {
  auto comm = job_comm();
  const int world = comm->world_size();
  int checked = 0;
  for_each_model_and_strategy([&](const ModelCase& mc, fsdp::ShardingStrategy strategy, const std::string& name) {
    for (const char* type : {"nf4", "fp4"}) {
      for (bool nested : {false, true}) {
        const std::string what =
            name + " QLoRA " + type + (nested ? " nested" : "") + " world " + std::to_string(world);
        fsdp::FsdpPolicy policy = policy_for(strategy, /*lora=*/true, world);
        policy.quant4_type = type;
        policy.quant4_nested = nested;
        const plan::MemoryPlanInputs in = inputs_for(mc, policy, /*lora=*/true, world);
        const plan::MemoryPlan p = plan::plan_memory(in);
        auto f = fsdp::apply_fsdp(model_for(mc, in), comm, policy);
        EXPECT_GT(f->engine().memory_account().quant4_params, 0) << what;
        expect_plan_is_engine(p, f->engine(), policy,
                              "master shards (fp32 adapters, 4-bit frozen layers, param_dtype root)", what);
        ++checked;
      }
    }
  });
  EXPECT_EQ(checked, 64);
}

}  // namespace test_plan_matches_engine
