// Shared by the launcher and failure tests: run a command (timed, output captured), where the
// test worker is, and "no worker process is left behind".
#pragma once

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "test_util.h"

namespace alpaca::testing::dist {

namespace fs = std::filesystem;
using alpaca::testing::run_command;

inline std::string here() { return fs::read_symlink("/proc/self/exe").parent_path().string(); }
inline std::string worker() { return here() + "/dist_test_worker"; }

struct Outcome {
  int rc = 0;
  double seconds = 0;
  std::string output;
};

inline Outcome run(const std::string& cmd) {
  Outcome r;
  auto t0 = std::chrono::steady_clock::now();
  r.rc = run_command(cmd, &r.output);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

inline std::string mpirun(int n) { return "mpirun -np " + std::to_string(n) + " --allow-run-as-root --oversubscribe "; }

// Every pid recorded by the workers is gone (or a zombie awaiting a reaper) within 10 s.
inline void expect_nothing_left(const fs::path& piddir) {
  int count = 0;
  std::vector<std::string> alive;
  auto all_gone = [&] {
    alive.clear();
    count = 0;
    for (const auto& e : fs::directory_iterator(piddir)) {
      ++count;
      std::ifstream stat("/proc/" + e.path().filename().string() + "/stat");
      std::string pid, comm, state;
      if (stat >> pid >> comm >> state && state != "Z") alive.push_back(pid);
    }
    return alive.empty();
  };
  if (alpaca::testing::wait_until(all_gone, 10)) {
    EXPECT_GT(count, 0) << "the workers recorded no pids";
    return;
  }
  for (auto& p : alive) ::kill(std::stoi(p), SIGKILL);
  FAIL() << alive.size() << " worker process(es) left running, e.g. pid " << alive[0];
}

}  // namespace alpaca::testing::dist
