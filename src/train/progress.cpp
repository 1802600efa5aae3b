#include "alpaca/train/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ostream>

namespace alpaca::train {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", (long long)(s / 3600), (long long)(s / 60 % 60), (long long)(s % 60));
  else std::snprintf(buf, sizeof(buf), "%02lld:%02lld", (long long)(s / 60), (long long)(s % 60));
  return buf;
}

bool is_stdout_tty() { return ::isatty(STDOUT_FILENO) == 1; }

ProgressReporter::ProgressReporter(std::ostream& out, int64_t total_steps, bool enabled, bool tty)
    : out_(out), total_(total_steps), enabled_(enabled), tty_(tty) {}

std::string ProgressReporter::render_bar(int64_t done, int64_t total, double elapsed_s, double rate, int width) {
  total = std::max<int64_t>(total, 1);
  const double frac = std::clamp(static_cast<double>(done) / static_cast<double>(total), 0.0, 1.0);
  const int filled = static_cast<int>(frac * width);
  std::string bar;
  for (int i = 0; i < width; ++i) bar += i < filled ? "\u2588" : " ";
  const double eta = rate > 0 ? static_cast<double>(total - done) / rate : NAN;
  char buf[160];
  if (rate >= 1 || rate <= 0)
    std::snprintf(buf, sizeof(buf), "%3d%%|%s| %lld/%lld [%s<%s, %5.2fit/s]", static_cast<int>(frac * 100), bar.c_str(),
                  (long long)done, (long long)total, format_duration(elapsed_s).c_str(), format_duration(eta).c_str(), rate);
  else
    std::snprintf(buf, sizeof(buf), "%3d%%|%s| %lld/%lld [%s<%s, %5.2fs/it]", static_cast<int>(frac * 100), bar.c_str(),
                  (long long)done, (long long)total, format_duration(elapsed_s).c_str(), format_duration(eta).c_str(), 1.0 / rate);
  return buf;
}

void ProgressReporter::step(int64_t global_step, double elapsed_s, int64_t initial_step) {
  if (!enabled_ || !tty_) return;
  const double done_here = static_cast<double>(global_step - initial_step);
  const double rate = elapsed_s > 0 ? done_here / elapsed_s : 0;
  last_bar_ = render_bar(global_step, total_, elapsed_s, rate);
  out_ << '\r' << last_bar_ << std::flush;
  bar_visible_ = true;
}

void ProgressReporter::log(const std::string& line) {
  if (!enabled_) return;
  if (tty_ && bar_visible_) {
    out_ << "\r\033[K" << line << '\n' << last_bar_ << std::flush;  // print above the bar, redraw it
  } else {
    out_ << line << '\n' << std::flush;
  }
}

void ProgressReporter::finish() {
  if (enabled_ && tty_ && bar_visible_) out_ << '\n' << std::flush;
  bar_visible_ = false;
}

}  // namespace alpaca::train
