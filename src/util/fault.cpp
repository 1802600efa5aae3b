// ALPACA_FAULTS parsing (include/alpaca/util/fault.h).
#include "alpaca/util/fault.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <thread>

#include "alpaca/util/error.h"

namespace alpaca::util {
namespace {

const std::map<std::string, std::string, std::less<>>& armed_points() {
  static const std::map<std::string, std::string, std::less<>> points = [] {
    std::map<std::string, std::string, std::less<>> out;
    const char* env = std::getenv("ALPACA_FAULTS");
    if (env == nullptr) return out;
    std::string_view rest(env);
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      std::string_view item = rest.substr(0, comma);
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
      if (item.empty()) continue;
      const size_t eq = item.find('=');
      out[std::string(item.substr(0, eq))] = eq == std::string_view::npos ? "" : std::string(item.substr(eq + 1));
    }
    return out;
  }();
  return points;
}

}  // namespace

std::optional<std::string> fault_value(std::string_view point) {
  const auto& points = armed_points();
  if (points.empty()) return std::nullopt;
  const auto it = points.find(point);
  if (it == points.end()) return std::nullopt;
  return it->second;
}

std::optional<int64_t> fault_int(std::string_view point, int64_t fallback) {
  const auto v = fault_value(point);
  if (!v) return std::nullopt;
  if (v->empty()) return fallback;
  char* end = nullptr;
  const long long n = std::strtoll(v->c_str(), &end, 10);
  ALPACA_CHECK(end != nullptr && *end == '\0',
               "ALPACA_FAULTS: point " << point << " needs an integer value, got '" << *v << "'");
  return n;
}

void fault_pause_ms(std::string_view point) {
  const auto ms = fault_int(point);
  if (!ms || *ms <= 0) return;
  // The line a test waits for (instead of guessing how long the run takes to get here).
  std::fprintf(stderr, "ALPACA_FAULTS: %.*s pauses %lld ms\n", static_cast<int>(point.size()), point.data(),
               static_cast<long long>(*ms));
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::milliseconds(*ms));
}

}  // namespace alpaca::util
