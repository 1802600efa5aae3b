// Rank 0's view of the run: a progress bar with rate and ETA redrawn in place when stdout is a
// terminal (as tqdm in HF Trainer), and plain one-line-per-log output otherwise (CI logs, files).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

namespace alpaca::train {

// "MM:SS" or "H:MM:SS", as tqdm prints durations.
std::string format_duration(double seconds);

class ProgressReporter {
 public:
  // `enabled` = rank 0 and not --disable_tqdm; `tty` = stdout is a terminal (is_stdout_tty()).
  ProgressReporter(std::ostream& out, int64_t total_steps, bool enabled, bool tty);
  // After each optimizer step: redraws the bar on a terminal (nothing otherwise).
  void step(int64_t global_step, double elapsed_s, int64_t initial_step = 0);
  // A log line (HF's dict rendering); on a terminal it is printed above the bar.
  void log(const std::string& line);
  void finish();
  // The bar text for a state, e.g. " 40%|████      | 4/10 [00:02<00:03,  1.95it/s]".
  static std::string render_bar(int64_t done, int64_t total, double elapsed_s, double rate_steps_per_s, int width = 20);

 private:
  std::ostream& out_;
  int64_t total_;
  bool enabled_;
  bool tty_;
  bool bar_visible_ = false;
  std::string last_bar_;
};

bool is_stdout_tty();

}  // namespace alpaca::train
