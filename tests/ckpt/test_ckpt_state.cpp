// trainer_state.json (read back by transformers), our resume state, fingerprints, RNG state,
// sha256, and the preemption signals with their exit codes.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "alpaca/ckpt/preemption.h"
#include "alpaca/ckpt/resume_state.h"
#include "alpaca/ckpt/trainer_state.h"
#include "alpaca/util/error.h"
#include "test_util.h"

namespace test_ckpt_state {

namespace fs = std::filesystem;
using namespace alpaca::ckpt;
using alpaca::testing::BackgroundRun;
using alpaca::testing::TempDir;

TEST(TrainerStateJson, RoundTripsAndLoadsInTransformers) {
  TempDir tmp("trainer_state");
  TrainerState s;
  s.epoch = 1.5;
  s.global_step = 12;
  s.max_steps = 24;
  s.logging_steps = 1;
  s.save_steps = 6;
  s.train_batch_size = 4;
  s.num_train_epochs = 3;
  s.log_history.push_back({{"loss", 2.25}, {"grad_norm", 1.5}, {"learning_rate", 2e-5}, {"epoch", 0.125}, {"step", int64_t{1}}});
  s.log_history.push_back({{"loss", 1.75}, {"learning_rate", 1e-5}, {"epoch", 1.5}, {"step", int64_t{12}}});
  const std::string path = (tmp.path() / kTrainerStateName).string();
  s.save(path);
  const TrainerState r = TrainerState::load(path);
  EXPECT_EQ(r.to_json(), s.to_json());
  EXPECT_EQ(r.global_step, 12);
  ASSERT_EQ(r.log_history.size(), 2u);
  EXPECT_EQ(find_log_value(r.log_history[0], "grad_norm"), 1.5);
  EXPECT_TRUE(std::holds_alternative<int64_t>(r.log_history[1].back().second)) << "step stays an integer";
  // HF's own JSON conventions: indent 2, sorted keys, trailing newline.
  EXPECT_EQ(s.to_json().substr(0, 15), "{\n  \"best_globa");
  EXPECT_EQ(s.to_json().back(), '\n');

  std::string out;
  const std::string cmd = alpaca::testing::python() + " " +
                          (alpaca::testing::source_dir() / "tests/reference/train_ckpt_hf_check.py").string() +
                          " state " + path;
  ASSERT_EQ(alpaca::testing::run_command(cmd, &out), 0) << out;
  EXPECT_NE(out.find("\"global_step\": 12"), std::string::npos) << out;
  EXPECT_NE(out.find("\"num_logs\": 2"), std::string::npos) << out;
  EXPECT_NE(out.find("\"loss\": 1.75"), std::string::npos) << out;
}

TEST(TrainerStateJson, CorruptFileNamesIt) {
  try {
    TrainerState::from_json("{\"global_step\": ", "ckpt/trainer_state.json");
    FAIL() << "no error";
  } catch (const alpaca::Error& e) {
    EXPECT_NE(e.message().find("ckpt/trainer_state.json is not valid JSON"), std::string::npos) << e.message();
  }
}

TEST(ResumeStateJson, RoundTripAndFingerprints) {
  TempDir tmp("resume_state");
  ResumeState s;
  s.global_step = 5;
  s.epoch = 1;
  s.samples_in_epoch = 40;
  s.steps_in_epoch = 2;
  s.world_size = 2;
  s.global_batch_size = 16;
  s.scheduler_step = 5;
  s.loss_scaler = LossScalerState{1024.0, 3};
  s.cpu_rng_state = capture_cpu_rng_state();
  s.model = {{"hidden_size", "64"}, {"num_hidden_layers", "2"}};
  s.tokenizer = {{"tokenizer.model sha256", "abc"}, {"vocab_size", "32001"}};
  const std::string path = (tmp.path() / kResumeStateName).string();
  s.save(path);
  const ResumeState r = ResumeState::load(path);
  EXPECT_EQ(r.to_json(), s.to_json());
  ASSERT_TRUE(r.loss_scaler);
  EXPECT_EQ(r.loss_scaler->growth_tracker, 3);
  EXPECT_FALSE(r.num_tokens) << "absent when not kept (older checkpoints)";
  s.num_input_tokens_seen = 1001;
  s.num_tokens = 1008;  // TRL's count with bfd + pad_to_multiple_of
  s.save(path);
  EXPECT_EQ(ResumeState::load(path).num_tokens, std::optional<int64_t>(1008));
  EXPECT_EQ(ResumeState::load(path).num_input_tokens_seen, 1001);

  EXPECT_EQ(fingerprint_mismatch("model", s.model, s.model), "");
  const std::string msg = fingerprint_mismatch("model", s.model, {{"hidden_size", "32"}, {"num_hidden_layers", "2"}});
  EXPECT_NE(msg.find("different model"), std::string::npos) << msg;
  EXPECT_NE(msg.find("hidden_size is 64 in the checkpoint, 32 here"), std::string::npos) << msg;
  const std::string tok = fingerprint_mismatch("tokenizer", s.tokenizer, {{"tokenizer.model sha256", "def"}, {"vocab_size", "32001"}});
  EXPECT_NE(tok.find("different tokenizer: tokenizer.model sha256 is abc"), std::string::npos) << tok;
}

TEST(ResumeStateJson, RngStateRestoresTheSameDraws) {
  const std::string saved = capture_cpu_rng_state();
  const at::Tensor a = at::randn({8});
  at::randn({100});
  restore_cpu_rng_state(saved);
  const at::Tensor b = at::randn({8});
  EXPECT_TRUE(at::equal(a, b));
  EXPECT_TRUE(capture_cuda_rng_states().empty()) << "no GPU on the test machine";
}

TEST(ResumeStateJson, Sha256KnownVectors) {
  TempDir tmp("sha");
  const fs::path p = tmp.path() / "f";
  std::ofstream(p) << "abc";
  EXPECT_EQ(sha256_file(p.string()), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  std::ofstream(p, std::ios::trunc) << std::string(1000, 'a');
  EXPECT_EQ(sha256_file(p.string()), "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3");
}

TEST(Preemption, SigtermAndSigusr1RequestSaveAndExit75) {
  clear_stop_request();
  install_preemption_handlers();
  EXPECT_EQ(stop_requested(), StopRequest::kNone);
  raise(SIGTERM);
  EXPECT_EQ(stop_requested(), StopRequest::kSaveAndExit);
  EXPECT_EQ(stop_signal(), SIGTERM);
  EXPECT_EQ(exit_code_for_stop(stop_signal()), kExitPreempted);
  EXPECT_EQ(kExitPreempted, 75);  // documented in docs/slurm.md; the batch scripts test for it
  clear_stop_request();
  raise(SIGUSR1);
  EXPECT_EQ(exit_code_for_stop(stop_signal()), 75);
  clear_stop_request();
  uninstall_preemption_handlers();
}

TEST(Preemption, SecondSigintStopsAtOnce) {
  TempDir tmp("second_sigint");
  BackgroundRun child(
      [] {
        clear_stop_request();
        install_preemption_handlers();
        raise(SIGINT);
        if (stop_requested() != StopRequest::kSaveAndExit || exit_code_for_stop(stop_signal()) != 130) _exit(3);
        raise(SIGINT);  // does not return
        _exit(4);
      },
      tmp.path() / "child.log");
  const int status = child.wait();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), kExitInterrupted);
}

}  // namespace test_ckpt_state
