// Metrics with HF Trainer's semantics: loss averaged since the last log, train_loss, speed
// metrics (compared with transformers' speed_metrics), results files, --report_to, MFU, the
// progress bar and plain log lines.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "alpaca/train/metrics.h"
#include "alpaca/train/progress.h"
#include "alpaca/train/throughput.h"
#include "alpaca/util/error.h"
#include "test_util.h"

namespace test_metrics {

using namespace alpaca::train;
using alpaca::testing::TempDir;

TEST(Metrics, LossIsAveragedSinceLastLogLikeHF) {
  LossAccumulator acc;
  std::vector<double> logged;
  for (int step = 1; step <= 7; ++step) {
    acc.add_step(static_cast<double>(step));
    if (step % 2 == 0) logged.push_back(acc.take_log_average(step));
  }
  EXPECT_EQ(logged, (std::vector<double>{1.5, 3.5, 5.5}));
  // HF: (_total_loss_scalar + the unlogged tr_loss) / steps trained.
  EXPECT_DOUBLE_EQ(acc.train_loss(7, 0), 28.0 / 7);
  EXPECT_THROW(acc.take_log_average(6), alpaca::Error);
  // A session resumed at step 4 (HF: _total_loss_scalar starts at 0, divided by the steps this
  // train() ran): its own losses over its own steps, never the earlier sessions' sum.
  LossAccumulator resumed;
  resumed.restore(4);
  resumed.add_step(5.0);
  resumed.add_step(6.0);
  EXPECT_DOUBLE_EQ(resumed.take_log_average(6), (5.0 + 6.0) / 2) << "the window starts at the checkpoint's step";
  resumed.add_step(7.0);
  EXPECT_DOUBLE_EQ(resumed.train_loss(7, 4), (5.0 + 6.0 + 7.0) / 3);
}

TEST(Metrics, SpeedMetricsMatchTransformers) {
  const LogEntry ours = speed_metrics("train", 12.345678, 96.0, 24);
  std::string out;
  const std::string cmd = alpaca::testing::python() + " " +
                          (alpaca::testing::source_dir() / "tests/reference/train_metrics_hf_check.py").string() +
                          " speed 12.345678 96 24";
  ASSERT_EQ(alpaca::testing::run_command(cmd, &out), 0) << out;
  const auto hf = nlohmann::json::parse(out.substr(out.find('{')));
  ASSERT_EQ(ours.size(), hf.size());
  for (const auto& [k, v] : ours) {
    ASSERT_TRUE(hf.contains(k)) << k;
    EXPECT_NEAR(std::get<double>(v), hf[k].get<double>(), 1e-9) << k;
  }
  EXPECT_EQ(speed_metrics("eval", 0.0, 5.0, 1).size(), 1u);
}

TEST(Metrics, ResultsFilesMergeLikeSaveMetrics) {
  TempDir tmp("results");
  save_metrics(tmp.path(), "train", {{"train_loss", 1.25}, {"epoch", 3.0}, {"train_runtime", 10.5}});
  save_metrics(tmp.path(), "eval", {{"eval_loss", 0.75}, {"epoch", 3.0}});
  std::ifstream t(tmp.path() / "train_results.json"), a(tmp.path() / "all_results.json");
  const auto train = nlohmann::json::parse(t), all = nlohmann::json::parse(a);
  EXPECT_EQ(train.size(), 3u);
  EXPECT_EQ(all["train_loss"], 1.25);
  EXPECT_EQ(all["eval_loss"], 0.75);
  EXPECT_EQ(all.size(), 4u);
}

TEST(Metrics, ReportToAcceptsNoneJsonlTensorboardAllAndRejectsIntegrations) {
  auto both = [](const std::vector<std::string>& w) {
    const auto r = parse_report_to(w);
    return std::make_pair(r.jsonl, r.tensorboard);
  };
  EXPECT_EQ(both({"none"}), std::make_pair(false, false));
  EXPECT_EQ(both({"jsonl"}), std::make_pair(true, false));
  EXPECT_EQ(both({"tensorboard"}), std::make_pair(false, true));
  EXPECT_EQ(both({"jsonl", "tensorboard"}), std::make_pair(true, true));
  EXPECT_EQ(both({"all"}), std::make_pair(true, true));  // HF: every integration this build has
  try {
    parse_report_to({"wandb"});
    FAIL();
  } catch (const alpaca::Error& e) {
    EXPECT_NE(e.message().find("--report_to wandb is not supported"), std::string::npos) << e.message();
  }
  EXPECT_THROW(parse_report_to({"tensorboard", "mlflow"}), alpaca::Error);
}

TEST(Metrics, JsonlAndConsoleLines) {
  TempDir tmp("jsonl");
  {
    MetricsJsonl w(tmp.path(), /*append=*/false);
    w.write({{"loss", 2.5}, {"learning_rate", 2e-5}, {"step", int64_t{3}}});
    w.write({{"loss", std::nan("")}, {"step", int64_t{4}}});
  }
  std::ifstream f(tmp.path() / "metrics.jsonl");
  std::string l1, l2;
  std::getline(f, l1);
  std::getline(f, l2);
  EXPECT_EQ(nlohmann::json::parse(l1)["step"], 3);
  EXPECT_TRUE(nlohmann::json::parse(l2)["loss"].is_null());
  EXPECT_EQ(format_log_line({{"loss", 2.5}, {"grad_norm", 1.0}, {"learning_rate", 2e-05}, {"epoch", 0.1}}),
            "{'loss': 2.5, 'grad_norm': 1.0, 'learning_rate': 2e-05, 'epoch': 0.1}");
  // Python's repr: positional for exponents in [-4, 16), shortest round-trip digits either way.
  const std::vector<std::pair<double, std::string>> reprs = {
      {12270.0, "12270.0"},     {0.0001, "0.0001"},       {0.00012, "0.00012"},   {1e-05, "1e-05"},
      {1e16, "1e+16"},          {1.5e16, "1.5e+16"},      {9999999999999998.0, "9999999999999998.0"},
      {63017283456.0, "63017283456.0"}, {0.1, "0.1"},     {-2.5, "-2.5"},         {0.0, "0.0"},
      {123456789.125, "123456789.125"}, {1.2345678901234567e-7, "1.2345678901234566e-07"},
      {2.5e-310, "2.5e-310"},   {1.7976931348623157e308, "1.7976931348623157e+308"}};
  for (const auto& [x, want] : reprs) EXPECT_EQ(format_log_line({{"v", x}}), "{'v': " + want + "}") << want;
}

TEST(Throughput, FlopsAndMfu) {
  // LLaMA-7B-ish: N = 6.74e9, L = 32, D = 4096, T = 2048.
  const double fpt = flops_per_token(6'738'415'616, 32, 4096, 2048);
  EXPECT_NEAR(fpt, 6 * 6.738415616e9 + 12.0 * 32 * 4096 * 2048, 1);
  EXPECT_NEAR(mfu(3000, fpt, 989e12), 3000 * fpt / 989e12, 1e-12);
  EXPECT_EQ(gpu_peak_bf16_flops("NVIDIA H100 80GB HBM3"), 989e12);
  EXPECT_EQ(gpu_peak_bf16_flops("NVIDIA H100 PCIe"), 756e12);
  EXPECT_EQ(gpu_peak_bf16_flops("NVIDIA A100-SXM4-80GB"), 312e12);
  EXPECT_FALSE(gpu_peak_bf16_flops("Some Future GPU"));
  const MemoryStats m = memory_stats(at::Device(at::kCPU));
  EXPECT_GT(m.host_rss_bytes, 0);
  EXPECT_GE(m.host_peak_rss_bytes, m.host_rss_bytes);
  EXPECT_EQ(m.gpu_reserved_bytes, 0);
}

TEST(Progress, BarOnTerminalPlainLinesOtherwise) {
  EXPECT_EQ(format_duration(65), "01:05");
  EXPECT_EQ(format_duration(3725), "1:02:05");
  const std::string bar = ProgressReporter::render_bar(4, 10, 2.0, 2.0, 10);
  EXPECT_NE(bar.find(" 40%|"), std::string::npos) << bar;
  EXPECT_NE(bar.find("4/10 [00:02<00:03,  2.00it/s]"), std::string::npos) << bar;
  EXPECT_NE(ProgressReporter::render_bar(1, 10, 4.0, 0.25).find("4.00s/it"), std::string::npos);

  std::ostringstream plain;
  ProgressReporter p(plain, 10, true, /*tty=*/false);
  p.step(1, 0.5);
  p.log("{'loss': 1.0}");
  p.finish();
  EXPECT_EQ(plain.str(), "{'loss': 1.0}\n");

  std::ostringstream tty;
  ProgressReporter t(tty, 10, true, /*tty=*/true);
  t.step(5, 1.0);
  t.log("{'loss': 1.0}");
  EXPECT_NE(tty.str().find("\r"), std::string::npos);
  EXPECT_NE(tty.str().find("5/10"), std::string::npos);
  std::ostringstream off;
  ProgressReporter o(off, 10, false, true);
  o.step(1, 1.0);
  o.log("x");
  EXPECT_EQ(off.str(), "");
}

}  // namespace test_metrics
