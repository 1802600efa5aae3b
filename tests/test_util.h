// Helpers shared by the test executables: where the repo, the shared test data and the
// reference Python live, and scratch directories that clean up after themselves.
#pragma once

#include <filesystem>
#include <functional>
#include <string>

namespace alpaca::testing {

std::filesystem::path source_dir();   // the repository root
std::filesystem::path binary_dir();   // the CMake build directory
std::filesystem::path shared_dir();   // ../shared (may not exist outside this repo's CI)
std::string python();                 // the Python with torch/transformers (the repo's .venv)
std::string train_bin();              // path of the built alpaca-train

// Why the reference fixture in `dir` was skipped (the text of its SKIPPED file), or "" when it
// was not.
std::string fixture_skip_reason(const std::filesystem::path& dir);

// Runs a shell command, returns its exit status and (optionally) its combined output.
int run_command(const std::string& cmd, std::string* output = nullptr);

// A config.json the CLI accepts (a tiny LLaMA, 32000 words) for a model directory whose run is
// meant to fail later (no weights) or never reach the model.
inline constexpr const char* kTinyLlamaConfigJson =
    R"({"model_type": "llama", "vocab_size": 32000, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 1, "num_attention_heads": 4})";

// The whole text of a file ("" when it cannot be read).
std::string read_text(const std::filesystem::path& path);

// The message (without the file:line prefix) of the alpaca::Error that `fn` throws, "" when it
// throws none; for tests that check an error names the right thing.
std::string error_of(const std::function<void()>& fn);

// How long a test waits for a background run to reach a point or to end: the one timeout of
// the harness (a tiny-model run reaches any point in seconds; a loaded 2-core machine, minutes).
inline constexpr double kRunTimeoutSeconds = 120;

// Polls `done` every 20 ms for up to `seconds`; true once it holds. The one poll loop of the tests.
bool wait_until(const std::function<bool()>& done, double seconds = kRunTimeoutSeconds);

// A command started in the background (`sh -c "exec <cmd>"`, stdout and stderr to `log`): the one
// harness of the kill, signal and preemption tests. Waiting is by polling a condition on what
// the run writes, never by fixed sleeps; a run still going when this is destroyed is killed.
class BackgroundRun {
 public:
  BackgroundRun(const std::string& cmd, const std::filesystem::path& log);
  // `child` run in a forked copy of this process instead (stdout and stderr to `log`); the child
  // exits 0 when it returns, 1 when it throws.
  BackgroundRun(const std::function<void()>& child, const std::filesystem::path& log);
  ~BackgroundRun();
  BackgroundRun(const BackgroundRun&) = delete;
  BackgroundRun& operator=(const BackgroundRun&) = delete;

  // Polls `done` every 20 ms for up to `seconds`; true once it holds.
  bool wait_until(const std::function<bool()>& done, double seconds = kRunTimeoutSeconds) const;
  // True once `text` is in the log (within `seconds`).
  bool wait_for_log(const std::string& text, double seconds = kRunTimeoutSeconds) const;
  // True once `path` exists (within `seconds`).
  bool wait_for_file(const std::filesystem::path& path, double seconds = kRunTimeoutSeconds) const;
  void signal(int sig) const;  // to the command's process (sh exec'ed into it)
  // The raw waitpid status once it has ended; a run still going after `seconds` is killed
  // (SIGKILL) and reaped, so a hang shows as a signalled status, not as a test timeout.
  int wait(double seconds = kRunTimeoutSeconds);
  std::string log() const { return read_text(log_); }
  int pid() const { return pid_; }

 private:
  int pid_ = -1;
  int status_ = 0;
  std::filesystem::path log_;
};

// A fresh directory under the build tree, removed on destruction unless ALPACA_KEEP_TMP is set.
class TempDir {
 public:
  explicit TempDir(const std::string& tag);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace alpaca::testing

// A reference fixture skips itself when the shared data is absent; the test then skips with the
// reason. When the shared data is present a skipped fixture is a failure, not a silent skip.
#define ALPACA_SKIP_IF_FIXTURE_SKIPPED(dir)                                                        \
  do {                                                                                             \
    const std::string alpaca_why_ = ::alpaca::testing::fixture_skip_reason(dir);                   \
    if (!alpaca_why_.empty()) {                                                                    \
      if (std::filesystem::exists(::alpaca::testing::shared_dir() / "data"))                       \
        FAIL() << "fixture " << (dir) << " was skipped although " << ::alpaca::testing::shared_dir() \
               << "/data is present: " << alpaca_why_;                                             \
      GTEST_SKIP() << "fixture " << (dir) << " skipped: " << alpaca_why_;                          \
    }                                                                                              \
  } while (0)

// Skips the current test with a message when the shared data folder is absent.
#define ALPACA_REQUIRE_SHARED(relpath)                                                   \
  do {                                                                                   \
    if (!std::filesystem::exists(::alpaca::testing::shared_dir() / (relpath)))           \
      GTEST_SKIP() << "shared test data " << (relpath) << " not found under "            \
                   << ::alpaca::testing::shared_dir() << "; skipping";                   \
  } while (0)
