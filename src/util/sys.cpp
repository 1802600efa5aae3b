#include "alpaca/util/sys.h"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include <fstream>
#include <string>

namespace alpaca::sys {

int64_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  int64_t pages_total = 0, pages_resident = 0;
  if (!(f >> pages_total >> pages_resident)) return 0;
  return pages_resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

namespace {
std::atomic<int64_t> g_closed_windows_peak{0};  // the largest VmHWM before a reset
}  // namespace

int64_t window_peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;  // kB
  }
  return 0;
}

int64_t peak_rss_bytes() { return std::max(window_peak_rss_bytes(), g_closed_windows_peak.load()); }

void reset_peak_rss_window() {
  const int64_t closed = window_peak_rss_bytes();
  int64_t prev = g_closed_windows_peak.load();
  while (closed > prev && !g_closed_windows_peak.compare_exchange_weak(prev, closed)) {
  }
  std::ofstream f("/proc/self/clear_refs");  // Linux: "5" resets VmHWM to the current RSS
  if (f) f << "5";
}

bool keep_host_heap() {
  const char* mode = std::getenv("ALPACA_HOST_MALLOC");
  if (mode != nullptr && std::strcmp(mode, "default") == 0) return false;
#if defined(__GLIBC__)
  // Order matters: a trim threshold set explicitly also pins the mmap threshold (no dynamic growth).
  return mallopt(M_MMAP_MAX, 0) == 1 && mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
#else
  return false;
#endif
}

void release_free_host_memory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

}  // namespace alpaca::sys
