// Rank-aware logging over spdlog (spdlog stays in the .cpp). Only rank 0 logs at info by
// default; every rank logs warnings and errors. Messages are stream expressions:
//   ALPACA_INFO("loaded " << n << " tensors from " << path);
#pragma once

#include <sstream>
#include <string>

namespace alpaca::log {

enum class Level { kDebug, kInfo, kWarning, kError, kCritical, kPassive };

// Parses HF's --log_level words: debug, info, warning, error, critical, passive.
// Throws alpaca::Error naming the accepted words otherwise.
Level parse_level(const std::string& word);

// Configures the process logger. `all_ranks_info` makes every rank log at `level`;
// otherwise ranks other than 0 log warnings and above only.
void setup(int rank, Level level, bool all_ranks_info = false);
bool enabled(Level level);
void write(Level level, const std::string& msg);

}  // namespace alpaca::log

#define ALPACA_LOG_(lvl, msg)                              \
  do {                                                     \
    if (::alpaca::log::enabled(lvl)) {                     \
      std::ostringstream alpaca_log_os_;                   \
      alpaca_log_os_ << msg;                               \
      ::alpaca::log::write(lvl, alpaca_log_os_.str());     \
    }                                                      \
  } while (0)

#define ALPACA_DEBUG(msg) ALPACA_LOG_(::alpaca::log::Level::kDebug, msg)
#define ALPACA_INFO(msg) ALPACA_LOG_(::alpaca::log::Level::kInfo, msg)
#define ALPACA_WARN(msg) ALPACA_LOG_(::alpaca::log::Level::kWarning, msg)
#define ALPACA_ERROR(msg) ALPACA_LOG_(::alpaca::log::Level::kError, msg)
