// Training metrics with Hugging Face Trainer's semantics: the logged "loss" is the mean of the
// optimizer-step losses since the last log; the final summary is HF's speed_metrics
// (train_runtime, train_samples_per_second, train_steps_per_second, rounded as HF) plus
// train_loss and epoch; train_results.json / all_results.json as Trainer.save_metrics writes
// them. metrics.jsonl (one JSON object per log call) and TensorBoard event files
// (alpaca/train/tensorboard.h) are the --report_to targets.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "alpaca/ckpt/trainer_state.h"

namespace alpaca::train {

using ckpt::LogEntry;
using ckpt::LogValue;

// HF: tr_loss accumulates every step's loss; a log reports tr_loss / steps since the last log;
// train_loss = sum of everything logged (+ the unlogged rest) / steps trained in this session.
class LossAccumulator {
 public:
  void add_step(double step_loss) { since_log_ += step_loss; }
  // Average since the last log; resets the window. `global_step` must be > last logged step.
  double take_log_average(int64_t global_step);
  // HF's train_loss at the end of train(); `initial_step` is where this session started.
  double train_loss(int64_t global_step, int64_t initial_step) const;
  int64_t last_logged_step() const { return last_logged_step_; }
  // A resumed session: logging windows continue from the checkpoint's step, and train_loss sums
  // this session's losses only (HF's train() starts _total_loss_scalar at 0 and divides by
  // global_step - _initial_global_step).
  void restore(int64_t last_logged_step) {
    last_logged_step_ = last_logged_step;
    since_log_ = 0;
    total_logged_ = 0;
  }
  double total_logged() const { return total_logged_; }

 private:
  double since_log_ = 0;
  double total_logged_ = 0;
  int64_t last_logged_step_ = 0;
};

// HF's speed_metrics(split, ...): {split}_runtime (4 decimals), {split}_samples_per_second,
// {split}_steps_per_second (3 decimals); absent rates when runtime is 0 or the count is unknown.
LogEntry speed_metrics(const std::string& split, double runtime_s, std::optional<double> num_samples,
                       std::optional<int64_t> num_steps);

// Python's round(x, ndigits) for the values HF rounds (half-to-even on the decimal value).
double round_to(double x, int ndigits);

// Trainer.save_metrics: writes <output_dir>/<split>_results.json (indent 4, sorted keys) and,
// when `combined`, merges the entry into all_results.json.
void save_metrics(const std::filesystem::path& output_dir, const std::string& split, const LogEntry& metrics,
                  bool combined = true);

// Where metrics go besides the console, from --report_to's words (HF semantics): "none" nothing,
// "jsonl" metrics.jsonl, "tensorboard" TensorBoard event files, "all" every integration this
// build has (jsonl + tensorboard). wandb, mlflow, ... are rejected with an error naming the flag.
struct ReportTo {
  bool jsonl = false;
  bool tensorboard = false;
};
ReportTo parse_report_to(const std::vector<std::string>& words);

// Appends one JSON line per call to <output_dir>/metrics.jsonl (rank 0 only), flushed each time
// so a crashed run keeps what it logged.
class MetricsJsonl {
 public:
  MetricsJsonl() = default;
  explicit MetricsJsonl(const std::filesystem::path& output_dir, bool append);
  bool enabled() const { return out_.is_open(); }
  void write(const LogEntry& entry);
  static std::string to_json_line(const LogEntry& entry);

 private:
  std::ofstream out_;
};

// HF's console rendering of a log dict: {'loss': 2.3, 'grad_norm': 1.1, ...}.
std::string format_log_line(const LogEntry& entry);

}  // namespace alpaca::train
