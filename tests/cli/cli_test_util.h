// Helpers for the CLI tests: split a command line the way a POSIX shell does (quotes, line
// continuations), so README commands are pasted verbatim, capture usage-error messages, and run
// the built binary.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "alpaca/cli/train_args.h"
#include "alpaca/cli/usage_error.h"
#include "test_util.h"

namespace alpaca::cli::test {

// Splits `cmd` into words: '...' and "..." quote, backslash-newline continues the line.
inline std::vector<std::string> shell_split(const std::string& cmd) {
  std::vector<std::string> words;
  std::string w;
  bool in_word = false;
  char quote = 0;
  for (size_t i = 0; i < cmd.size(); ++i) {
    char c = cmd[i];
    if (quote) {
      if (c == quote) quote = 0;
      else w += c;
    } else if (c == '\'' || c == '"') {
      quote = c;
      in_word = true;
    } else if (c == '\\' && i + 1 < cmd.size() && cmd[i + 1] == '\n') {
      ++i;
    } else if (c == ' ' || c == '\n' || c == '\t') {
      if (in_word) words.push_back(w), w.clear(), in_word = false;
    } else {
      w += c;
      in_word = true;
    }
  }
  if (in_word) words.push_back(w);
  return words;
}

// Parses `cmd` and returns the usage-error message, or "" if it parsed.
inline std::string parse_error(const std::string& cmd) {
  try {
    parse_train_args(shell_split(cmd));
  } catch (const UsageError& e) {
    return e.message();
  }
  return "";
}

// The flags every valid test command needs.
inline const std::string kRequired = "--model_name_or_path /models/llama --data_path data.json ";

}  // namespace alpaca::cli::test

// EXPECT that `cmd` fails to parse with a message containing `needle`.
#define EXPECT_USAGE_ERROR(cmd, needle)                                                        \
  do {                                                                                         \
    std::string msg_ = ::alpaca::cli::test::parse_error(cmd);                                  \
    EXPECT_FALSE(msg_.empty()) << "expected a usage error for: " << (cmd);                     \
    EXPECT_NE(msg_.find(needle), std::string::npos) << "message: " << msg_ << "\nwanted: " << (needle); \
  } while (0)

namespace alpaca::cli::test {

// One row of a table of refusals: the flags after kRequired and what the usage error must say.
struct UsageErrorCase {
  std::string flags, needle;
};

// EXPECT_USAGE_ERROR(kRequired + flags, needle) for every row.
inline void expect_usage_errors(const std::vector<UsageErrorCase>& cases) {
  for (const auto& c : cases) EXPECT_USAGE_ERROR(kRequired + c.flags, c.needle);
}

// One run of the built alpaca-train: its exit code and its stdout and stderr together.
struct BinaryRun {
  int rc;
  std::string out;
};

// `alpaca-train <args>`, with `env` (VAR=value ...) before it.
inline BinaryRun run_binary(const std::string& args, const std::string& env = "") {
  BinaryRun r;
  r.rc = ::alpaca::testing::run_command(env + " " + ::alpaca::testing::train_bin() + " " + args, &r.out);
  return r;
}

// One row of a table of the binary's usage errors: its arguments and what the message must say
// ("": the exit code and the missing source location only).
struct BinaryUsageCase {
  std::string args, needle;
};

// Every row exits 2 with `needle` in its output and no file:line (a usage error, not an internal one).
inline void expect_binary_usage_errors(const std::vector<BinaryUsageCase>& cases) {
  for (const auto& c : cases) {
    const BinaryRun r = run_binary(c.args);
    EXPECT_EQ(r.rc, 2) << c.args << ": " << r.out;
    if (!c.needle.empty()) {
      EXPECT_NE(r.out.find(c.needle), std::string::npos) << c.args << ": " << r.out;
    }
    EXPECT_EQ(r.out.find(".cpp:"), std::string::npos) << c.args << ": a usage error shows no source location: " << r.out;
  }
}

}  // namespace alpaca::cli::test
