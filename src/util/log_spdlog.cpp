#include "alpaca/util/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>  // defines: stderr_color_sink_mt
#include <spdlog/spdlog.h>                    // defines: spdlog::logger

#include "alpaca/util/error.h"

namespace alpaca::log {
namespace {
std::shared_ptr<spdlog::logger>& logger() {
  static std::shared_ptr<spdlog::logger> l = [] {
    auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    auto lg = std::make_shared<spdlog::logger>("alpaca", sink);
    lg->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %v");
    lg->set_level(spdlog::level::info);
    return lg;
  }();
  return l;
}

spdlog::level::level_enum to_spd(Level level) {
  switch (level) {
    case Level::kDebug: return spdlog::level::debug;
    case Level::kInfo: return spdlog::level::info;
    case Level::kWarning: return spdlog::level::warn;
    case Level::kError: return spdlog::level::err;
    case Level::kCritical: return spdlog::level::critical;
    case Level::kPassive: return spdlog::level::info;
  }
  return spdlog::level::info;
}
}  // namespace

Level parse_level(const std::string& word) {
  if (word == "debug" || word == "detail") return Level::kDebug;
  if (word == "info") return Level::kInfo;
  if (word == "warning") return Level::kWarning;
  if (word == "error") return Level::kError;
  if (word == "critical") return Level::kCritical;
  if (word == "passive") return Level::kPassive;
  ALPACA_FAIL("--log_level '" << word << "' is not a level; use one of debug, info, warning, error, critical, passive");
}

void setup(int rank, Level level, bool all_ranks_info) {
  auto& lg = logger();
  std::string pat = "[%Y-%m-%d %H:%M:%S.%e] [%^%l%$]";
  if (rank >= 0) pat += " [rank " + std::to_string(rank) + "]";
  lg->set_pattern(pat + " %v");
  spdlog::level::level_enum lvl = to_spd(level);
  if (rank > 0 && !all_ranks_info && lvl < spdlog::level::warn) lvl = spdlog::level::warn;
  lg->set_level(lvl);
}

bool enabled(Level level) { return logger()->should_log(to_spd(level)); }

void write(Level level, const std::string& msg) { logger()->log(to_spd(level), msg); }

}  // namespace alpaca::log
