// LoRA checkpoints (--use_peft): 6 steps straight == 3 + resume 3, bitwise (with LoRA dropout on,
// so the RNG state is part of it), and on another world size within 1e-5; kill -9 during an
// adapter save leaves the previous checkpoint intact and resumable; resuming with another base
// model, another lora_r, or without --use_peft is a clear error.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <thread>

#include "alpaca/ckpt/checkpoint_dir.h"
#include "alpaca/ckpt/sharded_tensors.h"
#include "alpaca/io/safetensors.h"
#include "test_util.h"
#include "train_test_util.h"

namespace test_lora_resume {

namespace fs = std::filesystem;
using namespace alpaca;
using namespace alpaca::testing;

namespace {

const fs::path kFixture = fixture_dir("lora_parity");

std::string args(const fs::path& model, const fs::path& out, int steps, int per_device, int accum,
                 const std::string& lora = " --lora_r 8 --lora_alpha 16") {
  return TrainFlags(kFixture, out).model(model).steps(steps).batch(per_device, accum)
      .set("--learning_rate 2e-2 --save_steps 3").set(kCosineWarmup).set("--use_peft True")
      .set(lora);  // LoRA dropout: the default 0.05
}

std::map<std::string, at::Tensor> adapter(const fs::path& dir) {
  auto f = io::SafetensorsFile::open((dir / "adapter_model.safetensors").string());
  std::map<std::string, at::Tensor> out;
  for (const auto& n : f->names()) out[n] = f->tensor(n).clone();
  return out;
}

#define SKIP_WITHOUT_FIXTURE() \
  if (fs::exists(kFixture / "SKIPPED")) GTEST_SKIP() << "reference fixture skipped (no shared data)"

}  // namespace

TEST(LoraResume, SixStepsStraightEqualThreePlusThreeBitwise) {
  SKIP_WITHOUT_FIXTURE();
  const fs::path model = kFixture / "model";
  TempDir a("lora_straight"), b("lora_resumed");
  std::string log;
  ASSERT_EQ(run_trainer(args(model, a.path(), 6, 4, 2), 1, &log), 0) << log;
  const fs::path ck = a.path() / "checkpoint-3";
  ASSERT_EQ(ckpt::checkpoint_problem(ck), "");
  EXPECT_TRUE(fs::exists(ck / "adapter_config.json"));
  // Sharded (issue 30): the trainable tensors and their moments as this rank's shards, the
  // adapter beside them for peft; never the frozen base.
  EXPECT_TRUE(fs::is_directory(ck / "optimizer"));
  EXPECT_FALSE(fs::exists(ck / "model.safetensors")) << "a LoRA checkpoint holds the adapter, not the base";
  EXPECT_FALSE(fs::exists(ck / "config.json"));
  {
    const auto shards = ckpt::ShardedTensorReader::open(ck / "sharded");
    const auto peft = adapter(ck);
    EXPECT_EQ(shards.names().size(), peft.size()) << "the model shards hold exactly the adapter's tensors";
    for (const auto& n : shards.names()) EXPECT_TRUE(peft.count("base_model.model." + n)) << n << " is not in the adapter";
  }
  EXPECT_NE(run_command(train_bin() + " consolidate " + ck.string() + " " + (a.path() / "consolidated").string(), &log), 0);
  EXPECT_NE(log.find("is a checkpoint of a LoRA run"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(a.path() / "consolidated"));
  ASSERT_EQ(run_trainer(args(model, b.path(), 6, 4, 2) + " --resume_from_checkpoint " + ck.string(), 1, &log), 0) << log;
  const auto la = read_step_logs(a.path()), lb = read_step_logs(b.path());
  ASSERT_EQ(la.size(), 6u);
  ASSERT_EQ(lb.size(), 3u) << log;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(lb[i].loss, la[3 + i].loss) << "step " << lb[i].step << " is not bitwise equal";
  const auto wa = adapter(a.path()), wb = adapter(b.path());
  ASSERT_EQ(wa.size(), wb.size());
  for (const auto& [n, t] : wa) EXPECT_TRUE(at::equal(t, wb.at(n))) << n << " is not bitwise equal after resume";

  // A LoRA checkpoint of the gathered layout (every one written before issue 30) still resumes.
  TempDir g("lora_gathered"), gr("lora_gathered_resumed");
  ASSERT_EQ(run_trainer(args(model, g.path(), 6, 4, 2) + " --save_checkpoint_layout gathered", 1, &log), 0) << log;
  ASSERT_TRUE(fs::exists(g.path() / "checkpoint-3" / "optimizer.safetensors"));
  ASSERT_EQ(run_trainer(args(model, gr.path(), 6, 4, 2) + " --resume_from_checkpoint " + (g.path() / "checkpoint-3").string(), 1,
                        &log),
            0)
      << log;
  const auto lg = read_step_logs(gr.path());
  ASSERT_EQ(lg.size(), 3u) << log;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(lg[i].loss, la[3 + i].loss) << "step " << lg[i].step << " after a gathered checkpoint";
}

// --load_best_model_at_end on a LoRA run (HF: model.load_adapter from the best checkpoint): the
// adapter written to output_dir is checkpoint-3's, not the last step's (--greater_is_better True
// makes the first evaluation's checkpoint the best while the loss falls).
TEST(LoraResume, LoadBestModelAtEndWritesTheBestAdapter) {
  SKIP_WITHOUT_FIXTURE();
  const fs::path model = kFixture / "model";
  TempDir a("lora_best");
  std::string log;
  ASSERT_EQ(run_trainer(args(model, a.path(), 6, 4, 2) + " --eval_strategy steps --eval_steps 3 --eval_data_path " +
                            (kFixture / "data.json").string() + " --load_best_model_at_end True --greater_is_better True",
                        2, &log), 0) << log;
  EXPECT_NE(log.find("Loading best model from " + (a.path() / "checkpoint-3").string()), std::string::npos) << log;
  const auto best = adapter(a.path() / "checkpoint-3"), last = adapter(a.path() / "checkpoint-6"), out = adapter(a.path());
  ASSERT_EQ(best.size(), out.size());
  bool differs = false;
  for (const auto& [n, t] : best) {
    EXPECT_TRUE(at::equal(t, out.at(n))) << n << " is not the best checkpoint's";
    differs = differs || !at::equal(t, last.at(n));
  }
  EXPECT_TRUE(differs) << "checkpoint-3 and checkpoint-6 hold the same adapter: the test shows nothing";
}

TEST(LoraResume, ResumeOnAnotherWorldSizeWithoutDropoutMatches) {
  SKIP_WITHOUT_FIXTURE();
  const fs::path model = kFixture / "model";
  TempDir a("lora_w1_nodrop"), c("lora_w4_nodrop");
  const std::string nodrop = " --lora_r 8 --lora_alpha 16 --lora_dropout 0";
  std::string log;
  ASSERT_EQ(run_trainer(args(model, a.path(), 6, 4, 2, nodrop), 1, &log), 0) << log;
  ASSERT_EQ(run_trainer(args(model, c.path(), 6, 1, 2, nodrop) + " --fsdp 'full_shard auto_wrap offload' "
                        "--resume_from_checkpoint " + (a.path() / "checkpoint-3").string(), 4, &log), 0) << log;
  const auto la = read_step_logs(a.path()), lc = read_step_logs(c.path());
  ASSERT_EQ(lc.size(), 3u) << log;
  for (int i = 0; i < 3; ++i)
    EXPECT_LE(std::abs(lc[i].loss - la[3 + i].loss) / la[3 + i].loss, 1e-5) << "step " << lc[i].step;
}

TEST(LoraResume, MismatchedResumeIsAClearError) {
  SKIP_WITHOUT_FIXTURE();
  const fs::path model = kFixture / "model";
  TempDir a("lora_mismatch"), b("lora_mismatch_b"), other("lora_other_base");
  std::string log;
  ASSERT_EQ(run_trainer(args(model, a.path(), 3, 4, 2), 1, &log), 0) << log;
  const std::string ck = " --resume_from_checkpoint " + (a.path() / "checkpoint-3").string();
  EXPECT_NE(run_trainer(args(model, b.path(), 6, 4, 2, " --lora_r 4 --lora_alpha 16") + ck, 1, &log), 0);
  EXPECT_NE(log.find("lora_r is 8 in the checkpoint, 4 here"), std::string::npos) << log;
  EXPECT_NE(log.find("resume with the LoRA flags"), std::string::npos) << log;
  // Another base of the same shapes: a copy of the model whose config differs in a value.
  for (const auto& e : fs::directory_iterator(model)) fs::copy(e.path(), other.path() / e.path().filename());
  {
    std::ifstream in(model / "config.json");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string key = "\"initializer_range\": 0.02";
    ASSERT_NE(text.find(key), std::string::npos) << text;
    text.replace(text.find(key), key.size(), "\"initializer_range\": 0.03");
    std::ofstream(other.path() / "config.json", std::ios::trunc) << text;
  }
  EXPECT_NE(run_trainer(args(other.path(), b.path(), 6, 4, 2) + ck, 1, &log), 0);
  EXPECT_NE(log.find("trained on another base model"), std::string::npos) << log;
  std::string plain = args(model, b.path(), 6, 4, 2, "");
  plain.replace(plain.find(" --use_peft True"), 16, "");
  EXPECT_NE(run_trainer(plain + ck, 1, &log), 0);
  EXPECT_NE(log.find("it is a checkpoint of a LoRA run; add --use_peft True"), std::string::npos) << log;
}

TEST(LoraResume, KillNineDuringAnAdapterSaveLeavesThePreviousCheckpoint) {
  SKIP_WITHOUT_FIXTURE();
  TempDir out("lora_kill9");
  const std::string run = args(kFixture / "model", out.path(), 6, 4, 2);
  BackgroundRun bg = launch_trainer(run, 1, out.path() / "run.log", "ckpt.pause_before_seal=3000");
  // checkpoint-3 completes (after a 3 s pause); kill while checkpoint-6's adapter is staged.
  const bool staged = bg.wait_until([&] { return fs::exists(out.path() / "tmp-checkpoint-6" / "trainer_state.json"); });
  bg.signal(SIGKILL);
  const int status = bg.wait();
  ASSERT_TRUE(staged) << "the run never reached the second save";
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_TRUE(fs::exists(out.path() / "tmp-checkpoint-6" / "adapter_model.safetensors"));
  EXPECT_FALSE(fs::exists(out.path() / "checkpoint-6"));
  EXPECT_EQ(ckpt::checkpoint_problem(out.path() / "checkpoint-3"), "");
  std::string log;
  ASSERT_EQ(run_trainer(run + " --resume_from_checkpoint True", 1, &log), 0) << log;
  EXPECT_NE(log.find("checkpoint-3"), std::string::npos) << log;
  EXPECT_TRUE(fs::exists(out.path() / "checkpoint-6" / "adapter_model.safetensors"));
  EXPECT_TRUE(fs::exists(out.path() / "adapter_config.json"));
}

}  // namespace test_lora_resume

// A module's test files compile as one unit (tests/CMakeLists.txt): this file's macros end here.
#undef SKIP_WITHOUT_FIXTURE
