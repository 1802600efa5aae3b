// QLoRA checkpoints (--use_peft --load_in_4bit --use_bnb_nested_quant, issue 29) at world 2 under
// FSDP: 6 steps straight == 3 + resume 3, bitwise (LoRA dropout on, so the RNG state is part of
// it), from a synchronous and from a --save_async checkpoint; the checkpoint holds the adapter and
// its moments, never the 4-bit base. kill -9 of every rank while checkpoint-6 is staged leaves
// checkpoint-3 usable: the run resumes from it and repeats steps 4-6 bitwise.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <map>

#include "alpaca/ckpt/checkpoint_dir.h"
#include "test_util.h"
#include "train_test_util.h"

namespace test_qlora_resume {

namespace fs = std::filesystem;
using namespace alpaca;
using namespace alpaca::testing;

namespace {

const fs::path kFixture = fixture_dir("qlora_parity");

std::string qlora_args(const fs::path& out, const std::string& extra) {
  return TrainFlags(kFixture, out).steps(6).batch(2, 2).set("--save_steps 3 --learning_rate 2e-2").set(kCosineWarmup)
      .set(kFullShard).set("--use_peft True --lora_r 8 --lora_alpha 16 --lora_dropout 0.1").set(kNf4Nested)
      .set(extra);
}

// The file's bytes: equal bytes of adapter_model.safetensors = every adapter tensor bitwise equal.
std::string bytes_of(const fs::path& file) {
  EXPECT_TRUE(fs::exists(file)) << file;
  return read_text(file);
}

void expect_adapter_checkpoint(const fs::path& ck) {
  EXPECT_EQ(ckpt::checkpoint_problem(ck), "");
  EXPECT_TRUE(fs::exists(ck / "adapter_model.safetensors"));
  EXPECT_TRUE(fs::is_directory(ck / "optimizer"));
  EXPECT_FALSE(fs::exists(ck / "model.safetensors")) << "a QLoRA checkpoint holds the adapter, not the 4-bit base";
}

#define SKIP_WITHOUT_FIXTURE() ALPACA_SKIP_IF_FIXTURE_SKIPPED(kFixture)

}  // namespace

TEST(QloraResume, World2SixStepsEqualThreePlusThreeBitwiseSyncAndAsync) {
  SKIP_WITHOUT_FIXTURE();
  TempDir tmp("qlora_resume");
  const fs::path sync = tmp.path() / "sync", async = tmp.path() / "async";
  std::string log;
  ASSERT_EQ(run_trainer(qlora_args(sync, "--save_async False"), 2, &log), 0) << log;
  ASSERT_EQ(run_trainer(qlora_args(async, "--save_async True"), 2, &log), 0) << log;
  EXPECT_NE(log.find("writing them in the background"), std::string::npos) << "checkpoint-3 must be saved asynchronously: " << log;
  const auto straight = read_step_logs(sync);
  ASSERT_EQ(straight.size(), 6u);
  const auto straight_async = read_step_logs(async);
  ASSERT_EQ(straight_async.size(), 6u);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(straight_async[i].loss, straight[i].loss) << "an async save changes nothing";
  for (const fs::path& from : {sync, async}) {
    SCOPED_TRACE(from.filename().string());
    expect_adapter_checkpoint(from / "checkpoint-3");
    const fs::path out = tmp.path() / ("resumed_" + from.filename().string());
    ASSERT_EQ(run_trainer(qlora_args(out, "--resume_from_checkpoint " + (from / "checkpoint-3").string()), 2, &log), 0)
        << log;
    const auto resumed = read_step_logs(out);
    ASSERT_EQ(resumed.size(), 3u) << log;
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(resumed[i].step, straight[3 + i].step);
      EXPECT_EQ(resumed[i].loss, straight[3 + i].loss) << "step " << resumed[i].step << " is not bitwise equal";
      EXPECT_EQ(resumed[i].grad_norm, straight[3 + i].grad_norm) << "step " << resumed[i].step;
    }
    EXPECT_TRUE(bytes_of(out / "adapter_model.safetensors") == bytes_of(sync / "adapter_model.safetensors"))
        << "the adapter after 3 + 3 steps is not bitwise the straight run's";
  }
}

// Both ranks SIGKILLed (a crashed node) while checkpoint-6 is staged.
TEST(QloraResume, KillNineOfBothRanksDuringTheSaveKeepsThePreviousCheckpoint) {
  SKIP_WITHOUT_FIXTURE();
  TempDir tmp("qlora_kill9");
  const fs::path out = tmp.path() / "out";
  const std::string run = qlora_args(out, "--save_async True");
  BackgroundRun bg = launch_trainer(run, 2, tmp.path() / "run.log", "ckpt.pause_before_seal=3000");
  const bool staged = bg.wait_for_file(out / "tmp-checkpoint-6" / "trainer_state.json");
  for (int r = 0; r < 2; ++r) signal_rank(out, r, SIGKILL);
  const int status = bg.wait();
  ASSERT_TRUE(staged) << "the run never reached the second save: " << read_text(tmp.path() / "run.log");
  EXPECT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "mpirun must report the killed ranks";
  EXPECT_TRUE(fs::exists(out / "tmp-checkpoint-6" / "adapter_model.safetensors")) << "killed before the adapter was staged";
  EXPECT_FALSE(fs::exists(out / "checkpoint-6"));
  expect_adapter_checkpoint(out / "checkpoint-3");
  std::string log;
  ASSERT_EQ(run_trainer(run + " --resume_from_checkpoint True", 2, &log), 0) << log;
  EXPECT_NE(log.find("checkpoint-3"), std::string::npos) << log;
  expect_adapter_checkpoint(out / "checkpoint-6");
  EXPECT_TRUE(fs::exists(out / "adapter_model.safetensors"));
  // metrics.jsonl holds the killed run's steps, then the resumed run's 4-6: the same bits.
  const auto logs = read_step_logs(out);
  std::map<int64_t, std::vector<double>> by_step;
  for (const auto& l : logs) by_step[l.step].push_back(l.loss);
  for (int64_t s = 4; s <= 6; ++s) {
    ASSERT_EQ(by_step[s].size(), 2u) << "step " << s << " logged " << by_step[s].size() << " times";
    EXPECT_EQ(by_step[s][0], by_step[s][1]) << "step " << s << " after resuming from checkpoint-3";
  }
}

}  // namespace test_qlora_resume

// A module's test files compile as one unit (tests/CMakeLists.txt): this file's macros end here.
#undef SKIP_WITHOUT_FIXTURE
