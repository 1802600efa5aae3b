// DoRA (--use_peft --use_dora) against peft's LoraConfig(use_dora=True) (tests/reference/lora_parity_ref.py
// --use_dora: transformers + peft + torch AdamW, the tiny random LLaMA and Alpaca records of the LoRA
// parity test, starting from our initial A): fp32 world 1 within 1e-4 relative per step (loss; grad
// norm 1e-3) and the trained magnitude vectors within 1e-4 of peft's; world 2 (full_shard, and
// offload with checkpointing) matches world 1 within 1e-5; the saved adapter has peft's keys
// (lora_magnitude_vector) and loads with PeftModel.from_pretrained without a warning, giving our logits
// within 1e-5, and `merge` gives what peft's merge_and_unload gives. QDoRA (a bitsandbytes 4-bit base)
// matches bitsandbytes + peft as the QLoRA parity test does.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "alpaca/io/hf_model.h"
#include "alpaca/io/peft_adapter.h"
#include "alpaca/io/safetensors.h"
#include "alpaca/model/llama.h"
#include "test_util.h"
#include "train_test_util.h"

namespace test_dora_parity {

namespace fs = std::filesystem;
using namespace alpaca;
using namespace alpaca::testing;

namespace {

const fs::path kFixture = fixture_dir("dora_parity");

std::string dora_args(const fs::path& out, int per_device, int accum, int steps = 20) {
  return parity_flags(kFixture, out, steps, per_device, accum, "2e-2")
      .model(kFixture / "model")
      .set("--use_peft True --use_dora True --lora_r 8 --lora_alpha 16 --lora_dropout 0");
}

const SharedRun& world1_run() {
  static const SharedRun run("dora_w1", [](const fs::path& out) { return dora_args(out, 4, 2); }, 1);
  return run;
}

#define SKIP_WITHOUT_FIXTURE() \
  if (fs::exists(kFixture / "SKIPPED")) GTEST_SKIP() << "reference fixture skipped (no shared data)"

}  // namespace

TEST(DoraParity, World1MatchesPeftFor20Steps) {
  SKIP_WITHOUT_FIXTURE();
  const SharedRun& w1 = world1_run();
  ASSERT_EQ(w1.rc(), 0) << w1.log();
  const auto steps = read_step_logs(w1.dir());
  ASSERT_EQ(steps.size(), 20u) << w1.log();
  const auto [worst, worst_norm] = expect_steps_match(steps, read_reference_steps(kFixture / "reference.json"), "peft DoRA");
  std::cout << "[dora parity] world 1 vs peft: worst relative loss difference " << worst << ", grad norm " << worst_norm
            << "; loss " << steps.front().loss << " -> " << steps.back().loss << "\n";

  // The magnitudes after 20 steps are peft's (they start at the base's row norms and train).
  auto ours = io::SafetensorsFile::open((w1.dir() / "adapter_model.safetensors").string());
  auto peft = io::SafetensorsFile::open((kFixture / "lora_final.safetensors").string());
  auto base = io::SafetensorsFile::open((kFixture / "model" / "model.safetensors").string());
  int checked = 0;
  for (const auto& key : ours->names()) {
    if (!key.ends_with(".lora_magnitude_vector")) continue;
    const at::Tensor got = ours->tensor(key), want = peft->tensor(key + ".weight");
    const std::string weight = key.substr(std::string(io::kPeftKeyPrefix).size(),
                                          key.size() - std::string(io::kPeftKeyPrefix).size() -
                                              std::string(".lora_magnitude_vector").size()) + ".weight";
    const at::Tensor init = base->tensor(weight).to(at::kFloat).norm(2, {1});
    const double diff = (got - want).abs().max().item<double>(), scale = want.abs().max().item<double>();
    const double moved = (want - init).abs().max().item<double>();
    EXPECT_LE(diff, 1e-4 * scale) << key;
    EXPECT_GT(moved, 10 * diff) << key << ": the magnitude moved less than our difference from peft";
    ++checked;
  }
  EXPECT_EQ(checked, 4) << "2 layers x (q_proj, v_proj) magnitude vectors";
}

// QDoRA: the 4-bit base (bitsandbytes nf4, nested) as the QLoRA parity test has it; the magnitudes
// start from the dequantized weights' row norms, as peft's update_layer takes them.
TEST(DoraParity, QdoraWorld1MatchesBitsandbytesAndPeft) {
  const fs::path q = fixture_dir("qdora_parity");
  if (fs::exists(q / "SKIPPED")) GTEST_SKIP() << "reference fixture skipped (no shared data)";
  TempDir out("qdora_w1");
  std::string log;
  ASSERT_EQ(run_trainer(parity_flags(q, out.path(), 20, 4, 2, "2e-2")
                            .set("--use_peft True --use_dora True --lora_r 8 --lora_alpha 16 --lora_dropout 0")
                            .set(kNf4Nested),
                        1, &log), 0) << log;
  const auto steps = read_step_logs(out.path());
  ASSERT_EQ(steps.size(), 20u) << log;
  ReferenceSteps ref_steps = read_reference_steps(q / "reference.json");
  ref_steps.learning_rates.clear();  // as the QLoRA parity test: losses and norms
  const auto [worst, worst_norm] = expect_steps_match(steps, ref_steps, "bitsandbytes+peft DoRA");
  std::cout << "[qdora parity] world 1 vs bitsandbytes+peft: worst relative loss difference " << worst
            << ", grad norm " << worst_norm << "\n";
  auto ours = io::SafetensorsFile::open((out.path() / "adapter_model.safetensors").string());
  auto peft = io::SafetensorsFile::open((q / "lora_final.safetensors").string());
  int checked = 0;
  for (const auto& key : ours->names()) {
    if (!key.ends_with(".lora_magnitude_vector")) continue;
    const at::Tensor got = ours->tensor(key), want = peft->tensor(key + ".weight");
    EXPECT_LE((got - want).abs().max().item<double>(), 1e-4 * want.abs().max().item<double>()) << key;
    ++checked;
  }
  EXPECT_EQ(checked, 4);
}

TEST(DoraParity, World2MatchesWorld1) {
  SKIP_WITHOUT_FIXTURE();
  const SharedRun& w1 = world1_run();
  ASSERT_EQ(w1.rc(), 0) << w1.log();
  const auto base = read_step_logs(w1.dir());
  ASSERT_EQ(base.size(), 20u);
  const std::string wrap = " --fsdp_transformer_layer_cls_to_wrap LlamaDecoderLayer";
  for (const std::string& extra : {std::string(" --fsdp 'full_shard auto_wrap'") + wrap,
                                  std::string(" --fsdp 'full_shard auto_wrap offload' --gradient_checkpointing True") + wrap}) {
    TempDir wn("dora_w2");
    std::string log;
    ASSERT_EQ(run_trainer(dora_args(wn.path(), 2, 2) + extra, 2, &log), 0) << extra << "\n" << log;
    const auto got = read_step_logs(wn.path());
    ASSERT_EQ(got.size(), 20u) << log;
    const double worst = expect_losses_close(got, base, 1e-5, "2 ranks" + extra);
    std::cout << "[dora parity] 2 ranks" << extra << " vs world 1: worst " << worst << "\n";
  }
}

TEST(DoraParity, SavedAdapterLoadsInPeftAndMergesAsPeftDoes) {
  SKIP_WITHOUT_FIXTURE();
  TempDir out("dora_saved");
  std::string log;
  ASSERT_EQ(run_trainer(dora_args(out.path(), 2, 2, 5), 1, &log), 0) << log;
  const fs::path dir = out.path();
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir / "adapter_config.json"));
  EXPECT_EQ(cfg["use_dora"], true);
  auto adapter = io::SafetensorsFile::open((dir / "adapter_model.safetensors").string());
  for (int l = 0; l < 2; ++l)
    for (const char* p : {"q_proj", "v_proj"})
      EXPECT_TRUE(adapter->contains("base_model.model.model.layers." + std::to_string(l) + ".self_attn." + p +
                                    ".lora_magnitude_vector"));
  // Our logits with the adapter attached unmerged (what `generate --adapter` runs).
  model::LlamaForCausalLM g = io::load_hf_model((kFixture / "model").string());
  ASSERT_EQ(io::attach_lora_adapter(*g, io::read_lora_adapter(dir.string()), (kFixture / "model").string()), 4);
  ASSERT_TRUE(g->layers()[0]->self_attn->q_proj->lora_magnitude.defined());
  at::NoGradGuard ng;
  g->eval();
  at::Tensor ids = at::tensor({1, 13866, 338, 385, 32000, 29889, 32000, 2}, at::kLong).view({1, -1});
  const at::Tensor logits = g->forward(ids).contiguous();
  const fs::path ours = dir / "ours_logits.safetensors";
  {
    io::SafetensorsWriter w(ours.string());
    w.add("input_ids", ids);
    w.add("logits", logits);
    w.finish();
  }
  const fs::path merged = dir / "merged_cmd";
  ASSERT_EQ(run_command(train_bin() + " merge --model_name_or_path " + (kFixture / "model").string() + " --adapter " +
                            dir.string() + " --output_dir " + merged.string() + " 2>&1", &log), 0) << log;
  // The merged model alone gives the unmerged logits (DoRA folds m / ||W + sBA|| into the weight).
  {
    model::LlamaForCausalLM m = io::load_hf_model(merged.string());
    const double d = (m->forward(ids) - logits).abs().max().item<double>();
    EXPECT_LE(d, 1e-4) << "merged vs unmerged DoRA logits";
  }
  const PeftLoadCheck c = peft_load_check(kFixture / "model", dir, ours, merged);
  ASSERT_TRUE(c.ok) << c.output;
  EXPECT_EQ(c.rc, 0) << "peft warned while loading the adapter: " << c.warnings;
  EXPECT_LE(c.max_abs_diff, 1e-5) << c.output;
  EXPECT_LE(c.merged_max_abs_diff, 1e-5) << "the merged model in transformers: " << c.output;
  std::cout << "[dora peft load] PeftModel.from_pretrained: max |logits - ours| = " << c.max_abs_diff
            << "; merged model in transformers vs ours: " << c.merged_max_abs_diff << "\n";
}

}  // namespace test_dora_parity
