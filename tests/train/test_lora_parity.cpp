// LoRA (--use_peft) against peft (tests/reference/lora_parity_ref.py: transformers + peft + torch
// AdamW + the same cosine schedule, tiny random LLaMA, 40 real Alpaca records, 20 steps, starting
// from our initial adapter; both sides train train.py's added [PAD] rows as peft trainable
// tokens): fp32 world 1 within 1e-4 relative per step (loss; grad norm 1e-3), the trained [PAD]
// rows within 1e-4 of peft's; worlds 2 and 4 under every sharding strategy, with and without
// offload and checkpointing, match world 1 within 1e-5; the saved adapter has peft's keys and
// loads with PeftModel.from_pretrained without a warning, giving our logits within 1e-5; saving
// it holds about the adapter's bytes, not the base's.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "alpaca/io/peft_adapter.h"
#include "alpaca/io/hf_model.h"
#include "alpaca/io/safetensors.h"
#include "alpaca/model/llama.h"
#include "alpaca/model/lora.h"
#include "test_util.h"
#include "train_test_util.h"

namespace test_lora_parity {

namespace fs = std::filesystem;
using namespace alpaca;
using namespace alpaca::testing;

namespace {

const fs::path kFixture = fixture_dir("lora_parity");

std::string lora_args(const fs::path& out, int per_device, int accum, int steps = 20,
                      const fs::path& model = kFixture / "model") {
  return parity_flags(kFixture, out, steps, per_device, accum, "2e-2")
      .model(model)
      .set("--use_peft True --lora_r 8 --lora_alpha 16 --lora_dropout 0");
}

nlohmann::json reference() {
  std::ifstream f(kFixture / "reference.json");
  return nlohmann::json::parse(f);
}

// The world-1 run (4 x 2, 20 steps) that World1MatchesPeftFor20Steps compares with peft and the
// sweep compares worlds 2 and 4 with: run once, by whichever test comes first.
const SharedRun& world1_run() {
  static const SharedRun run("lora_w1", [](const fs::path& out) { return lora_args(out, 4, 2); }, 1);
  return run;
}

#define SKIP_WITHOUT_FIXTURE() \
  if (fs::exists(kFixture / "SKIPPED")) GTEST_SKIP() << "reference fixture skipped (no shared data)"

}  // namespace

TEST(LoraParity, OurInitialAdapterIsTheReferencesBitwise) {
  SKIP_WITHOUT_FIXTURE();
  model::LlamaConfig c = model::LlamaConfig::from_json_file((kFixture / "model" / "config.json").string());
  c.vocab_size = 32001;
  model::LlamaForCausalLM m(c, at::TensorOptions().device(at::kMeta));
  model::LoraOptions o;
  o.r = 8;
  o.alpha = 16;
  model::apply_lora(*m, o, 42);
  auto init = io::SafetensorsFile::open((kFixture / "lora_init.safetensors").string());
  auto params = m->named_parameters(true);
  ASSERT_EQ(init->names().size(), 4u);
  for (const auto& name : init->names()) {
    ASSERT_NE(params.find(name), nullptr) << name;
    EXPECT_TRUE(at::equal(params[name], init->tensor(name))) << name << " differs from peft's init draw";
  }
}

TEST(LoraParity, World1MatchesPeftFor20Steps) {
  SKIP_WITHOUT_FIXTURE();
  const auto ref = reference();
  const SharedRun& w1 = world1_run();
  ASSERT_EQ(w1.rc(), 0) << w1.log();
  const auto steps = read_step_logs(w1.dir());
  ASSERT_EQ(steps.size(), 20u) << w1.log();
  const auto [worst, worst_norm] = expect_steps_match(steps, read_reference_steps(kFixture / "reference.json"), "peft");
  // The run learned something (the comparison is not of two untrained models).
  EXPECT_LT(ref["losses"][19].get<double>(), ref["losses"][0].get<double>() - 0.03);
  std::cout << "[lora parity] world 1 vs peft: worst relative loss difference " << worst << ", grad norm " << worst_norm
            << "; loss " << steps.front().loss << " -> " << steps.back().loss << "\n";

  // The [PAD] rows trained as peft's trainable tokens train them: after 20 steps our saved deltas
  // are peft's (the [PAD] logit barely moves the loss, so the loss alone could not tell trained
  // rows from frozen ones). lm_head's row moves ~1000x its initial size; embed_tokens' row gets no
  // gradient ([PAD] is only ever a masked input) and only decays, on both sides.
  auto ours = io::SafetensorsFile::open((w1.dir() / "adapter_model.safetensors").string());
  auto peft = io::SafetensorsFile::open((kFixture / "tokens_final.safetensors").string());
  for (const char* name : {"lm_head.token_adapter.trainable_tokens_delta", "model.embed_tokens.token_adapter.trainable_tokens_delta"}) {
    const at::Tensor got = ours->tensor(std::string("base_model.model.") + name), want = peft->tensor(name);
    const at::Tensor init = peft->tensor(std::string(name) + ".init");
    ASSERT_EQ(got.sizes(), want.sizes()) << name;
    const double diff = (got - want).abs().max().item<double>(), scale = want.abs().max().item<double>();
    const double moved = (want - init).abs().max().item<double>();
    EXPECT_LE(diff, 1e-4 * scale) << name << ": ours differs from peft's trained rows by " << diff;
    EXPECT_GT(moved, 10 * diff) << name << ": the rows moved less than our difference from peft";
    std::cout << "[lora parity] " << name << ": max |ours - peft| " << diff << " (max |row| " << scale
              << ", moved by " << moved << " in training)\n";
  }
  EXPECT_GT((peft->tensor("lm_head.token_adapter.trainable_tokens_delta") -
             peft->tensor("lm_head.token_adapter.trainable_tokens_delta.init")).abs().max().item<double>(), 0.05)
      << "lm_head's [PAD] row was not trained";
}

TEST(LoraParity, Worlds2And4EveryStrategyMatchWorld1) {
  SKIP_WITHOUT_FIXTURE();
  const SharedRun& w1 = world1_run();
  ASSERT_EQ(w1.rc(), 0) << w1.log();
  const auto base = read_step_logs(w1.dir());
  ASSERT_EQ(base.size(), 20u);
  std::string log;
  struct Case { int ranks, per_device, accum; std::string fsdp, extra; };
  const std::string wrap = " --fsdp_transformer_layer_cls_to_wrap LlamaDecoderLayer";
  const std::vector<Case> cases = {
      {2, 2, 2, "full_shard auto_wrap", " --gradient_checkpointing True"},
      {2, 4, 1, "shard_grad_op auto_wrap offload", ""},
      {2, 2, 2, "no_shard", ""},
      {4, 1, 2, "full_shard auto_wrap offload", " --gradient_checkpointing True"},
      {4, 2, 1, "hybrid_shard auto_wrap", " --fsdp_config '{\"hybrid_shard_size\": 2}'"},
  };
  for (const Case& c : cases) {
    TempDir wn("lora_sweep_wn");
    std::string extra = c.extra;
    if (c.fsdp.find("auto_wrap") != std::string::npos) extra += wrap;
    ASSERT_EQ(run_trainer(lora_args(wn.path(), c.per_device, c.accum) + " --fsdp '" + c.fsdp + "'" + extra, c.ranks, &log), 0)
        << c.fsdp << "\n" << log;
    const auto got = read_step_logs(wn.path());
    ASSERT_EQ(got.size(), 20u) << log;
    const double worst =
        expect_losses_close(got, base, 1e-5, std::to_string(c.ranks) + " ranks '" + c.fsdp + "'" + c.extra);
    std::cout << "[lora parity] " << c.ranks << " ranks '" << c.fsdp << "'" << c.extra << " vs world 1: worst " << worst << "\n";
  }
}

TEST(LoraParity, SavedAdapterLoadsInPeftWithOurLogits) {
  SKIP_WITHOUT_FIXTURE();
  TempDir out("lora_saved");
  std::string log;
  ASSERT_EQ(run_trainer(lora_args(out.path(), 2, 2, 5) + " --fsdp 'full_shard auto_wrap'"
                        " --fsdp_transformer_layer_cls_to_wrap LlamaDecoderLayer --merge_adapter True", 2, &log), 0) << log;
  const fs::path dir = out.path();
  ASSERT_TRUE(fs::exists(dir / "adapter_config.json")) << log;
  EXPECT_FALSE(fs::exists(dir / "model.safetensors")) << "a LoRA run must not export the base";
  EXPECT_TRUE(fs::exists(dir / "tokenizer.model"));
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir / "adapter_config.json"));
  EXPECT_EQ(cfg["peft_type"], "LORA");
  EXPECT_EQ(cfg["r"], 8);
  EXPECT_EQ(cfg["target_modules"], nlohmann::json({"q_proj", "v_proj"}));
  EXPECT_EQ(cfg["trainable_token_indices"]["embed_tokens"], nlohmann::json({32000}));
  auto adapter = io::SafetensorsFile::open((dir / "adapter_model.safetensors").string());
  std::vector<std::string> keys = adapter->names();
  std::sort(keys.begin(), keys.end());
  std::vector<std::string> want = {"base_model.model.lm_head.token_adapter.trainable_tokens_delta",
                                   "base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta"};
  for (int l = 0; l < 2; ++l)
    for (const char* p : {"q_proj", "v_proj"})
      for (const char* ab : {"lora_A", "lora_B"})
        want.push_back("base_model.model.model.layers." + std::to_string(l) + ".self_attn." + p + "." + ab + ".weight");
  std::sort(want.begin(), want.end());
  EXPECT_EQ(keys, want);

  // Our model from the saved files: the base with train.py's [PAD] row, plus the adapter.
  model::LlamaForCausalLM m = io::load_hf_model((kFixture / "model").string());
  m->resize_token_embeddings(32001);
  model::LoraOptions o;
  o.r = 8;
  o.alpha = 16;
  o.dropout = 0;
  model::apply_lora(*m, o, 0);
  at::NoGradGuard ng;
  for (auto& item : m->named_parameters(true))
    if (model::is_lora_param(item.key())) item.value().copy_(adapter->tensor("base_model.model." + item.key()));
  // The stored [PAD] rows were trained (they left train.py's mean rows); peft's TrainableTokensLayer
  // replaces the table rows with them, so the hand-built model gets them the same way.
  const at::Tensor lm_delta = adapter->tensor("base_model.model.lm_head.token_adapter.trainable_tokens_delta");
  EXPECT_GT((lm_delta - m->lm_head->weight.narrow(0, 32000, 1)).abs().max().item<double>(), 1e-3)
      << "lm_head's [PAD] row is still train.py's mean row: it was not trained";
  m->model->embed_tokens->weight.narrow(0, 32000, 1).copy_(
      adapter->tensor("base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta"));
  m->lm_head->weight.narrow(0, 32000, 1).copy_(lm_delta);
  EXPECT_GT(adapter->tensor("base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight").abs().max().item<double>(), 0);
  at::Tensor ids = at::tensor({1, 13866, 338, 385, 32000, 29889, 32000, 2}, at::kLong).view({1, -1});
  at::Tensor logits = m->forward(ids).contiguous();
  {
    // What `generate --adapter` runs: the adapter attached unmerged by io::attach_lora_adapter
    // (grows the vocabulary from the token rows) gives this model's logits.
    model::LlamaForCausalLM g = io::load_hf_model((kFixture / "model").string());
    EXPECT_EQ(io::attach_lora_adapter(*g, io::read_lora_adapter(dir.string()), (kFixture / "model").string()), 4);
    EXPECT_EQ(g->config().vocab_size, 32001);
    EXPECT_TRUE(at::equal(g->forward(ids), logits)) << "attach_lora_adapter differs from the hand-built model";
  }
  const fs::path ours = dir / "ours_logits.safetensors";
  {
    io::SafetensorsWriter w(ours.string());
    w.add("input_ids", ids);
    w.add("logits", logits);
    w.finish();
  }
  // The merge subcommand gives the same merged model as --merge_adapter at the end of training.
  const fs::path merged = dir / "merged_cmd";
  ASSERT_EQ(run_command(train_bin() + " merge --model_name_or_path " + (kFixture / "model").string() + " --adapter " +
                            dir.string() + " --output_dir " + merged.string() + " 2>&1", &log), 0) << log;
  ASSERT_TRUE(fs::exists(dir / "merged" / "model.safetensors")) << "--merge_adapter True wrote nothing";
  {
    auto x = io::SafetensorsFile::open((dir / "merged" / "model.safetensors").string());
    auto y = io::SafetensorsFile::open((merged / "model.safetensors").string());
    ASSERT_EQ(x->names(), y->names());
    for (const auto& n : x->names()) EXPECT_TRUE(at::equal(x->tensor(n), y->tensor(n))) << n;
    EXPECT_EQ(y->tensor("model.embed_tokens.weight").size(0), 32001);
  }
  // The merged directory carries the tokenizer and chat template the adapter directory has; an
  // adapter saved without them (peft's save_pretrained) gets the base's.
  const char* const tokenizer_files[] = {"tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                                         "tokenizer.json", "chat_template.jinja"};
  for (const char* f : tokenizer_files) {
    EXPECT_EQ(fs::exists(dir / f), fs::exists(merged / f)) << f;
    EXPECT_EQ(fs::exists(dir / f), fs::exists(dir / "merged" / f)) << f << " (--merge_adapter)";
  }
  {
    const fs::path bare = dir / "bare_adapter", bare_merged = dir / "bare_merged";
    fs::create_directories(bare);
    for (const char* f : {"adapter_config.json", "adapter_model.safetensors"}) fs::copy_file(dir / f, bare / f);
    ASSERT_EQ(run_command(train_bin() + " merge --model_name_or_path " + (kFixture / "model").string() + " --adapter " +
                              bare.string() + " --output_dir " + bare_merged.string() + " 2>&1", &log), 0) << log;
    for (const char* f : tokenizer_files)
      EXPECT_EQ(fs::exists(kFixture / "model" / f), fs::exists(bare_merged / f)) << f << " (from the base)";
    EXPECT_TRUE(fs::exists(bare_merged / "tokenizer.model"));
  }
  const PeftLoadCheck c = peft_load_check(kFixture / "model", dir, ours, merged);
  ASSERT_TRUE(c.ok) << c.output;
  EXPECT_EQ(c.rc, 0) << "peft warned while loading the adapter: " << c.warnings;
  EXPECT_EQ(c.warnings, "[]");
  EXPECT_LE(c.max_abs_diff, 1e-5) << c.output;
  EXPECT_LE(c.merged_max_abs_diff, 1e-5) << "the merged model in transformers: " << c.output;
  std::cout << "[lora peft load] PeftModel.from_pretrained: no warnings; max |logits - ours| = " << c.max_abs_diff
            << " (max |logit| " << c.max_abs << "); merged model in transformers: " << c.merged_max_abs_diff << "\n";
}

TEST(LoraParity, AdapterSaveHoldsAboutTheAdapterNotTheBase) {
  // A model whose base is ~600x its adapter (hidden 256, 2 layers, 32000-row untied tables: 17.6M
  // base parameters, 70 MB in fp32; r = 16 on q_proj v_proj plus the [PAD] rows: 29.2k adapter
  // parameters, 117 KB), trained one step at world 2 under full_shard and saved. The CPU tensor
  // bytes the save holds at its worst (the counting allocator's watch around export_adapter, as
  // alpaca-train logs it on rank 0) must be about the adapter's size: a save that gathered even
  // one of the base's tables would hold 32.8 MB.
  SKIP_WITHOUT_FIXTURE();
  TempDir work("lora_save_mem");
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(kFixture / "model" / "config.json"));
  cfg["hidden_size"] = 256;
  cfg["intermediate_size"] = 512;
  cfg["head_dim"] = 64;
  const fs::path cfg_path = work.path() / "config.json", model_dir = work.path() / "model";
  std::ofstream(cfg_path) << cfg.dump();
  std::string log;
  ASSERT_EQ(run_command(train_bin() + " init-model --config " + cfg_path.string() + " --output_dir " + model_dir.string() +
                        " 2>&1", &log), 0) << log;
  for (const char* f : {"tokenizer.model", "tokenizer_config.json"}) fs::copy_file(kFixture / "model" / f, model_dir / f);
  const fs::path out = work.path() / "out";
  const fs::path f = kFixture;
  ASSERT_EQ(run_trainer("--model_name_or_path " + model_dir.string() + " --data_path " + (f / "data.json").string() +
                        " --output_dir " + out.string() + " --max_steps 1 --per_device_train_batch_size 1"
                        " --model_max_length 128 --save_strategy no --report_to none --use_peft True --lora_r 16"
                        " --fsdp 'full_shard auto_wrap' --fsdp_transformer_layer_cls_to_wrap LlamaDecoderLayer",
                        2, &log), 0) << log;
  int64_t adapter_bytes = 0;
  {
    auto st = io::SafetensorsFile::open((out / "adapter_model.safetensors").string());
    for (const auto& n : st->names()) adapter_bytes += st->info(n).nbytes();
  }
  const std::string key = "rank 0 CPU tensor peak grew by ";
  const auto at = log.rfind(key);
  ASSERT_NE(at, std::string::npos) << log;
  const int64_t grew = std::stoll(log.substr(at + key.size()));
  int64_t base_bytes = 0;
  {
    auto st = io::SafetensorsFile::open((model_dir / "model.safetensors").string());
    for (const auto& n : st->names()) base_bytes += st->info(n).nbytes();
  }
  std::cout << "[lora save memory] adapter tensors " << adapter_bytes << " B, base " << base_bytes
            << " B; the save's CPU tensor peak grew by " << grew << " B\n";
  ASSERT_GT(base_bytes, 100 * adapter_bytes) << "the test model is not big enough to tell the two apart";
  EXPECT_GT(grew, 0) << "nothing was measured: the counting allocator is not installed in alpaca-train";
  EXPECT_LE(grew, 2 * adapter_bytes + (256 << 10)) << "saving the adapter held more than the adapter";
}

namespace {

std::map<std::string, at::Tensor> adapter_tensors(const fs::path& dir) {
  auto st = io::SafetensorsFile::open((dir / "adapter_model.safetensors").string());
  std::map<std::string, at::Tensor> out;
  for (const auto& n : st->names()) out[n] = st->tensor(n);
  return out;
}

}  // namespace

TEST(LoraParity, DeepSpeedZero3WithOffloadIsTheFsdpOffloadRun) {
  // The Stanford Alpaca "Addressing OOM" ZeRO-3 JSON (param + optimizer offload) with --use_peft:
  // alpaca-train maps it onto full_shard auto_wrap offload, so the run is bitwise that run.
  SKIP_WITHOUT_FIXTURE();
  const std::string ds = R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}, )"
                         R"("offload_optimizer": {"device": "cpu"}}, "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}, )"
                         R"("train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", )"
                         R"("gradient_clipping": "auto"})";
  TempDir a("lora_ds"), b("lora_ds_fsdp");
  std::string log;
  ASSERT_EQ(run_trainer(lora_args(a.path(), 2, 2, 6) + " --deepspeed '" + ds + "'", 2, &log), 0) << log;
  EXPECT_NE(log.find("deepspeed ZeRO stage = 3"), std::string::npos) << log;
  EXPECT_NE(log.find("FSDP FULL_SHARD over 2 ranks"), std::string::npos) << log;
  ASSERT_EQ(run_trainer(lora_args(b.path(), 2, 2, 6) + " --fsdp 'full_shard auto_wrap offload'"
                        " --fsdp_transformer_layer_cls_to_wrap LlamaDecoderLayer", 2, &log), 0) << log;
  const auto x = read_step_logs(a.path()), y = read_step_logs(b.path());
  ASSERT_EQ(x.size(), 6u);
  ASSERT_EQ(y.size(), 6u);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(x[i].loss, y[i].loss) << "step " << i + 1;
  const auto ta = adapter_tensors(a.path()), tb = adapter_tensors(b.path());
  ASSERT_EQ(ta.size(), tb.size());
  for (const auto& [n, t] : ta) EXPECT_TRUE(at::equal(t, tb.at(n))) << n;
  std::cout << "[lora deepspeed] ZeRO-3 + offload JSON == --fsdp 'full_shard auto_wrap offload': 6 losses and "
            << ta.size() << " adapter tensors bitwise\n";
}

TEST(LoraParity, Fp16WithTheLossScalerTracksFp32) {
  // --fp16: the frozen base and the compute in fp16, fp32 masters, dynamic loss scaling (HF's
  // GradScaler rules). Against the same run in fp32 (2 ranks, full_shard, 20 steps): measured
  // worst loss difference 2.3e-6 relative, grad norms 9e-4, adapter tensors 1.3e-2 of their
  // largest value; the bounds below leave ~5x. fp16 must change something (it is not ignored).
  SKIP_WITHOUT_FIXTURE();
  TempDir a("lora_fp16"), b("lora_fp32");
  const std::string fsdp = " --fsdp 'full_shard auto_wrap' --fsdp_transformer_layer_cls_to_wrap LlamaDecoderLayer";
  std::string log16, log;
  ASSERT_EQ(run_trainer(lora_args(a.path(), 2, 2) + fsdp + " --fp16 True", 2, &log16), 0) << log16;
  ASSERT_EQ(run_trainer(lora_args(b.path(), 2, 2) + fsdp, 2, &log), 0) << log;
  EXPECT_EQ(log16.find("fp16 overflow"), std::string::npos) << "no step should overflow here: " << log16;
  const auto x = read_step_logs(a.path()), y = read_step_logs(b.path());
  ASSERT_EQ(x.size(), 20u);
  ASSERT_EQ(y.size(), 20u);
  double worst = 0, worst_norm = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    worst = std::max(worst, std::abs(x[i].loss - y[i].loss) / std::abs(y[i].loss));
    worst_norm = std::max(worst_norm, std::abs(x[i].grad_norm - y[i].grad_norm) / y[i].grad_norm);
  }
  EXPECT_LE(worst, 1e-5);
  EXPECT_LE(worst_norm, 5e-3);
  EXPECT_GT(worst, 0) << "--fp16 gave exactly the fp32 run";
  const auto ta = adapter_tensors(a.path()), tb = adapter_tensors(b.path());
  double worst_t = 0;
  for (const auto& [n, t] : ta) {
    const double rel = (t - tb.at(n)).abs().max().item<double>() / tb.at(n).abs().max().item<double>();
    worst_t = std::max(worst_t, rel);
    EXPECT_LE(rel, 5e-2) << n;
  }
  std::cout << "[lora fp16] vs fp32, 20 steps: worst relative loss difference " << worst << ", grad norm " << worst_norm
            << ", adapter tensors " << worst_t << "\n";
}

TEST(LoraParity, TiedEmbeddingsShareOneTrainableTokenDeltaThatPeftLoads) {
  // tie_word_embeddings: peft ties lm_head's token adapter to the embedding's (one delta, saved
  // once, config names embed_tokens only); ours is one parameter used by both. The adapter loads
  // in PeftModel.from_pretrained without a warning and gives the logits of our unmerged attach.
  SKIP_WITHOUT_FIXTURE();
  TempDir work("lora_tied");
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(kFixture / "model" / "config.json"));
  cfg["tie_word_embeddings"] = true;
  const fs::path cfg_path = work.path() / "config.json", model_dir = work.path() / "model", out = work.path() / "out";
  std::ofstream(cfg_path) << cfg.dump();
  std::string log;
  ASSERT_EQ(run_command(train_bin() + " init-model --config " + cfg_path.string() + " --output_dir " + model_dir.string() +
                        " 2>&1", &log), 0) << log;
  for (const char* f : {"tokenizer.model", "tokenizer_config.json"}) fs::copy_file(kFixture / "model" / f, model_dir / f);
  const std::string args = lora_args(out, 2, 2, 5, model_dir);
  ASSERT_EQ(run_trainer(args + " --fsdp 'full_shard auto_wrap' --fsdp_transformer_layer_cls_to_wrap LlamaDecoderLayer", 2,
                        &log), 0) << log;
  nlohmann::json acfg = nlohmann::json::parse(std::ifstream(out / "adapter_config.json"));
  EXPECT_EQ(acfg["trainable_token_indices"], nlohmann::json({{"embed_tokens", {32000}}}));
  auto adapter = io::SafetensorsFile::open((out / "adapter_model.safetensors").string());
  EXPECT_TRUE(adapter->contains("base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta"));
  EXPECT_FALSE(adapter->contains("base_model.model.lm_head.token_adapter.trainable_tokens_delta"));
  // Trained: the [PAD] logit is in every softmax, so the shared row gets the head's gradient.
  model::LlamaForCausalLM base = io::load_hf_model(model_dir.string());
  const at::Tensor mean = base->model->embed_tokens->weight.mean(0, true);
  const at::Tensor delta = adapter->tensor("base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta");
  EXPECT_GT((delta - mean).abs().max().item<double>(), 1e-3) << "the tied [PAD] row was not trained";

  model::LlamaForCausalLM g = io::load_hf_model(model_dir.string());
  EXPECT_EQ(io::attach_lora_adapter(*g, io::read_lora_adapter(out.string()), model_dir.string()), 4);
  at::NoGradGuard ng;
  at::Tensor ids = at::tensor({1, 13866, 338, 385, 32000, 29889, 32000, 2}, at::kLong).view({1, -1});
  const fs::path ours = work.path() / "ours_logits.safetensors";
  {
    io::SafetensorsWriter w(ours.string());
    w.add("input_ids", ids);
    w.add("logits", g->forward(ids).contiguous());
    w.finish();
  }
  const PeftLoadCheck c = peft_load_check(model_dir, out, ours);
  ASSERT_TRUE(c.ok) << c.output;
  EXPECT_EQ(c.rc, 0) << "peft warned while loading the adapter: " << c.warnings;
  EXPECT_LE(c.max_abs_diff, 1e-5) << c.output;
  std::cout << "[lora tied] PeftModel.from_pretrained (tied embeddings): no warnings; max |logits - ours| = "
            << c.max_abs_diff << "\n";
}

}  // namespace test_lora_parity

// A module's test files compile as one unit (tests/CMakeLists.txt): this file's macros end here.
#undef SKIP_WITHOUT_FIXTURE

namespace test_lora_parity {

// peft's target_modules as a string: one regular expression, re.fullmatch'ed against whole module
// names. For each pattern of lora_parity_ref.py's REGEX_TARGETS our plan adapts the linears peft
// adapts (regex_targets.json), or refuses where peft raises (a match that is not a linear, no
// match); a run trained with a pattern writes it as peft's string, and peft loads that adapter
// onto the same modules with our logits.
TEST(LoraParity, RegexTargetModulesAdaptWhatPeftsStringFormAdapts) {
  if (fs::exists(kFixture / "SKIPPED")) GTEST_SKIP() << "reference fixture skipped (no shared data)";
  const nlohmann::json want = nlohmann::json::parse(std::ifstream(kFixture / "regex_targets.json"));
  const model::LlamaConfig c = model::LlamaConfig::from_json_file((kFixture / "model" / "config.json").string());
  ASSERT_GE(want.size(), 5u);
  for (const auto& [pattern, r] : want.items()) {
    SCOPED_TRACE(pattern);
    ASSERT_EQ(model::split_module_list(" " + pattern + " "), std::vector<std::string>{pattern});
    model::LlamaForCausalLM m(c, at::TensorOptions().device(at::kMeta));
    model::LoraOptions o;
    o.r = 2;
    o.dropout = 0;
    o.target_modules = model::split_module_list(pattern);
    if (r.contains("error")) {
      EXPECT_FALSE(error_of([&] { model::apply_lora(*m, o, 1); }).empty()) << "peft: " << r["error"];
      continue;
    }
    const model::LoraPlan plan = model::apply_lora(*m, o, 1);
    EXPECT_EQ(plan.lora_modules, r["modules"].get<std::vector<std::string>>());
    EXPECT_EQ(plan.target_modules, std::vector<std::string>{pattern});
  }
  {
    model::LlamaForCausalLM m(c, at::TensorOptions().device(at::kMeta));
    model::LoraOptions o;
    o.target_modules = model::split_module_list("model\\.layers\\.(?P<n>0)\\.mlp\\.up_proj");
    const std::string e = error_of([&] { model::apply_lora(*m, o, 1); });
    EXPECT_NE(e.find("is not a regular expression alpaca-train can read"), std::string::npos) << e;
  }

  TempDir out("lora_regex");
  std::string log;
  const std::string pattern = "model\\.layers\\.1\\.self_attn\\.[kvo]_proj";
  ASSERT_EQ(run_trainer(lora_args(out.path(), 2, 1, 3) + " --lora_target_modules '" + pattern + "' --merge_adapter True", 1,
                        &log), 0) << log;
  const nlohmann::json cfg = nlohmann::json::parse(std::ifstream(out.path() / "adapter_config.json"));
  EXPECT_EQ(cfg["target_modules"], pattern) << "peft's string form";
  auto adapter = io::SafetensorsFile::open((out.path() / "adapter_model.safetensors").string());
  int lora_tensors = 0;
  for (const auto& n : adapter->names())
    if (n.find(".lora_") != std::string::npos) {
      ++lora_tensors;
      EXPECT_NE(n.find("model.layers.1.self_attn."), std::string::npos) << n;
      EXPECT_EQ(n.find("q_proj"), std::string::npos) << n;
    }
  EXPECT_EQ(lora_tensors, 6);
  EXPECT_GT(adapter->tensor("base_model.model.model.layers.1.self_attn.o_proj.lora_B.weight").abs().max().item<double>(), 0)
      << "the adapter was not trained";
  model::LlamaForCausalLM g = io::load_hf_model((kFixture / "model").string());
  EXPECT_EQ(io::attach_lora_adapter(*g, io::read_lora_adapter(out.path().string()), (kFixture / "model").string()), 3);
  const at::Tensor ids = at::tensor({1, 13866, 338, 385, 32000, 29889, 32000, 2}, at::kLong).view({1, -1});
  const fs::path ours = out.path() / "ours_logits.safetensors";
  {
    at::NoGradGuard ng;
    io::SafetensorsWriter w(ours.string());
    w.add("input_ids", ids);
    w.add("logits", g->forward(ids).contiguous());
    w.finish();
  }
  const PeftLoadCheck p = peft_load_check(kFixture / "model", out.path(), ours, out.path() / "merged");
  ASSERT_TRUE(p.ok) << p.output;
  EXPECT_EQ(p.warnings, "[]");
  EXPECT_LE(p.max_abs_diff, 1e-5) << p.output;
  EXPECT_LE(p.merged_max_abs_diff, 1e-5) << p.output;
  std::cout << "[lora regex targets] " << want.size() << " patterns as peft; trained with '" << pattern
            << "': peft loads it, max |logits - ours| = " << p.max_abs_diff << "\n";
}

}  // namespace test_lora_parity
