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
#include "alpaca/io/safetensors.h"
#include "test_util.h"
#include "train_test_util.h"

namespace fs = std::filesystem;
using namespace alpaca;
using namespace alpaca::testing;

namespace {

fs::path fixture() { return binary_dir() / "fixtures" / "lora_parity"; }

std::string args(const fs::path& model, const fs::path& out, int steps, int per_device, int accum,
                 const std::string& lora = " --lora_r 8 --lora_alpha 16") {
  return "--model_name_or_path " + model.string() + " --data_path " + (fixture() / "data.json").string() +
         " --output_dir " + out.string() + " --max_steps " + std::to_string(steps) + " --per_device_train_batch_size " +
         std::to_string(per_device) + " --gradient_accumulation_steps " + std::to_string(accum) +
         " --learning_rate 2e-2 --warmup_ratio 0.1 --lr_scheduler_type cosine --model_max_length 64 --logging_steps 1"
         " --report_to jsonl --seed 42 --save_steps 3 --use_peft True" + lora;  // LoRA dropout: the default 0.05
}

std::map<std::string, at::Tensor> adapter(const fs::path& dir) {
  auto f = io::SafetensorsFile::open((dir / "adapter_model.safetensors").string());
  std::map<std::string, at::Tensor> out;
  for (const auto& n : f->names()) out[n] = f->tensor(n).clone();
  return out;
}

#define SKIP_WITHOUT_FIXTURE() \
  if (fs::exists(fixture() / "SKIPPED")) GTEST_SKIP() << "reference fixture skipped (no shared data)"

}  // namespace

TEST(LoraResume, SixStepsStraightEqualThreePlusThreeBitwise) {
  SKIP_WITHOUT_FIXTURE();
  const fs::path model = fixture() / "model";
  TempDir a("lora_straight"), b("lora_resumed");
  std::string log;
  ASSERT_EQ(run_trainer(args(model, a.path(), 6, 4, 2), 1, &log), 0) << log;
  const fs::path ck = a.path() / "checkpoint-3";
  ASSERT_EQ(ckpt::checkpoint_problem(ck), "");
  EXPECT_TRUE(fs::exists(ck / "adapter_config.json"));
  EXPECT_TRUE(fs::exists(ck / "optimizer.safetensors"));
  EXPECT_FALSE(fs::exists(ck / "model.safetensors")) << "a LoRA checkpoint holds the adapter, not the base";
  ASSERT_EQ(run_trainer(args(model, b.path(), 6, 4, 2) + " --resume_from_checkpoint " + ck.string(), 1, &log), 0) << log;
  const auto la = read_step_logs(a.path()), lb = read_step_logs(b.path());
  ASSERT_EQ(la.size(), 6u);
  ASSERT_EQ(lb.size(), 3u) << log;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(lb[i].loss, la[3 + i].loss) << "step " << lb[i].step << " is not bitwise equal";
  const auto wa = adapter(a.path()), wb = adapter(b.path());
  ASSERT_EQ(wa.size(), wb.size());
  for (const auto& [n, t] : wa) EXPECT_TRUE(at::equal(t, wb.at(n))) << n << " is not bitwise equal after resume";
}

TEST(LoraResume, ResumeOnAnotherWorldSizeWithoutDropoutMatches) {
  SKIP_WITHOUT_FIXTURE();
  const fs::path model = fixture() / "model";
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
  const fs::path model = fixture() / "model";
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
  const std::string run = args(fixture() / "model", out.path(), 6, 4, 2);
  const std::string cmd = "ALPACA_FAULTS=ckpt.pause_before_seal=3000 exec " + train_bin() + " " + run + " > " +
                          (out.path() / "run.log").string() + " 2>&1";
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // checkpoint-3 completes (after a 3 s pause); kill while checkpoint-6's adapter is staged.
  bool staged = false;
  for (int i = 0; i < 6000 && !staged; ++i) {
    staged = fs::exists(out.path() / "tmp-checkpoint-6" / "trainer_state.json");
    if (!staged) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
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
