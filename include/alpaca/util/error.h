// Error policy: every failure the user can cause or the system can report becomes an
// alpaca::Error carrying file:line, the rank, and a message that says what to do next.
// Library code throws; only src/main.cpp catches and chooses the exit code.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace alpaca {

class Error : public std::runtime_error {
 public:
  Error(const char* file, int line, const std::string& msg);
  // The message without the "file:line [rank r]" prefix, for tests and user output.
  const std::string& message() const { return message_; }

 private:
  std::string message_;
};

// The rank shown in error and log prefixes; dist/ sets it once the launch is known (-1 = unknown).
void set_process_rank(int rank);
int process_rank();

namespace detail {
[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace alpaca

// ALPACA_CHECK(cond, msg): msg is a stream expression, e.g. "tensor " << name << " is missing".
#define ALPACA_CHECK(cond, msg)                                        \
  do {                                                                 \
    if (!(cond)) {                                                     \
      std::ostringstream alpaca_check_os_;                             \
      alpaca_check_os_ << msg;                                         \
      ::alpaca::detail::throw_error(__FILE__, __LINE__, alpaca_check_os_.str()); \
    }                                                                  \
  } while (0)

#define ALPACA_FAIL(msg) ALPACA_CHECK(false, msg)
