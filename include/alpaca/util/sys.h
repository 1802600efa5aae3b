// Process facts the trainer and benchmarks report: resident memory and wall-clock time.
#pragma once

#include <chrono>
#include <cstdint>

namespace alpaca::sys {

// Current resident set size of this process in bytes (from /proc/self/statm); 0 if unknown.
int64_t rss_bytes();
// Peak resident set size of this process in bytes (VmHWM); 0 if unknown.
int64_t peak_rss_bytes();

// Monotonic stopwatch in seconds.
class Timer {
 public:
  Timer() : start_(std::chrono::steady_clock::now()) {}
  void reset() { start_ = std::chrono::steady_clock::now(); }
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace alpaca::sys
