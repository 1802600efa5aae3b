#include "alpaca/util/sys.h"

#include <malloc.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

namespace alpaca::sys {

int64_t free_disk_bytes(const std::string& path) {
  std::filesystem::path p(path);
  std::error_code ec;
  while (!p.empty() && !std::filesystem::exists(p, ec)) p = p.parent_path();
  struct statvfs st {};
  if (::statvfs(p.empty() ? "." : p.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
}

std::string write_failure_message(const std::string& path, int err, int64_t remaining) {
  std::ostringstream os;
  os << path << ": writing failed (" << std::strerror(err) << ") with " << remaining << " bytes still to write";
  const int64_t free_bytes = free_disk_bytes(path);
  if (free_bytes >= 0) os << "; " << free_bytes << " bytes are free on its filesystem";
  if (err == ENOSPC || err == EDQUOT || err == EFBIG)
    os << "; the disk is full: free space (or point --output_dir at a bigger disk) and rerun with "
          "--resume_from_checkpoint True";
  else
    os << "; check the disk and the permissions of the output directory";
  return os.str();
}

int64_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  int64_t pages_total = 0, pages_resident = 0;
  if (!(f >> pages_total >> pages_resident)) return 0;
  return pages_resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

int64_t minor_page_faults() {
  rusage u{};
  return ::getrusage(RUSAGE_SELF, &u) == 0 ? static_cast<int64_t>(u.ru_minflt) : 0;
}

namespace {
std::atomic<int64_t> g_closed_windows_peak{0};  // the largest VmHWM before a reset
std::mutex g_watches_mutex;                      // guards g_watches and their folded peaks
std::vector<RssPeakWatch*> g_watches;
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
  {
    std::lock_guard<std::mutex> lock(g_watches_mutex);
    for (RssPeakWatch* w : g_watches) w->fold(closed);
  }
  std::ofstream f("/proc/self/clear_refs");  // Linux: "5" resets VmHWM to the current RSS
  if (f) f << "5";
}

RssPeakWatch::RssPeakWatch() {
  reset_peak_rss_window();
  folded_ = rss_bytes();
  std::lock_guard<std::mutex> lock(g_watches_mutex);
  g_watches.push_back(this);
}

RssPeakWatch::~RssPeakWatch() {
  std::lock_guard<std::mutex> lock(g_watches_mutex);
  g_watches.erase(std::remove(g_watches.begin(), g_watches.end(), this), g_watches.end());
}

void RssPeakWatch::fold(int64_t closed_window_peak) { folded_ = std::max(folded_, closed_window_peak); }

int64_t RssPeakWatch::peak() const {
  std::lock_guard<std::mutex> lock(g_watches_mutex);
  return std::max(folded_, window_peak_rss_bytes());
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
