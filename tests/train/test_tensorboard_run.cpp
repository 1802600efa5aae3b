// --report_to tensorboard on real runs of alpaca-train (the tiny parity model, CPU), read back with
// tensorboard's own EventAccumulator (tests/reference/tensorboard_check.py compare): a 2-rank run
// with eval writes one event file (rank 0) in HF's output_dir/runs/<date>_<host> holding every
// metrics.jsonl number under HF's tag with the same step and float32 value, plus the arguments
// as text; a run killed with SIGKILL leaves an event file that opens with every step logged
// before the kill. scripts/plot_metrics.py draws the 2-rank run.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "test_util.h"
#include "train_test_util.h"

namespace test_tensorboard_run {

namespace fs = std::filesystem;
using namespace alpaca::testing;

namespace {

const fs::path kFixture = fixture_dir("train_parity");

#define SKIP_WITHOUT_FIXTURE() \
  if (fs::exists(kFixture / "SKIPPED")) GTEST_SKIP() << "fixture skipped (no shared data)"

TrainFlags run_args(const fs::path& out) {
  return TrainFlags(kFixture, out).batch(2, 1).set("--learning_rate 1e-3 --save_strategy no").set(kCosineWarmup)
      .set(kFullShard);
}

// tensorboard_check.py compare: rc 0 and its JSON summary.
nlohmann::json compare(const fs::path& event_dir, const fs::path& metrics, bool killed, int* rc) {
  std::string out;
  *rc = run_command(python() + " " + (source_dir() / "tests/reference/tensorboard_check.py").string() + " compare " +
                        event_dir.string() + " " + metrics.string() + (killed ? " --killed" : ""),
                    &out);
  const size_t at = out.find("{\"log_lines\"");
  EXPECT_NE(at, std::string::npos) << out;
  return at == std::string::npos ? nlohmann::json::object() : nlohmann::json::parse(out.substr(at));
}

size_t lines_in(const fs::path& p) {
  std::ifstream f(p);
  size_t n = 0;
  for (std::string line; std::getline(f, line);) n += !line.empty();
  return n;
}

}  // namespace

TEST(TensorBoardRun, TwoRanksWithEvalEveryMetricIsInTheEventFile) {
  SKIP_WITHOUT_FIXTURE();
  TempDir tmp("tb_run");
  const fs::path out = tmp.path() / "out";
  std::string log;
  ASSERT_EQ(run_trainer(run_args(out)
                            .set("--max_steps 6 --eval_data_path " + (kFixture / "data.json").string() +
                                 " --eval_strategy steps --eval_steps 3 --per_device_eval_batch_size 4 --report_to all"),
                        2, &log),
            0)
      << log;
  // HF's default: one new directory output_dir/runs/<Mon><DD>_<HH>-<MM>-<SS>_<host>; one file (rank 0 only).
  std::vector<fs::path> runs;
  for (const auto& e : fs::directory_iterator(out / "runs")) runs.push_back(e.path());
  ASSERT_EQ(runs.size(), 1u);
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(runs[0])) files += e.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
  EXPECT_EQ(files, 1u) << "only rank 0 writes";
  EXPECT_NE(log.find("TensorBoard events: " + runs[0].string()), std::string::npos) << log;

  int rc = 0;
  const auto r = compare(runs[0], out / "metrics.jsonl", false, &rc);
  EXPECT_EQ(rc, 0) << r.dump(1);
  std::cout << "[tensorboard] " << r["values"] << " values of " << r["log_lines"] << " metrics.jsonl lines found; tags "
            << r["tags"].dump() << "\n";
  const auto has = [&](const std::string& tag) {
    for (const auto& t : r["tags"])
      if (t == tag) return true;
    return false;
  };
  for (const char* tag : {"train/loss", "train/learning_rate", "train/grad_norm", "train/epoch", "eval/loss",
                          "eval/runtime", "eval/samples_per_second", "train/train_runtime", "train/train_loss",
                          "train/tokens_per_second", "train/host_rss_bytes", "train/step_time"})
    EXPECT_TRUE(has(tag)) << tag << " missing from " << r["tags"].dump();
  EXPECT_EQ(r["steps"], nlohmann::json({1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(r["texts"], nlohmann::json({"args/text_summary", "model_config/text_summary"}));

  // The plot script draws this run.
  std::string plot;
  ASSERT_EQ(run_command(python() + " " + (source_dir() / "scripts/plot_metrics.py").string() + " " + out.string(), &plot), 0)
      << plot;
  EXPECT_NE(plot.find((out / "metrics.png").string()), std::string::npos) << plot;
  std::ifstream png(out / "metrics.png", std::ios::binary);
  std::string magic(8, '\0');
  png.read(magic.data(), 8);
  EXPECT_EQ(magic, "\x89PNG\r\n\x1a\n");
  EXPECT_GT(fs::file_size(out / "metrics.png"), 20000u);
}

TEST(TensorBoardRun, SigkillMidRunLeavesEveryLoggedStepReadable) {
  SKIP_WITHOUT_FIXTURE();
  TempDir tmp("tb_kill");
  const fs::path out = tmp.path() / "out", logdir = tmp.path() / "tb";
  BackgroundRun run = launch_trainer(run_args(out).set("--max_steps 400 --report_to all --logging_dir " + logdir.string()), 1,
                                     tmp.path() / "run.log");
  // --logging_dir given: metrics.jsonl and the event file both go there. Kill after 4 logs.
  const bool logged = run.wait_until([&] { return lines_in(logdir / "metrics.jsonl") >= 4; });
  run.signal(SIGKILL);
  const int status = run.wait();
  ASSERT_TRUE(logged) << "the run never logged 4 steps";
  ASSERT_TRUE(WIFSIGNALED(status)) << "the run ended before the kill";
  EXPECT_FALSE(fs::exists(out / "train_results.json"));

  int rc = 0;
  const auto r = compare(logdir, logdir / "metrics.jsonl", /*killed=*/true, &rc);
  EXPECT_EQ(rc, 0) << r.dump(1);
  EXPECT_GE(r["log_lines"].get<int>(), 4) << r.dump();
  std::cout << "[tensorboard] killed after step " << r["steps"].back() << "; every one of " << r["log_lines"]
            << " logged steps is in the event file\n";
}

}  // namespace test_tensorboard_run

// A module's test files compile as one unit (tests/CMakeLists.txt): this file's macros end here.
#undef SKIP_WITHOUT_FIXTURE
