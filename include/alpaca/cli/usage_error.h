// A usage error: the command line or a config file is wrong (unknown flag, bad value,
// contradiction). main() prints only the message (no source location) and exits with 2, the
// usual code for bad usage; other alpaca::Error failures exit with 1.
#pragma once

#include <string>

#include "alpaca/util/error.h"

namespace alpaca::cli {

class UsageError : public Error {
 public:
  using Error::Error;
};

namespace detail {
[[noreturn]] void throw_usage_error(const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace alpaca::cli

// ALPACA_USAGE_CHECK(cond, msg): like ALPACA_CHECK but throws cli::UsageError.
#define ALPACA_USAGE_CHECK(cond, msg)                                                   \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::ostringstream alpaca_usage_os_;                                              \
      alpaca_usage_os_ << msg;                                                          \
      ::alpaca::cli::detail::throw_usage_error(__FILE__, __LINE__, alpaca_usage_os_.str()); \
    }                                                                                   \
  } while (0)

#define ALPACA_USAGE_FAIL(msg) ALPACA_USAGE_CHECK(false, msg)
