// TensorBoard event files (issue 20) against TensorBoard's own code: the TFRecord framing is byte
// for byte what tensorboard's RecordWriter writes and its CRC-checking reader reads it; what
// TensorBoardWriter writes reads back through EventAccumulator (and the UI's
// plugin_event_accumulator) with the right tags, steps, values and plugin metadata; a flipped
// byte is caught; a file cut mid-record (a killed writer) still opens with every whole record.
// scripts/plot_metrics.py draws a PNG and refuses a directory without metrics.jsonl.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "alpaca/train/tensorboard.h"
#include "alpaca/util/error.h"
#include "test_util.h"

namespace test_tensorboard {

namespace fs = std::filesystem;
using namespace alpaca::testing;
using alpaca::train::TensorBoardWriter;

namespace {

std::string check_script() { return (source_dir() / "tests/reference/tensorboard_check.py").string(); }

int run_check(const std::string& args, std::string* out) { return run_command(python() + " " + check_script() + " " + args, out); }

nlohmann::json dump(const fs::path& dir) {
  std::string out;
  EXPECT_EQ(run_check("dump " + dir.string(), &out), 0) << out;
  const size_t at = out.find("{\"files\"");
  if (at == std::string::npos) {
    ADD_FAILURE() << "no dump in the output:\n" << out;
    return nlohmann::json::object();
  }
  return nlohmann::json::parse(out.substr(at));
}

std::string payload(int i, size_t n) {
  std::string s(n, '\0');
  for (size_t j = 0; j < n; ++j) s[j] = static_cast<char>((7 * j + static_cast<size_t>(i)) % 256);
  return s;
}

}  // namespace

TEST(TensorBoard, MaskedCrc32cOfTheStandardCheckString) {
  // CRC-32C("123456789") = 0xE3069283 (the catalogue check value), masked as TFRecord does.
  const uint32_t c = 0xE3069283u;
  EXPECT_EQ(alpaca::train::masked_crc32c("123456789"), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(TensorBoard, FramingIsByteForByteTensorBoardsRecordWriter) {
  TempDir tmp("tb_framing");
  const std::vector<size_t> sizes = {0, 1, 9, 1000, 70000};
  const fs::path file = tmp.path() / "records";
  std::string all, args;
  for (size_t i = 0; i < sizes.size(); ++i) {
    all += alpaca::train::tfrecord(payload(static_cast<int>(i), sizes[i]));
    args += " " + std::to_string(sizes[i]);
  }
  std::ofstream(file, std::ios::binary) << all;
  std::string out;
  EXPECT_EQ(run_check("framing " + file.string() + args, &out), 0) << out;

  // The check can fail: one flipped payload byte is a CRC error for tensorboard's reader.
  all[all.size() - 100] ^= 0x01;
  std::ofstream(file, std::ios::binary | std::ios::trunc) << all;
  EXPECT_NE(run_check("framing " + file.string() + args, &out), 0) << out;
}

TEST(TensorBoard, HfTagNames) {
  using alpaca::train::tensorboard_tag;
  EXPECT_EQ(tensorboard_tag("loss"), "train/loss");
  EXPECT_EQ(tensorboard_tag("learning_rate"), "train/learning_rate");
  EXPECT_EQ(tensorboard_tag("eval_loss"), "eval/loss");
  EXPECT_EQ(tensorboard_tag("eval_samples_per_second"), "eval/samples_per_second");
  EXPECT_EQ(tensorboard_tag("test_loss"), "test/loss");
  EXPECT_EQ(tensorboard_tag("train_runtime"), "train/train_runtime");
  EXPECT_EQ(tensorboard_tag("tokens_per_second"), "train/tokens_per_second");
}

TEST(TensorBoard, DefaultDirIsHfsRunsDateHost) {
  const std::string d = alpaca::train::default_tensorboard_subdir().string();
  // runs/Dec01_08-15-14_<host>
  ASSERT_EQ(d.rfind("runs/", 0), 0u) << d;
  const std::string name = d.substr(5);
  ASSERT_GT(name.size(), 16u) << d;
  EXPECT_EQ(name[5], '_') << d;
  EXPECT_EQ(name[8], '-') << d;
  EXPECT_EQ(name[11], '-') << d;
  EXPECT_EQ(name[14], '_') << d;
}

TEST(TensorBoard, WriterEventsReadBackThroughEventAccumulator) {
  TempDir tmp("tb_writer");
  const fs::path dir = tmp.path() / "runs" / "x";
  {
    TensorBoardWriter w(dir);
    ASSERT_TRUE(w.enabled());
    EXPECT_EQ(w.path().parent_path(), dir);
    EXPECT_EQ(w.path().filename().string().rfind("events.out.tfevents.", 0), 0u) << w.path();
    w.add_text("args", "{\"learning_rate\": 0.001}", 0);
    w.add_scalars(1, {{"train/loss", 2.5}, {"train/learning_rate", 1e-3}});
    w.add_scalars(2, {{"train/loss", 2.25}, {"train/learning_rate", 9e-4}, {"train/host_rss_bytes", 123456789.0}});
    w.add_scalars(2, {{"eval/loss", std::nan("")}});
  }
  const auto j = dump(dir);
  EXPECT_EQ(j["first_event"]["file_version"], "brain.Event:2");
  EXPECT_EQ(j["first_event"]["step"], 0);
  const auto& s = j["scalars"];
  ASSERT_EQ(s["train/loss"].size(), 2u) << j.dump();
  EXPECT_EQ(s["train/loss"][0][0], 1);
  EXPECT_EQ(s["train/loss"][0][1].get<double>(), 2.5);
  EXPECT_EQ(s["train/loss"][1][1].get<double>(), 2.25);
  EXPECT_EQ(s["train/learning_rate"][1][1].get<double>(), static_cast<double>(static_cast<float>(9e-4)));
  EXPECT_EQ(s["train/host_rss_bytes"][0][1].get<double>(), static_cast<double>(static_cast<float>(123456789.0)));
  ASSERT_EQ(s["eval/loss"].size(), 1u);
  EXPECT_EQ(s["eval/loss"][0][1], "nan");  // the check script spells NaN "nan" (JSON has none)
  EXPECT_EQ(j["texts"]["args/text_summary"][0][1], "{\"learning_rate\": 0.001}");
  EXPECT_EQ(j["ui_scalar_tags"], nlohmann::json({"eval/loss", "train/host_rss_bytes", "train/learning_rate", "train/loss"}));
  EXPECT_EQ(j["ui_text_tags"], nlohmann::json({"args/text_summary"}));
}

TEST(TensorBoard, FileCutMidRecordStillOpensWithEveryWholeRecord) {
  TempDir tmp("tb_torn");
  fs::path file;
  {
    TensorBoardWriter w(tmp.path());
    file = w.path();
    for (int step = 1; step <= 5; ++step) w.add_scalars(step, {{"train/loss", 1.0 / step}});
  }
  const auto full = fs::file_size(file);
  fs::resize_file(file, full - 7);  // the last record loses its tail, as a writer killed mid-write would leave it
  const auto j = dump(tmp.path());
  ASSERT_EQ(j["scalars"]["train/loss"].size(), 4u) << j.dump();
  EXPECT_EQ(j["scalars"]["train/loss"][3][0], 4);
}

TEST(TensorBoard, UnwritableDirectoryIsAClearError) {
  TempDir tmp("tb_bad");
  const fs::path blocker = tmp.path() / "a_file";
  std::ofstream(blocker) << "x";
  try {
    TensorBoardWriter w(blocker / "runs", "--logging_dir");
    FAIL() << "expected an error";
  } catch (const alpaca::Error& e) {
    EXPECT_NE(e.message().find("--logging_dir"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find((blocker / "runs").string()), std::string::npos) << e.message();
  }
}

TEST(PlotMetrics, DrawsAPngAndNamesTheFixWhenThereIsNoMetricsFile) {
  TempDir tmp("plot_metrics");
  {
    std::ofstream f(tmp.path() / "metrics.jsonl");
    for (int s = 1; s <= 5; ++s)
      f << "{\"loss\":" << 3.0 / s << ",\"grad_norm\":1.0,\"learning_rate\":0.001,\"epoch\":" << s / 5.0
        << ",\"tokens_per_second\":1000.0,\"host_rss_bytes\":500000000,\"step\":" << s << "}\n";
    f << "{\"eval_loss\":1.0,\"epoch\":1.0,\"step\":5}\n{\"loss\":";  // a torn last line (killed run) is skipped
  }
  const std::string script = python() + " " + (source_dir() / "scripts/plot_metrics.py").string() + " ";
  std::string out;
  ASSERT_EQ(run_command(script + tmp.path().string() + " --out " + (tmp.path() / "m.png").string(), &out), 0) << out;
  EXPECT_NE(out.find((tmp.path() / "m.png").string()), std::string::npos) << out;
  EXPECT_GT(fs::file_size(tmp.path() / "m.png"), 10000u);
  const fs::path empty = tmp.path() / "empty";
  fs::create_directories(empty);
  EXPECT_NE(run_command(script + empty.string(), &out), 0);
  EXPECT_NE(out.find("--report_to jsonl"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(empty / "metrics.png"));
}

}  // namespace test_tensorboard
