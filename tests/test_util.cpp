#include "test_util.h"

#include "alpaca/util/error.h"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace alpaca::testing {
namespace {
std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return (v && *v) ? std::string(v) : fallback;
}
}  // namespace

std::filesystem::path source_dir() { return env_or("ALPACA_SOURCE_DIR", "."); }
std::filesystem::path binary_dir() { return env_or("ALPACA_BINARY_DIR", "."); }
std::filesystem::path shared_dir() { return env_or("ALPACA_SHARED_DIR", (source_dir() / ".." / "shared").string()); }
std::string python() { return env_or("ALPACA_PYTHON", (source_dir() / ".venv" / "bin" / "python").string()); }
std::string train_bin() { return env_or("ALPACA_TRAIN_BIN", (binary_dir() / "alpaca-train").string()); }

std::string fixture_skip_reason(const std::filesystem::path& dir) {
  const std::filesystem::path marker = dir / "SKIPPED";
  if (!std::filesystem::exists(marker)) return "";
  std::ifstream in(marker);
  std::string why((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return why.empty() ? "(no reason given)" : why;
}

int run_command(const std::string& cmd, std::string* output) {
  FILE* pipe = popen((cmd + " 2>&1").c_str(), "r");
  if (!pipe) return -1;
  std::array<char, 4096> buf;
  std::string out;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  int status = pclose(pipe);
  if (output) *output = out;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const alpaca::Error& e) {
    return e.message();
  }
  return "";
}

BackgroundRun::BackgroundRun(const std::string& cmd, const std::filesystem::path& log) : log_(log) {
  const std::string line = "exec " + cmd + " > '" + log.string() + "' 2>&1";
  pid_ = fork();
  if (pid_ == 0) {
    execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
}

BackgroundRun::BackgroundRun(const std::function<void()>& child, const std::filesystem::path& log) : log_(log) {
  pid_ = fork();
  if (pid_ == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    try {
      child();
    } catch (...) {
      _exit(1);
    }
    _exit(0);
  }
}

BackgroundRun::~BackgroundRun() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  int status = 0;
  waitpid(pid_, &status, 0);
}

bool wait_until(const std::function<bool()>& done, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return done();
}

bool BackgroundRun::wait_until(const std::function<bool()>& done, double seconds) const {
  return alpaca::testing::wait_until(done, seconds);
}

bool BackgroundRun::wait_for_log(const std::string& text, double seconds) const {
  return wait_until([&] { return log().find(text) != std::string::npos; }, seconds);
}

bool BackgroundRun::wait_for_file(const std::filesystem::path& path, double seconds) const {
  return wait_until([&] { return std::filesystem::exists(path); }, seconds);
}

void BackgroundRun::signal(int sig) const {
  if (pid_ > 0) kill(pid_, sig);
}

int BackgroundRun::wait(double seconds) {
  if (pid_ <= 0) return status_;
  const bool ended = wait_until([&] { return waitpid(pid_, &status_, WNOHANG) == pid_; }, seconds);
  if (!ended) {
    kill(pid_, SIGKILL);
    waitpid(pid_, &status_, 0);
  }
  pid_ = -1;
  return status_;
}

TempDir::TempDir(const std::string& tag) {
  std::random_device rd;
  auto base = binary_dir() / "test_tmp";
  std::filesystem::create_directories(base);
  path_ = base / (tag + "_" + std::to_string(rd()));
  std::filesystem::remove_all(path_);
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  if (!std::getenv("ALPACA_KEEP_TMP")) {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
}

}  // namespace alpaca::testing
