// Process facts the trainer and benchmarks report: resident memory and wall-clock time.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace alpaca::sys {

// Current resident set size of this process in bytes (from /proc/self/statm); 0 if unknown.
int64_t rss_bytes();
// Minor page faults this process (all its threads) has taken (getrusage ru_minflt): each is a
// page the kernel had to map, and zero-fill when fresh. Unlike times, the count does not depend on
// the machine's load, so it is the figure to compare steps by on a shared host.
int64_t minor_page_faults();
// Peak resident set size of this process over its whole life in bytes (VmHWM, and the peaks of
// windows closed by reset_peak_rss_window); 0 if unknown.
int64_t peak_rss_bytes();
// Peak resident set size since the last reset_peak_rss_window() (or process start).
int64_t window_peak_rss_bytes();
// Starts a new window: the kernel's VmHWM is reset to the current RSS (/proc/self/clear_refs),
// after its value has been folded into the lifetime peak.
void reset_peak_rss_window();
// The peak resident set size from its construction on, whatever resets the window meanwhile (the
// training log resets it at every logging step): each reset folds the closed window's peak in.
// A save that runs beside training steps (--save_async) measures its window with one.
class RssPeakWatch {
 public:
  RssPeakWatch();  // resets the window; starts at the current RSS
  ~RssPeakWatch();
  RssPeakWatch(const RssPeakWatch&) = delete;
  RssPeakWatch& operator=(const RssPeakWatch&) = delete;
  int64_t peak() const;
  void fold(int64_t closed_window_peak);  // called by reset_peak_rss_window

 private:
  int64_t folded_ = 0;
};

// Bytes an unprivileged writer may still use on the filesystem holding `path` (statvfs f_bavail;
// a missing path is looked up through its nearest existing parent); -1 if unknown.
int64_t free_disk_bytes(const std::string& path);
// "<path>: writing failed (<strerror(err)>) with <remaining> bytes still to write; <free> bytes are
// free on its filesystem; ..." for a write that failed with errno `err` (disk-full errors say so).
std::string write_failure_message(const std::string& path, int err, int64_t remaining);

// Host allocator policy for training processes. A training step allocates and frees the same large
// CPU buffers (logits, activations, gathered layers, gradient buckets) every micro-batch. glibc
// serves blocks above its mmap threshold (at most 32 MiB) with fresh mmap()s, so each step
// page-faults and zero-fills hundreds of MiB again: on a CPU run that was a third of the step.
// `keep_host_heap()` makes malloc keep freed memory for reuse (no mmap for large blocks, no automatic
// trim); `release_free_host_memory()` hands unused heap pages back at phase ends (after the model is
// loaded, after a checkpoint is written) so one-off peaks do not stay resident. Set
// ALPACA_HOST_MALLOC=default to keep glibc's behaviour. Returns whether the policy was applied.
bool keep_host_heap();
void release_free_host_memory();

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
