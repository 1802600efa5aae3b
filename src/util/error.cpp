#include "alpaca/util/error.h"

#include <atomic>
#include <cstring>

namespace alpaca {
namespace {
std::atomic<int> g_rank{-1};

std::string prefix(const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  std::ostringstream os;
  os << (base ? base + 1 : file) << ":" << line;
  if (g_rank.load() >= 0) os << " [rank " << g_rank.load() << "]";
  return os.str();
}
}  // namespace

Error::Error(const char* file, int line, const std::string& msg)
    : std::runtime_error(prefix(file, line) + ": " + msg), message_(msg) {}

void set_process_rank(int rank) { g_rank.store(rank); }
int process_rank() { return g_rank.load(); }

namespace detail {
void throw_error(const char* file, int line, const std::string& msg) { throw Error(file, line, msg); }
}  // namespace detail

}  // namespace alpaca
