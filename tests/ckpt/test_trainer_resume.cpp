// Checkpoints of real training runs (the alpaca-train binary on the tiny parity model, CPU):
// bitwise resume, resume on another world size (2 -> 3), kill -9 in the middle of a save,
// rotation, SIGTERM, --resume_from_checkpoint auto, and resuming with another model or tokenizer.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "alpaca/ckpt/checkpoint_dir.h"
#include "alpaca/io/safetensors.h"
#include "test_util.h"
#include "train_test_util.h"

namespace test_trainer_resume {

namespace fs = std::filesystem;
using namespace alpaca::testing;

namespace {

const fs::path kFixture = fixture_dir("train_parity");

std::string run_args(const fs::path& model, const fs::path& out, int64_t max_steps, int per_device, int accum) {
  return TrainFlags(kFixture, out).model(model).steps(max_steps).batch(per_device, accum).set("--learning_rate 1e-3")
      .set(kCosineWarmup).set(kFullShard);
}

std::map<std::string, at::Tensor> weights(const fs::path& dir) {
  auto f = alpaca::io::SafetensorsFile::open((dir / "model.safetensors").string());
  std::map<std::string, at::Tensor> out;
  for (const auto& n : f->names()) out[n] = f->tensor(n).clone();
  return out;
}

std::set<std::string> checkpoints_in(const fs::path& dir) {
  std::set<std::string> s;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("checkpoint-", 0) == 0) s.insert(e.path().filename().string());
  return s;
}

#define SKIP_WITHOUT_FIXTURE() ALPACA_SKIP_IF_FIXTURE_SKIPPED(kFixture)

}  // namespace

TEST(TrainerResume, BitwiseTenStraightVersusFivePlusFive) {
  SKIP_WITHOUT_FIXTURE();
  TempDir a("resume_a"), b("resume_b");
  std::string log;
  ASSERT_EQ(run_trainer(run_args(kFixture / "model", a.path(), 10, 2, 2) + " --save_steps 5", 2, &log), 0) << log;
  ASSERT_TRUE(fs::exists(a.path() / "checkpoint-5"));
  // "Stop after 5": a fresh output_dir holding only checkpoint-5; resume it for the last 5 steps.
  // Another --learning_rate changes nothing: the checkpoint's schedule continues, as transformers
  // restores the scheduler's base_lrs, and a warning says so.
  fs::copy(a.path() / "checkpoint-5", b.path() / "checkpoint-5", fs::copy_options::recursive);
  ASSERT_EQ(run_trainer(run_args(kFixture / "model", b.path(), 10, 2, 2) +
                            " --save_steps 5 --resume_from_checkpoint True --learning_rate 5e-4", 2, &log), 0) << log;
  EXPECT_NE(log.find("continues its learning rate 0.001"), std::string::npos) << log;
  const auto la = read_step_logs(a.path()), lb = read_step_logs(b.path());
  ASSERT_EQ(la.size(), 10u);
  ASSERT_EQ(lb.size(), 5u) << log;
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(lb[i].step, la[5 + i].step);
    EXPECT_EQ(lb[i].loss, la[5 + i].loss) << "step " << lb[i].step << " must be bitwise identical";
    EXPECT_EQ(lb[i].learning_rate, la[5 + i].learning_rate);
  }
  const auto wa = weights(a.path()), wb = weights(b.path());
  ASSERT_EQ(wa.size(), wb.size());
  for (const auto& [name, t] : wa) EXPECT_TRUE(at::equal(t, wb.at(name))) << name << " differs after resume";
  // HF's trainer_state.json carries the whole log history across the resume.
  std::ifstream st(b.path() / "trainer_state.json");
  const auto state = nlohmann::json::parse(st);
  EXPECT_EQ(state["global_step"], 10);
  EXPECT_GE(state["log_history"].size(), 10u);
  // train_loss (train_results.json): each session's own losses over its own steps, as HF's train().
  auto train_loss = [](const fs::path& dir) {
    std::ifstream f(dir / "train_results.json");
    return nlohmann::json::parse(f).at("train_loss").get<double>();
  };
  auto mean_loss = [](const std::vector<StepLog>& logs, size_t from) {
    double s = 0;
    for (size_t i = from; i < logs.size(); ++i) s += logs[i].loss;
    return s / static_cast<double>(logs.size() - from);
  };
  EXPECT_NEAR(train_loss(a.path()), mean_loss(la, 0), 1e-3 * mean_loss(la, 0));
  EXPECT_NEAR(train_loss(b.path()), mean_loss(lb, 0), 1e-3 * mean_loss(lb, 0)) << "the resumed session's steps only";
}

// HF's ignore_data_skip: a resume three steps into a five-step epoch (40 records, global batch 8)
// trains steps 4-6 on the epoch's first three batches (their token counts are those of steps 1-3 of
// the straight run, which differ from its steps 4-6 at model_max_length 512), with HF's epoch float
// (0.2 at step 4); without it the same resume continues the data (and the losses) bitwise.
TEST(TrainerResume, IgnoreDataSkipRestartsTheInterruptedEpochsData) {
  SKIP_WITHOUT_FIXTURE();
  TempDir a("skip_a"), b("skip_b"), c("skip_c");
  std::string log;
  auto args = [&](const fs::path& out) {
    return TrainFlags(kFixture, out).steps(6).batch(4, 2).set("--learning_rate 1e-3 --model_max_length 512 --save_steps 3")
        .set(kCosineWarmup).str();
  };
  ASSERT_EQ(run_trainer(args(a.path()), 1, &log), 0) << log;
  const auto tokens = [](const fs::path& out) {
    std::map<int64_t, std::pair<double, double>> t;  // step -> (tokens_per_step, epoch)
    for (const auto& m : read_metrics(out))
      if (m.count("loss")) t[static_cast<int64_t>(m.at("step"))] = {m.at("tokens_per_step"), m.at("epoch")};
    return t;
  };
  const auto ta = tokens(a.path());
  ASSERT_EQ(ta.size(), 6u);
  ASSERT_NE(ta.at(1).first, ta.at(4).first) << "the check needs batches of different sizes";
  std::string log_b;
  for (const auto& [dir, extra] : {std::pair{b.path(), " --ignore_data_skip True"}, std::pair{c.path(), ""}}) {
    fs::copy(a.path() / "checkpoint-3", dir / "checkpoint-3", fs::copy_options::recursive);
    ASSERT_EQ(run_trainer(args(dir) + " --resume_from_checkpoint True" + extra, 1, &log), 0) << log;
    if (dir == b.path()) log_b = log;
  }
  EXPECT_NE(log_b.find("--ignore_data_skip: epoch 0 starts again"), std::string::npos) << log_b;
  EXPECT_EQ(log.find("--ignore_data_skip"), std::string::npos) << log;
  const auto tb = tokens(b.path()), tc = tokens(c.path());
  ASSERT_EQ(tb.size(), 3u);
  ASSERT_EQ(tc.size(), 3u);
  for (int64_t s = 4; s <= 6; ++s) {
    EXPECT_EQ(tb.at(s).first, ta.at(s - 3).first) << "step " << s << " trains batch " << s - 3 << " of the epoch";
    EXPECT_NEAR(tb.at(s).second, static_cast<double>(s - 3) / 5, 1e-12) << "HF's epoch float restarts with the data";
    EXPECT_EQ(tc.at(s).first, ta.at(s).first);
  }
  const auto la = read_step_logs(a.path()), lc = read_step_logs(c.path());
  for (size_t i = 0; i < lc.size(); ++i) EXPECT_EQ(lc[i].loss, la[3 + i].loss);
}

// NEFTune (--neftune_noise_alpha, HF's neftune_post_forward_hook): the noise changes the training
// forwards (step 1's loss differs from the same run without it) but not evaluation (eval_on_start
// equal to the bit), and it is drawn from the default generator, which every rank's checkpoint
// carries: 4 straight == 2 + resume 2, bitwise, at world 2.
TEST(TrainerResume, NeftuneNoiseTrainsResumesBitwiseAndSparesEvaluation) {
  SKIP_WITHOUT_FIXTURE();
  TempDir a("neftune_a"), b("neftune_b"), plain("neftune_plain");
  const std::string eval = " --save_steps 2 --eval_on_start True --per_device_eval_batch_size 4 --eval_data_path " +
                           (kFixture / "data.json").string();
  std::string log;
  ASSERT_EQ(run_trainer(run_args(kFixture / "model", a.path(), 4, 2, 1) + eval + " --neftune_noise_alpha 5", 2, &log), 0)
      << log;
  ASSERT_EQ(run_trainer(run_args(kFixture / "model", plain.path(), 4, 2, 1) + eval, 2, &log), 0) << log;
  auto eval_losses = [](const fs::path& dir) {
    std::vector<double> out;
    for (const auto& m : read_metrics(dir))
      if (m.count("eval_loss")) out.push_back(m.at("eval_loss"));
    return out;
  };
  const auto ea = eval_losses(a.path()), ep = eval_losses(plain.path());
  ASSERT_FALSE(ea.empty());
  ASSERT_FALSE(ep.empty());
  EXPECT_EQ(ea[0], ep[0]) << "evaluation before training saw NEFTune noise";
  const auto la = read_step_logs(a.path()), lp = read_step_logs(plain.path());
  ASSERT_EQ(la.size(), 4u);
  ASSERT_EQ(lp.size(), 4u);
  EXPECT_NE(la[0].loss, lp[0].loss) << "the first training forward saw no noise";
  EXPECT_NEAR(la[0].loss, lp[0].loss, 0.05 * lp[0].loss) << "noise of alpha 5 over L * d elements is small";

  fs::copy(a.path() / "checkpoint-2", b.path() / "checkpoint-2", fs::copy_options::recursive);
  ASSERT_EQ(run_trainer(run_args(kFixture / "model", b.path(), 4, 2, 1) + " --save_steps 2 --neftune_noise_alpha 5 "
                        "--resume_from_checkpoint True", 2, &log), 0) << log;
  const auto lb = read_step_logs(b.path());
  ASSERT_EQ(lb.size(), 2u) << log;
  for (int i = 0; i < 2; ++i) EXPECT_EQ(lb[i].loss, la[2 + i].loss) << "step " << lb[i].step << " is not bitwise equal";
  const auto wa = weights(a.path()), wb = weights(b.path());
  for (const auto& [name, t] : wa) EXPECT_TRUE(at::equal(t, wb.at(name))) << name << " differs after resume";
}

TEST(TrainerResume, TwoRanksToThreeMatchesWithinFp32Tolerance) {
  SKIP_WITHOUT_FIXTURE();
  TempDir a("reshard_a"), b("reshard_b");
  std::string log;
  // Global batch 6 both times: 2 ranks x 3, then 3 ranks x 2.
  ASSERT_EQ(run_trainer(run_args(kFixture / "model", a.path(), 10, 3, 1) + " --save_steps 5", 2, &log), 0) << log;
  fs::copy(a.path() / "checkpoint-5", b.path() / "checkpoint-5", fs::copy_options::recursive);
  ASSERT_EQ(run_trainer(run_args(kFixture / "model", b.path(), 10, 2, 1) +
                            " --save_steps 5 --resume_from_checkpoint " + (b.path() / "checkpoint-5").string(), 3, &log), 0)
      << log;
  const auto la = read_step_logs(a.path()), lb = read_step_logs(b.path());
  ASSERT_EQ(lb.size(), 5u) << log;
  for (int i = 0; i < 5; ++i)
    EXPECT_NEAR(lb[i].loss, la[5 + i].loss, 1e-4 * std::abs(la[5 + i].loss)) << "step " << lb[i].step;
  const auto wa = weights(a.path()), wb = weights(b.path());
  for (const auto& [name, t] : wa) {
    const double rel = (t - wb.at(name)).norm().item<double>() / std::max(t.norm().item<double>(), 1e-12);
    EXPECT_LE(rel, 1e-4) << name;
  }
}

TEST(TrainerResume, KillNineMidSaveLeavesPreviousCheckpointAndResumes) {
  SKIP_WITHOUT_FIXTURE();
  TempDir out("kill9");
  BackgroundRun run = launch_trainer(run_args(kFixture / "model", out.path(), 6, 4, 1) + " --save_steps 2", 1,
                                     out.path() / "run.log", "ckpt.pause_before_seal=3000");
  // checkpoint-2 completes (after a 3 s pause); kill as soon as checkpoint-4 is being staged.
  const bool staged = run.wait_until([&] { return fs::exists(out.path() / "tmp-checkpoint-4" / "trainer_state.json"); });
  run.signal(SIGKILL);
  const int status = run.wait();
  ASSERT_TRUE(staged) << "the run never reached the second save";
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_FALSE(fs::exists(out.path() / "checkpoint-4"));
  EXPECT_EQ(alpaca::ckpt::checkpoint_problem(out.path() / "checkpoint-2"), "");
  std::string log;
  ASSERT_EQ(run_trainer(run_args(kFixture / "model", out.path(), 6, 4, 1) + " --save_steps 2 --resume_from_checkpoint True",
                        1, &log), 0) << log;
  EXPECT_NE(log.find("checkpoint-2"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(out.path() / "tmp-checkpoint-4")) << "the stale staging directory is cleaned up";
  EXPECT_TRUE(fs::exists(out.path() / "checkpoint-6"));
  EXPECT_TRUE(fs::exists(out.path() / "model.safetensors"));
}

TEST(TrainerResume, RotationKeepsSaveTotalLimit) {
  SKIP_WITHOUT_FIXTURE();
  TempDir out("rotation");
  std::string log;
  ASSERT_EQ(run_trainer(run_args(kFixture / "model", out.path(), 10, 4, 1) + " --save_steps 2 --save_total_limit 2", 1,
                        &log), 0) << log;
  EXPECT_EQ(checkpoints_in(out.path()), (std::set<std::string>{"checkpoint-8", "checkpoint-10"}));
}

// HF's best-model tracking. The loss falls at every evaluation here, so --greater_is_better True
// makes the first evaluated checkpoint the best and the last step's weights differ from it:
// (a) world 2, sharded checkpoints, --load_best_model_at_end with --save_total_limit 1: the state
//     names checkpoint-2 with the first in-training eval_loss, output_dir holds its weights (equal
//     to consolidate's), and only it is left at the end; a run without the flag exports other weights;
// (b) world 1, gathered checkpoints, --save_strategy best: only the improving evaluation saved one,
//     and output_dir again holds its weights.
TEST(TrainerResume, LoadBestModelAtEndExportsTheBestCheckpoint) {
  SKIP_WITHOUT_FIXTURE();
  TempDir a("best_sharded"), b("best_gathered"), last("best_off");
  const std::string eval = " --eval_strategy steps --eval_steps 2 --per_device_eval_batch_size 4 --eval_data_path " +
                           (kFixture / "data.json").string();
  std::string log;
  ASSERT_EQ(run_trainer(run_args(kFixture / "model", a.path(), 6, 2, 1) + eval +
                            " --save_steps 2 --save_total_limit 1 --load_best_model_at_end True --greater_is_better True",
                        2, &log), 0) << log;
  EXPECT_NE(log.find("Loading best model from " + (a.path() / "checkpoint-2").string()), std::string::npos) << log;
  const auto state = nlohmann::json::parse(std::ifstream(a.path() / "trainer_state.json"));
  EXPECT_EQ(state["best_global_step"], 2);
  EXPECT_EQ(state["best_model_checkpoint"], (a.path() / "checkpoint-2").string());
  double first_eval = 0;
  for (const auto& e : state["log_history"])
    if (e.contains("eval_loss") && e["step"] == 2) first_eval = e["eval_loss"].get<double>();
  EXPECT_EQ(state["best_metric"].get<double>(), first_eval);
  EXPECT_EQ(checkpoints_in(a.path()), (std::set<std::string>{"checkpoint-2"}));
  ASSERT_EQ(run_command(train_bin() + " consolidate " + (a.path() / "checkpoint-2").string() + " " +
                            (a.path() / "best_weights").string(), &log), 0) << log;
  const auto exported = weights(a.path()), best = weights(a.path() / "best_weights");
  ASSERT_EQ(exported.size(), best.size());
  for (const auto& [name, t] : best) EXPECT_TRUE(at::equal(t, exported.at(name))) << name << " is not the best checkpoint's";
  ASSERT_EQ(run_trainer(run_args(kFixture / "model", last.path(), 6, 2, 1) + eval + " --save_steps 2", 2, &log), 0) << log;
  const auto final_weights = weights(last.path());
  bool differs = false;
  for (const auto& [name, t] : best) differs = differs || !at::equal(t, final_weights.at(name));
  EXPECT_TRUE(differs) << "the last step's weights equal checkpoint-2's: the test shows nothing";

  ASSERT_EQ(run_trainer(run_args(kFixture / "model", b.path(), 6, 4, 1) + eval +
                            " --save_strategy best --metric_for_best_model loss --greater_is_better True "
                            "--save_checkpoint_layout gathered --load_best_model_at_end True",
                        1, &log), 0) << log;
  EXPECT_EQ(checkpoints_in(b.path()), (std::set<std::string>{"checkpoint-2"}));
  const auto gathered_best = weights(b.path() / "checkpoint-2"), gathered_out = weights(b.path());
  for (const auto& [name, t] : gathered_best)
    EXPECT_TRUE(at::equal(t, gathered_out.at(name))) << name << " is not the best checkpoint's";
}

// --lr_scheduler_type reduce_lr_on_plateau: the rate changes only after evaluations, on the
// tracked metric. mode max with patience 0 on a falling eval loss halves it after every evaluation
// but the first, so the steps log base, base, base/2, base/4 (HF logs before evaluating); the
// scheduler's state travels in the checkpoint: 2 + resume 2 equals 4 straight, bitwise, at world 2.
TEST(TrainerResume, ReduceLrOnPlateauStepsOnEvaluationsAndResumes) {
  SKIP_WITHOUT_FIXTURE();
  TempDir a("plateau_a"), b("plateau_b");
  const std::string flags = " --lr_scheduler_type reduce_lr_on_plateau --warmup_ratio 0 --lr_scheduler_kwargs "
                            "'{\"mode\": \"max\", \"patience\": 0, \"factor\": 0.5}' --eval_strategy steps "
                            "--eval_steps 1 --save_steps 2 --per_device_eval_batch_size 4 --eval_data_path " +
                            (kFixture / "data.json").string();
  std::string log;
  ASSERT_EQ(run_trainer(TrainFlags(kFixture, a.path()).model(kFixture / "model").steps(4).batch(2, 1)
                            .set("--learning_rate 1e-3").set(kFullShard).str() + flags, 2, &log), 0) << log;
  const auto la = read_step_logs(a.path());
  ASSERT_EQ(la.size(), 4u);
  const std::vector<double> want = {1e-3, 1e-3, 5e-4, 2.5e-4};
  for (int i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(la[i].learning_rate, want[i]) << "step " << la[i].step;
  fs::copy(a.path() / "checkpoint-2", b.path() / "checkpoint-2", fs::copy_options::recursive);
  ASSERT_EQ(run_trainer(TrainFlags(kFixture, b.path()).model(kFixture / "model").steps(4).batch(2, 1)
                            .set("--learning_rate 1e-3").set(kFullShard).str() + flags + " --resume_from_checkpoint True",
                        2, &log), 0) << log;
  const auto lb = read_step_logs(b.path());
  ASSERT_EQ(lb.size(), 2u) << log;
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(lb[i].learning_rate, la[2 + i].learning_rate) << "step " << lb[i].step;
    EXPECT_EQ(lb[i].loss, la[2 + i].loss) << "step " << lb[i].step << " is not bitwise equal";
  }
  const auto wa = weights(a.path()), wb = weights(b.path());
  for (const auto& [name, t] : wa) EXPECT_TRUE(at::equal(t, wb.at(name))) << name << " differs after resume";
}

// HF's eval_delay: no scheduled evaluation before step 3 (steps strategy), so of every-step
// evaluations over 4 steps only steps 3 and 4 evaluate.
TEST(TrainerResume, EvalDelaySkipsTheEarlyEvaluations) {
  SKIP_WITHOUT_FIXTURE();
  TempDir out("eval_delay");
  std::string log;
  ASSERT_EQ(run_trainer(run_args(kFixture / "model", out.path(), 4, 4, 1) + " --save_strategy no --eval_strategy steps "
                        "--eval_steps 1 --eval_delay 3 --per_device_eval_batch_size 8 --eval_data_path " +
                            (kFixture / "data.json").string(), 1, &log), 0) << log;
  std::vector<int64_t> eval_steps;
  for (const auto& m : read_metrics(out.path()))
    if (m.count("eval_loss")) eval_steps.push_back(static_cast<int64_t>(m.at("step")));
  EXPECT_EQ(eval_steps, (std::vector<int64_t>{3, 4}));
}

// --save_only_model checkpoints hold weights only (transformers: "prevents resuming training"): a
// resume, explicit or `auto`, says so and names the way to their weights (consolidate, then
// --model_name_or_path), which trains; a checkpoint given as the model is pointed to consolidate.
TEST(TrainerResume, SaveOnlyModelCheckpointsAreWeightsToConsolidateNotResume) {
  SKIP_WITHOUT_FIXTURE();
  TempDir out("save_only_model");
  std::string log;
  ASSERT_EQ(run_trainer(run_args(kFixture / "model", out.path(), 2, 4, 1) + " --save_steps 2 --save_only_model True", 1, &log),
            0) << log;
  const fs::path ckpt = out.path() / "checkpoint-2";
  ASSERT_EQ(alpaca::ckpt::checkpoint_problem(ckpt), "") << log;
  for (const std::string& resume : {ckpt.string(), std::string("auto")}) {
    EXPECT_NE(run_trainer(run_args(kFixture / "model", out.path(), 4, 4, 1) + " --resume_from_checkpoint " + resume, 1, &log), 0);
    EXPECT_NE(log.find(ckpt.string() + " was saved with --save_only_model"), std::string::npos) << log;
    EXPECT_NE(log.find("alpaca-train consolidate " + ckpt.string()), std::string::npos) << log;
    EXPECT_EQ(log.find(".cpp:"), std::string::npos) << "a user's error shows no source location:\n" << log;
  }
  EXPECT_NE(run_trainer(run_args(ckpt, out.path() / "from_ckpt", 1, 4, 1), 1, &log), 0);
  EXPECT_NE(log.find("is an alpaca-train training checkpoint"), std::string::npos) << log;
  EXPECT_NE(log.find("alpaca-train consolidate " + ckpt.string() + " OUT"), std::string::npos) << log;
  ASSERT_EQ(std::system((train_bin() + " consolidate " + ckpt.string() + " " + (out.path() / "weights").string() +
                         " > /dev/null 2>&1").c_str()), 0);
  ASSERT_EQ(run_trainer(run_args(out.path() / "weights", out.path() / "from_weights", 1, 4, 1), 1, &log), 0) << log;
}

// HF's epoch strategies also fire when the run ends inside an epoch (max_steps, fractional
// num_train_epochs): the last epoch, cut short, is evaluated and saved like the others.
TEST(TrainerResume, EpochStrategiesEvaluateAndSaveAnEpochCutShort) {
  SKIP_WITHOUT_FIXTURE();
  TempDir out("epoch_cut");
  std::string log;
  // 40 examples in batches of 4: 10 steps an epoch, the run ends at step 15.
  ASSERT_EQ(run_trainer(run_args(kFixture / "model", out.path(), 15, 4, 1) + " --save_strategy epoch --eval_strategy epoch "
                        "--eval_data_path " + (kFixture / "data.json").string() + " --per_device_eval_batch_size 8", 1, &log),
            0) << log;
  EXPECT_EQ(checkpoints_in(out.path()), (std::set<std::string>{"checkpoint-10", "checkpoint-15"}));
  size_t evals = 0;
  for (size_t at = log.find("'eval_loss'"); at != std::string::npos; at = log.find("'eval_loss'", at + 1)) ++evals;
  EXPECT_EQ(evals, 2u) << log;
}

TEST(TrainerResume, SigtermSavesAndExits75) {
  SKIP_WITHOUT_FIXTURE();
  TempDir out("sigterm");
  BackgroundRun run =
      launch_trainer(run_args(kFixture / "model", out.path(), 100000, 4, 1) + " --save_strategy no", 1, out.path() / "run.log");
  ASSERT_TRUE(run.wait_until([&] { return read_step_logs(out.path()).size() >= 3; })) << "no training steps logged";
  run.signal(SIGTERM);
  const int status = run.wait();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 75);
  const auto latest = alpaca::ckpt::find_latest_complete_checkpoint(out.path());
  ASSERT_TRUE(latest) << "SIGTERM must leave a complete checkpoint";
  EXPECT_GE(*alpaca::ckpt::parse_checkpoint_step(latest->filename().string()), 3);
}

// A preemption notice that arrives during set-up (here: as soon as the data is tokenized, before
// the engine is built; training_args.json is written only once set-up succeeds) is not fatal: the
// run does its first step, saves checkpoint-1 and exits 75.
TEST(TrainerResume, Sigusr1DuringSetupSavesAfterTheFirstStep) {
  SKIP_WITHOUT_FIXTURE();
  TempDir out("usr1_setup");
  BackgroundRun run =
      launch_trainer(run_args(kFixture / "model", out.path(), 100000, 4, 1) + " --save_strategy no", 1, out.path() / "run.log");
  ASSERT_TRUE(run.wait_for_log("tokenized ")) << "the data was never tokenized";
  run.signal(SIGUSR1);
  const int status = run.wait();
  const std::string log = run.log();
  ASSERT_TRUE(WIFEXITED(status)) << log;
  EXPECT_EQ(WEXITSTATUS(status), 75) << log;
  EXPECT_EQ(read_step_logs(out.path()).size(), 1u) << log;
  EXPECT_EQ(alpaca::ckpt::checkpoint_problem(out.path() / "checkpoint-1"), "") << log;
}

// --resume_from_checkpoint auto (the batch scripts' flag): a fresh start when output_dir has no
// checkpoint, the newest complete one when it has, and then the same weights as a straight run.
TEST(TrainerResume, AutoStartsFreshWithoutACheckpointAndResumesTheNewest) {
  SKIP_WITHOUT_FIXTURE();
  TempDir a("auto_a"), b("auto_b");
  std::string log;
  ASSERT_EQ(run_trainer(run_args(kFixture / "model", a.path(), 4, 2, 1) + " --save_steps 2 --resume_from_checkpoint auto",
                        1, &log), 0) << log;
  EXPECT_NE(log.find("--resume_from_checkpoint auto: no complete checkpoint-<step>"), std::string::npos) << log;
  ASSERT_EQ(read_step_logs(a.path()).size(), 4u);
  // A "requeued" run: only checkpoint-2 and a half-written later one are there.
  fs::copy(a.path() / "checkpoint-2", b.path() / "checkpoint-2", fs::copy_options::recursive);
  fs::create_directories(b.path() / "tmp-checkpoint-3");
  ASSERT_EQ(run_trainer(run_args(kFixture / "model", b.path(), 4, 2, 1) + " --save_steps 2 --resume_from_checkpoint AUTO",
                        1, &log), 0) << log;
  EXPECT_NE(log.find("resuming from " + (b.path() / "checkpoint-2").string()), std::string::npos) << log;
  EXPECT_EQ(read_step_logs(b.path()).size(), 2u) << log;
  const auto wa = weights(a.path()), wb = weights(b.path());
  ASSERT_EQ(wa.size(), wb.size());
  for (const auto& [name, t] : wa) EXPECT_TRUE(at::equal(t, wb.at(name))) << name << " differs after the resume";
}

TEST(TrainerResume, DifferentModelOrTokenizerIsAnErrorThatSaysWhich) {
  SKIP_WITHOUT_FIXTURE();
  TempDir out("mismatch"), other("other_model");
  std::string log;
  ASSERT_EQ(run_trainer(run_args(kFixture / "model", out.path(), 2, 4, 1) + " --save_steps 2", 1, &log), 0) << log;
  const fs::path ckpt = out.path() / "checkpoint-2";

  // Another model: the same files with a wider intermediate size in config.json.
  fs::copy(kFixture / "model", other.path() / "m", fs::copy_options::recursive);
  {
    std::ifstream f(other.path() / "m" / "config.json");
    auto cfg = nlohmann::json::parse(f);
    cfg["intermediate_size"] = 96;
    std::ofstream(other.path() / "m" / "config.json") << cfg.dump(2);
  }
  // On two ranks: both find the mismatch, one reports it, as a plain message without file:line.
  int rc = run_trainer(run_args(other.path() / "m", out.path(), 4, 4, 1) + " --resume_from_checkpoint " + ckpt.string(), 2, &log);
  EXPECT_NE(rc, 0);
  const std::string why = "different model: intermediate_size is 64 in the checkpoint, 96 here";
  size_t times = 0;
  for (size_t at = log.find(why); at != std::string::npos; at = log.find(why, at + 1)) ++times;
  EXPECT_EQ(times, 1u) << "an error every rank finds is printed once:\n" << log;
  EXPECT_EQ(log.find(".cpp:"), std::string::npos) << "a user's error shows no source location:\n" << log;

  // Another tokenizer: same model, but the tokenizer's pad token is <unk> (so no [PAD] is added).
  fs::copy(kFixture / "model", other.path() / "t", fs::copy_options::recursive);
  std::ofstream(other.path() / "t" / "special_tokens_map.json") << R"({"pad_token": "<unk>"})";
  rc = run_trainer(run_args(other.path() / "t", out.path(), 4, 4, 1) + " --resume_from_checkpoint " + ckpt.string(), 1, &log);
  EXPECT_NE(rc, 0);
  EXPECT_NE(log.find("different tokenizer"), std::string::npos) << log;
  EXPECT_NE(log.find("pad_token is [PAD] in the checkpoint, <unk> here"), std::string::npos) << log;
}

}  // namespace test_trainer_resume

// A module's test files compile as one unit (tests/CMakeLists.txt): this file's macros end here.
#undef SKIP_WITHOUT_FIXTURE
