#include "alpaca/util/sys.h"

#include <unistd.h>

#include <fstream>
#include <string>

namespace alpaca::sys {

int64_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  int64_t pages_total = 0, pages_resident = 0;
  if (!(f >> pages_total >> pages_resident)) return 0;
  return pages_resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

int64_t peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;  // kB
  }
  return 0;
}

}  // namespace alpaca::sys
