// An error in the user's inputs (data, model directory, checkpoint to resume, output directory)
// that every rank detects alike because every rank reads the same inputs: main() prints it once
// (rank 0, or the only process), with its message only (no source location), and exits with 1.
// Internal failures stay alpaca::Error (file:line and rank, printed by the rank that hit them);
// bad flags are cli::UsageError (exit 2).
#pragma once

#include <string>

#include "alpaca/util/error.h"

namespace alpaca {

class UserError : public Error {
 public:
  using Error::Error;
};

namespace detail {
[[noreturn]] void throw_user_error(const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace alpaca

// ALPACA_USER_CHECK(cond, msg): like ALPACA_CHECK but throws alpaca::UserError.
#define ALPACA_USER_CHECK(cond, msg)                                                   \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      std::ostringstream alpaca_user_os_;                                              \
      alpaca_user_os_ << msg;                                                          \
      ::alpaca::detail::throw_user_error(__FILE__, __LINE__, alpaca_user_os_.str());   \
    }                                                                                  \
  } while (0)
#define ALPACA_USER_FAIL(msg) ALPACA_USER_CHECK(false, msg)
