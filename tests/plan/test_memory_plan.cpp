// The memory planner's arithmetic (plan/memory_plan.h) and the estimate-memory command: exact
// model-state bytes, where offload and checkpointing move memory, the largest fitting
// micro-batch, DeepSpeed's ZeRO-3 formula, the 7B Alpaca configuration, QLoRA's 4-bit base, the
// JSON contract and the errors. (Estimate vs measurement: tests/train/test_memory_measured.cpp.)
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "alpaca/plan/memory_plan.h"
#include "alpaca/util/error.h"
#include "test_util.h"
#include "model_test_util.h"

namespace test_memory_plan {

using namespace alpaca;
using namespace alpaca::testing;

namespace {

model::LlamaConfig llama_7b() { return llama_config({32000, 4096, 11008, 32, 32, 32}); }

model::LlamaConfig tiny() { return llama_config({1000, 64, 172, 3, 4, 2}); }

int64_t item(const plan::MemoryPlan& p, const std::string& name, bool host = false) {
  for (const auto& i : p.breakdown)
    if (i.name == name) return host ? i.host_bytes : i.device_bytes;
  return -1;
}

constexpr int64_t kGiB = int64_t{1} << 30;

// A model directory for estimate-memory: only LLaMA-7B's config.json.
void write_llama_7b_config(const std::filesystem::path& dir) {
  const nlohmann::json cfg = {{"model_type", "llama"}, {"vocab_size", 32000}, {"hidden_size", 4096},
                              {"intermediate_size", 11008}, {"num_hidden_layers", 32},
                              {"num_attention_heads", 32}, {"num_key_value_heads", 32}};
  std::ofstream(dir / "config.json") << cfg.dump();
}

}  // namespace

TEST(MemoryPlan, ModelStatesAreSixteenBytesPerShardedParameterWithPadding) {
  plan::MemoryPlanInputs in;
  in.config = tiny();
  in.num_ranks = 3;
  in.gpu = false;
  const auto p = plan::plan_memory(in);
  // Per layer: q 64x64, k/v 64x32 each (GQA), o 64x64, gate/up/down 64x172, two norms.
  const int64_t layer = 64 * 64 * 2 + 2 * 64 * 32 + 3 * 64 * 172 + 2 * 64;
  // The root is two units: embed_tokens, and [norm, lm_head]; each is padded on its own.
  auto shard = [](int64_t n) { return (n + 2) / 3; };
  const int64_t shards = 3 * shard(layer) + shard(1000 * 64) + shard(1000 * 64 + 64);
  EXPECT_EQ(item(p, "fp32 master shards"), 4 * shards);
  EXPECT_EQ(item(p, "fp32 gradient shards"), 4 * shards);
  EXPECT_EQ(item(p, "AdamW moment shards (exp_avg, exp_avg_sq)"), 8 * shards);
  int64_t sum = 0;
  for (const auto& i : p.breakdown) sum += i.device_bytes;
  EXPECT_EQ(sum, p.device_allocated_bytes);
  EXPECT_EQ(p.device_total_bytes, p.device_allocated_bytes);  // CPU ranks: no margin, no CUDA context
}

// --optim adamw_8bit: bitsandbytes keeps 1 byte per element and moment plus a 4-byte scale per 256
// elements of each parameter of at least 4096 elements; embeddings (transformers' override) and
// smaller parameters keep fp32 moments. At one rank every parameter is whole.
TEST(MemoryPlan, EightBitAdamWMomentsAreCodesAndBlockScales) {
  plan::MemoryPlanInputs in;
  in.config = tiny();
  in.gpu = false;
  in.adamw_8bit = true;
  const auto p = plan::plan_memory(in);
  auto eight = [](int64_t n) { return 2 * n + 8 * ((n + 255) / 256); };
  auto fp32 = [](int64_t n) { return 8 * n; };
  // q and o 64x64 (4096: 8-bit), k and v 64x32 (fp32), gate/up/down 64x172, two norms.
  const int64_t layer = 2 * eight(64 * 64) + 2 * fp32(64 * 32) + 3 * eight(64 * 172) + 2 * fp32(64);
  const int64_t want = 3 * layer + fp32(1000 * 64) /* embed_tokens */ + eight(1000 * 64) /* lm_head */ + fp32(64);
  EXPECT_EQ(item(p, "AdamW moment shards (exp_avg, exp_avg_sq)"), want);
  in.adamw_8bit = false;
  EXPECT_GT(item(plan::plan_memory(in), "AdamW moment shards (exp_avg, exp_avg_sq)"), 2 * want);
}

// --optim lion_*: bitsandbytes' Lion keeps one moment: half of AdamW's, at 8 and at 32 bits.
TEST(MemoryPlan, LionKeepsOneMoment) {
  plan::MemoryPlanInputs in;
  in.config = tiny();
  in.gpu = false;
  const std::string adamw = "AdamW moment shards (exp_avg, exp_avg_sq)", lion = "Lion momentum shards (exp_avg)";
  const int64_t adamw32 = item(plan::plan_memory(in), adamw);
  in.lion = true;
  EXPECT_EQ(2 * item(plan::plan_memory(in), lion), adamw32);
  in.adamw_8bit = true;
  const int64_t lion8 = item(plan::plan_memory(in), lion);
  in.lion = false;
  EXPECT_EQ(2 * lion8, item(plan::plan_memory(in), adamw));
}

// --optim adafactor: a matrix keeps a mean per row and per column, a vector one per element; every
// rank holds them all, so 7B at 4 ranks keeps ~19 MiB where AdamW's moment shards are 12.5 GiB.
TEST(MemoryPlan, AdafactorKeepsRowAndColumnStatisticsOnEveryRank) {
  plan::MemoryPlanInputs in;
  in.config = tiny();
  in.gpu = false;
  in.adafactor = true;
  const std::string name = "Adafactor statistics (row and column means, whole on every rank)";
  // q and o 64x64, k and v 64x32, gate/up 172x64 and down 64x172, two norms of 64.
  const int64_t layer = 2 * (64 + 64) + 2 * (32 + 64) + 3 * (64 + 172) + 2 * 64;
  EXPECT_EQ(item(plan::plan_memory(in), name), 4 * (3 * layer + 2 * (1000 + 64) + 64));
  in.config = llama_7b();
  in.num_ranks = in.ranks_per_node = 4;
  const auto p = plan::plan_memory(in);
  const int64_t layer7 = 4 * (4096 + 4096) + 3 * (11008 + 4096) + 2 * 4096;
  EXPECT_EQ(item(p, name), 4 * (32 * layer7 + 2 * (32000 + 4096) + 4096));
  EXPECT_LT(item(p, name), 20 * (int64_t{1} << 20));
  in.adafactor = false;
  EXPECT_GT(item(plan::plan_memory(in), "AdamW moment shards (exp_avg, exp_avg_sq)"), 12 * kGiB);
}

TEST(MemoryPlan, OffloadMovesStatesToTheHostAndCheckpointingShrinksActivations) {
  plan::MemoryPlanInputs in;
  in.config = llama_7b();
  in.num_ranks = 4;
  in.ranks_per_node = 4;
  in.micro_batch = 4;
  in.seq_len = 512;
  in.param_dtype = in.reduce_dtype = at::kBFloat16;
  const auto base = plan::plan_memory(in);
  in.offload = true;
  const auto off = plan::plan_memory(in);
  const int64_t states = item(base, "fp32 master shards") + item(base, "fp32 gradient shards") +
                         item(base, "AdamW moment shards (exp_avg, exp_avg_sq)");
  EXPECT_GT(states, 24 * kGiB);  // 16 B x 6.7e9 / 4 = 25.1 GiB
  EXPECT_EQ(item(off, "fp32 master shards"), -1);
  EXPECT_EQ(item(off, "fp32 master shards (offloaded, pinned)", true), item(base, "fp32 master shards"));
  EXPECT_NEAR(static_cast<double>(base.device_allocated_bytes - off.device_allocated_bytes), static_cast<double>(states),
              0.02 * static_cast<double>(states));
  in.checkpointing = true;
  const auto ck = plan::plan_memory(in);
  EXPECT_LT(ck.device_allocated_bytes, off.device_allocated_bytes / 3);
  EXPECT_EQ(ck.checkpointed_per_layer_bytes, 4 * 512 * 4096 * 2);  // each layer's bf16 input
  // Activations grow linearly with the micro-batch.
  in.micro_batch = 8;
  EXPECT_EQ(plan::plan_memory(in).activations_per_layer_bytes, 2 * ck.activations_per_layer_bytes);
}

// --save_async keeps a host copy of what each rank writes (issue 30): fp32 trainable shards and
// both moments, 12 bytes per trainable shard element, a 1/replicas part under hybrid/no_shard.
TEST(MemoryPlan, AsyncSavesCountTheirStagingCopyOnTheHost) {
  plan::MemoryPlanInputs in;
  in.config = llama_7b();
  in.num_ranks = 4;
  in.ranks_per_node = 2;
  const auto sync = plan::plan_memory(in);
  in.async_checkpoint = true;
  const auto async = plan::plan_memory(in);
  const std::string name = "--save_async staging copy (fp32 trainable shards + AdamW moments)";
  const int64_t copy = item(async, name, /*host=*/true);
  EXPECT_EQ(item(sync, name, true), -1);
  EXPECT_EQ(copy, 3 * item(async, "fp32 master shards"));  // full fine-tune: every shard trains
  EXPECT_EQ(async.host_total_bytes - sync.host_total_bytes, copy);
  EXPECT_EQ(async.device_allocated_bytes, sync.device_allocated_bytes);
  in.strategy = fsdp::ShardingStrategy::kHybridShard;  // shard over 2, two replicas: half each
  const auto hybrid = plan::plan_memory(in);
  EXPECT_NEAR(static_cast<double>(item(hybrid, name, true)), 1.5 * static_cast<double>(item(hybrid, "fp32 master shards")),
              64.0);
}

TEST(MemoryPlan, AlpacaReadmeConfigurationFitsFourA100s80GAtBatchFour) {
  plan::MemoryPlanInputs in;
  in.config = llama_7b();
  in.config.vocab_size = 32001;  // + [PAD]
  in.num_ranks = in.ranks_per_node = 4;
  in.micro_batch = 4;
  in.seq_len = 512;
  in.param_dtype = in.reduce_dtype = at::kBFloat16;
  in.device_memory_bytes = 80 * kGiB;
  const auto p = plan::plan_memory(in);
  EXPECT_TRUE(p.fits()) << p.device_total_bytes;  // the Alpaca README's published run
  const int64_t max_b = plan::largest_fitting_micro_batch(in);
  EXPECT_GE(max_b, 4);
  in.micro_batch = max_b;
  EXPECT_TRUE(plan::plan_memory(in).fits());
  in.micro_batch = max_b + 1;
  EXPECT_FALSE(plan::plan_memory(in).fits());
  // 40 GB cards do not hold full_shard without offload at batch 4.
  in.micro_batch = 4;
  in.device_memory_bytes = 40 * kGiB;
  EXPECT_FALSE(plan::plan_memory(in).fits());
  in.device_memory_bytes = 0;
  in.host_memory_bytes = 0;
  EXPECT_EQ(plan::largest_fitting_micro_batch(in), -1);  // nothing to fit in
}

TEST(MemoryPlan, DeepSpeedZero3FormulaMatchesItsDefinition) {
  plan::MemoryPlanInputs in;
  in.config = llama_7b();
  in.num_ranks = in.ranks_per_node = 4;
  const auto p = plan::plan_memory(in);
  EXPECT_EQ(p.deepspeed.total_params, 6738415616);
  EXPECT_EQ(p.deepspeed.largest_layer_params, 32000 * 4096);
  // gpu = 4 x largest + 18 x total / gpus; cpu = largest x 4 x gpus_per_node x 1.5 (zero_init).
  EXPECT_EQ(p.deepspeed.gpu_bytes_per_gpu, 4 * 131072000 + 18 * 6738415616 / 4);
  EXPECT_EQ(p.deepspeed.cpu_bytes_per_node, static_cast<int64_t>(131072000.0 * 4 * 4 * 1.5));
  in.offload = true;
  const auto o = plan::plan_memory(in);
  EXPECT_EQ(o.deepspeed.gpu_bytes_per_gpu, 4 * 131072000);
  EXPECT_EQ(o.deepspeed.cpu_bytes_per_node, static_cast<int64_t>(6738415616.0 * 18 * 1.5));
}

TEST(MemoryPlan, LadderHasSixRungsAndLoraNeedsLess) {
  plan::MemoryPlanInputs in;
  in.config = llama_7b();
  in.num_ranks = in.ranks_per_node = 2;
  in.micro_batch = 1;
  in.param_dtype = in.reduce_dtype = at::kBFloat16;
  in.device_memory_bytes = 24 * kGiB;
  in.host_memory_bytes = 256 * kGiB;
  const auto rungs = plan::plan_ladder(in);
  ASSERT_EQ(rungs.size(), 6u);
  EXPECT_FALSE(rungs[0].plan.fits());  // 7B full_shard on 2 x 24 GB: no
  EXPECT_TRUE(rungs[2].plan.fits());   // + offload + checkpointing: yes
  EXPECT_GT(rungs[2].max_micro_batch, 1);
  EXPECT_LT(rungs[3].plan.device_allocated_bytes, rungs[0].plan.device_allocated_bytes / 2);
  EXPECT_LT(rungs[4].plan.device_allocated_bytes, rungs[3].plan.device_allocated_bytes);
  // The qlora rung: the LoRA rung on a 4-bit base (nf4, nested), the layers' base at ~4.13 bits.
  EXPECT_EQ(rungs[5].inputs.quant4_type, "nf4");
  EXPECT_TRUE(rungs[5].inputs.quant4_nested);
  EXPECT_LT(rungs[5].plan.device_allocated_bytes + 4 * kGiB, rungs[3].plan.device_allocated_bytes);
  EXPECT_TRUE(rungs[3].inputs.quant4_type.empty());
}

TEST(MemoryPlan, QloraStoresTheLayersBaseAsBitsandbytesBytesAndFits7BOn12GB) {
  plan::MemoryPlanInputs in;
  in.config = llama_7b();
  in.micro_batch = 1;
  in.seq_len = 512;
  in.param_dtype = in.reduce_dtype = at::kBFloat16;
  in.checkpointing = true;
  in.lora_rank = 16;
  in.device_memory_bytes = 12 * kGiB;
  const auto lora = plan::plan_memory(in);
  in.quant4_type = "nf4";
  in.quant4_nested = true;
  const auto q = plan::plan_memory(in);
  // bitsandbytes' bytes of one layer: per linear the packed codes, one 8-bit absmax code per block
  // of 64 and one fp32 scale per 256 codes (7B's shapes need no alignment); the two norms in bf16.
  auto linear = [](int64_t n) { return n / 2 + n / 64 + 4 * ((n / 64 + 255) / 256); };
  const int64_t layer = 4 * linear(4096 * 4096) + 3 * linear(4096 * 11008) + 2 * 4096 * 2;
  const int64_t root = 2 * (32000 * 4096) + 2 * (32000 * 4096 + 4096);  // embed_tokens, [norm, lm_head]
  const int64_t train = 32 * 4 * (16 * 4096);                           // q, v: A 16 x 4096, B 4096 x 16
  EXPECT_EQ(q.units[0].frozen_shard_bytes, layer);
  EXPECT_EQ(item(q, "master shards (fp32 adapters, 4-bit frozen layers, param_dtype root)"), 4 * train + 32 * layer + root);
  const double bits = 8.0 * static_cast<double>(layer - 2 * 4096 * 2) / (4.0 * 4096 * 4096 + 3.0 * 4096 * 11008);
  EXPECT_NEAR(bits, 4.127, 0.001);
  // The same activations and gathered (dequantized, bf16) units; only the stored base shrinks.
  EXPECT_EQ(q.activations_per_layer_bytes, lora.activations_per_layer_bytes);
  EXPECT_EQ(q.units[0].full_bytes, lora.units[0].full_bytes);
  EXPECT_FALSE(lora.fits());  // the bf16 base alone is 13.5 GB
  EXPECT_TRUE(q.fits());
  // Without nested quantization: 4.5 bits (an fp32 absmax per block of 64).
  in.quant4_nested = false;
  EXPECT_EQ(plan::plan_memory(in).units[0].frozen_shard_bytes,
            (4 * 4096 * 4096 + 3 * 4096 * 11008) / 64 * 36 + 2 * 4096 * 2);
  // At two ranks each keeps half of every padded blob.
  in.num_ranks = in.ranks_per_node = 2;
  EXPECT_EQ(plan::plan_memory(in).units[0].frozen_shard_bytes,
            ((4 * 4096 * 4096 + 3 * 4096 * 11008) / 64 * 36 + 2 * 4096 * 2) / 2);
  // A 4-bit base trains only an adapter; an unknown quant type is named.
  in.quant4_type = "int4";
  EXPECT_THROW(plan::plan_memory(in), alpaca::Error);
  in.quant4_type = "nf4";
  in.lora_rank = 0;
  EXPECT_THROW(plan::plan_memory(in), alpaca::Error);
}

TEST(MemoryPlan, LoraStatesAreFp32AdaptersAndAParamDtypeFrozenBase) {
  plan::MemoryPlanInputs in;
  in.config = tiny();
  in.num_ranks = 2;
  in.gpu = false;
  in.param_dtype = in.reduce_dtype = at::kBFloat16;
  in.lora_rank = 8;
  const auto p = plan::plan_memory(in);
  // Adapters on q (64 -> 64) and v (64 -> 32): A (r x in) + B (out x r) per layer; everything else frozen.
  const int64_t adapters = 8 * (64 + 64) + 8 * (64 + 32);
  const int64_t layer = 64 * 64 * 2 + 2 * 64 * 32 + 3 * 64 * 172 + 2 * 64;
  auto shard = [](int64_t n) { return (n + 1) / 2; };
  // Frozen root: embed_tokens, and [norm, lm_head] (two units).
  const int64_t train = 3 * shard(adapters), frozen = 3 * shard(layer) + shard(1000 * 64) + shard(1000 * 64 + 64);
  EXPECT_EQ(item(p, "master shards (fp32 adapters, param_dtype frozen base)"), 4 * train + 2 * frozen);
  EXPECT_EQ(item(p, "fp32 gradient shards"), 4 * train);
  EXPECT_EQ(item(p, "AdamW moment shards (exp_avg, exp_avg_sq)"), 8 * train);
  EXPECT_EQ(item(p, "fused loss: fp32 lm_head gradient"), -1);  // the head is frozen
  // Every linear, no dropout: more adapter state, and the inputs saved once per reader group;
  // dropout keeps a mask and a masked copy per adapted linear.
  in.lora_target_modules = {"all-linear"};
  in.lora_dropout = 0;
  const auto all = plan::plan_memory(in);
  EXPECT_GT(item(all, "fp32 gradient shards"), 4 * item(p, "fp32 gradient shards"));
  in.lora_dropout = 0.1;
  EXPECT_GT(plan::plan_memory(in).activations_per_layer_bytes, all.activations_per_layer_bytes);
  // modules_to_save lm_head: the head trains in full (its fp32 gradient in the fused loss, its states).
  in.lora_target_modules.clear();
  in.lora_modules_to_save = {"lm_head"};
  const auto head = plan::plan_memory(in);
  EXPECT_EQ(item(head, "fp32 gradient shards"), 4 * (train + shard(1000 * 64)));
  EXPECT_EQ(item(head, "fused loss: fp32 lm_head gradient"), 4 * 1000 * 64);
  // train.py's added [PAD] row trains as a trainable-token delta (1 x D) per frozen table.
  in.lora_token_rows = 1;
  EXPECT_EQ(item(plan::plan_memory(in), "fp32 gradient shards"), 4 * (train + shard(1000 * 64 + 64)));
  in.lora_modules_to_save.clear();
  EXPECT_EQ(item(plan::plan_memory(in), "fp32 gradient shards"), 4 * (train + shard(2 * 64)));
  in.config.tie_word_embeddings = true;  // one shared delta
  EXPECT_EQ(item(plan::plan_memory(in), "fp32 gradient shards"), 4 * (train + shard(64)));
  in.config.tie_word_embeddings = false;
  in.lora_token_rows = 0;
  // What the planner does not model is an error, not a silent full-model estimate.
  in.lora_modules_to_save = {"model.norm"};
  EXPECT_THROW(plan::plan_memory(in), alpaca::Error);
  in.lora_modules_to_save.clear();
  in.lora_target_modules = {"rotary_emb"};
  EXPECT_THROW(plan::plan_memory(in), alpaca::Error);
}

TEST(EstimateMemoryCommand, UsePeftEstimatesTheGivenLoraConfiguration) {
  TempDir dir("estimate_peft");
  write_llama_7b_config(dir.path());
  const std::string base = train_bin() + " estimate-memory --json --model_name_or_path " + dir.path().string() +
                           " --bf16 True --per_device_train_batch_size 4 --model_max_length 512 --fsdp 'full_shard "
                           "auto_wrap' --num_gpus 2 --gpu_memory_gb 24";
  auto estimate = [&](const std::string& extra) {
    std::string out;
    EXPECT_EQ(run_command(base + extra + " 2>&1", &out), 0) << out;
    return nlohmann::json::parse(out);
  };
  const auto full = estimate("");
  const auto lora = estimate(" --use_peft True --lora_r 8");
  const auto all = estimate(" --use_peft True --lora_r 8 --lora_target_modules all-linear --lora_dropout 0");
  // The same inputs through the library: q_proj v_proj at r = 8, dropout 0.05; a frozen bf16 base.
  plan::MemoryPlanInputs in;
  in.config = llama_7b();
  in.config.vocab_size = 32001;  // + [PAD]: the config names no pad token
  in.lora_token_rows = 1;        // which LoRA trains as a trainable-token delta per table
  in.micro_batch = 4;
  in.seq_len = 512;
  in.num_ranks = in.ranks_per_node = 2;
  in.param_dtype = in.reduce_dtype = at::kBFloat16;
  in.device_memory_bytes = 24 * kGiB;
  in.lora_rank = 8;
  EXPECT_EQ(lora["device_allocated_bytes"].get<int64_t>(), plan::plan_memory(in).device_allocated_bytes);
  EXPECT_LT(lora["device_allocated_bytes"].get<int64_t>(), full["device_allocated_bytes"].get<int64_t>() / 2);
  EXPECT_NE(all["device_allocated_bytes"].get<int64_t>(), lora["device_allocated_bytes"].get<int64_t>());
  in.lora_target_modules = {"all-linear"};
  in.lora_dropout = 0;
  EXPECT_EQ(all["device_allocated_bytes"].get<int64_t>(), plan::plan_memory(in).device_allocated_bytes);
  // The rungs stay the ladder's, whatever the given run is.
  EXPECT_EQ(lora["rungs"][0]["device_allocated_bytes"], full["rungs"][0]["device_allocated_bytes"]);
  EXPECT_EQ(lora["rungs"][3]["device_allocated_bytes"], all["rungs"][3]["device_allocated_bytes"]);
  bool named = false;
  for (const auto& b : lora["breakdown"])
    named |= b["name"].get<std::string>() == "master shards (fp32 adapters, param_dtype frozen base)";
  EXPECT_TRUE(named) << lora.dump();
  std::string out;
  EXPECT_NE(run_command(base + " --use_peft True --lora_modules_to_save model.norm 2>&1", &out), 0);
  EXPECT_NE(out.find("model.norm"), std::string::npos) << out;
  EXPECT_NE(out.find("embed_tokens and lm_head"), std::string::npos) << out;
}

TEST(EstimateMemoryCommand, LoadIn4bitEstimatesTheQloraConfiguration) {
  TempDir dir("estimate_qlora");
  write_llama_7b_config(dir.path());
  const std::string base = train_bin() + " estimate-memory --json --model_name_or_path " + dir.path().string() +
                           " --bf16 True --per_device_train_batch_size 1 --model_max_length 512 --fsdp 'full_shard "
                           "auto_wrap' --gradient_checkpointing True --num_gpus 1 --gpu_memory_gb 12 --use_peft True"
                           " --lora_r 16";
  std::string out;
  ASSERT_EQ(run_command(base + " --load_in_4bit True --use_bnb_nested_quant True 2>&1", &out), 0) << out;
  const auto q = nlohmann::json::parse(out);
  plan::MemoryPlanInputs in;
  in.config = llama_7b();
  in.config.vocab_size = 32001;  // + [PAD]
  in.lora_token_rows = 1;
  in.seq_len = 512;
  in.param_dtype = in.reduce_dtype = at::kBFloat16;
  in.checkpointing = true;
  in.device_memory_bytes = 12 * kGiB;
  in.lora_rank = 16;
  in.quant4_type = "nf4";
  in.quant4_nested = true;
  EXPECT_EQ(q["device_total_bytes"].get<int64_t>(), plan::plan_memory(in).device_total_bytes);
  EXPECT_TRUE(q["fits"].get<bool>()) << out;
  EXPECT_EQ(q["rungs"].size(), 6u);
  EXPECT_EQ(q["rungs"][5]["name"].get<std::string>(), "QLoRA r=16, nf4 nested (+ gradient_checkpointing)");
  ASSERT_EQ(run_command(base + " --load_in_4bit True --bnb_4bit_quant_type fp4 2>&1", &out), 0) << out;
  in.quant4_type = "fp4";
  in.quant4_nested = false;
  EXPECT_EQ(nlohmann::json::parse(out)["device_total_bytes"].get<int64_t>(), plan::plan_memory(in).device_total_bytes);
  // Errors name the fix: a 4-bit base without --use_peft, an unknown quant type.
  EXPECT_NE(run_command(train_bin() + " estimate-memory --model_name_or_path " + dir.path().string() +
                            " --load_in_4bit True 2>&1", &out), 0);
  EXPECT_NE(out.find("--use_peft"), std::string::npos) << out;
  EXPECT_NE(run_command(base + " --load_in_4bit True --bnb_4bit_quant_type int4 2>&1", &out), 0);
  EXPECT_NE(out.find("int4"), std::string::npos) << out;
}

TEST(EstimateMemoryCommand, JsonHasTheContractFieldsAndErrorsNameTheFix) {
  TempDir dir("estimate_cmd");
  write_llama_7b_config(dir.path());
  std::string out;
  ASSERT_EQ(run_command(train_bin() + " estimate-memory --model_name_or_path " + dir.path().string() +
                            " --bf16 True --per_device_train_batch_size 4 --model_max_length 512 --fsdp 'full_shard "
                            "auto_wrap' --num_gpus 4 --gpu_memory_gb 80 --json",
                        &out),
            0)
      << out;
  const auto j = nlohmann::json::parse(out);
  for (const char* k : {"device_total_bytes", "host_total_bytes", "fits", "breakdown", "rungs", "peak_moment",
                        "deepspeed_zero3_estimate", "max_per_device_train_batch_size"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_TRUE(j["fits"].get<bool>());
  EXPECT_EQ(j["rungs"].size(), 6u);
  for (const auto& r : j["rungs"]) EXPECT_TRUE(r.contains("fits") && r.contains("max_per_device_train_batch_size"));
  // The readable table.
  ASSERT_EQ(run_command(train_bin() + " estimate-memory --model_name_or_path " + dir.path().string() +
                            " --num_gpus 2 --gpu_memory_gb 24 --fsdp 'full_shard auto_wrap offload' --bf16 True"
                            " --gradient_checkpointing True",
                        &out),
            0)
      << out;
  EXPECT_NE(out.find("DeepSpeed ZeRO-3 estimator"), std::string::npos) << out;
  EXPECT_NE(out.find("full_shard + offload + gradient_checkpointing"), std::string::npos) << out;
  // Errors: no config, and a bad option value.
  EXPECT_NE(run_command(train_bin() + " estimate-memory --model_name_or_path " + (dir.path() / "nope").string() + " 2>&1",
                        &out),
            0);
  EXPECT_NE(out.find("config.json"), std::string::npos) << out;
  EXPECT_NE(run_command(train_bin() + " estimate-memory --model_name_or_path " + dir.path().string() +
                            " --num_gpus zero 2>&1",
                        &out),
            0);
  EXPECT_NE(out.find("--num_gpus needs an integer"), std::string::npos) << out;
}

}  // namespace test_memory_plan
