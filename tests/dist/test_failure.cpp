// Launcher and failure handling, end to end with real processes: the built-in launcher gives N
// workers distinct ranks and one world; a failing, dead (SIGKILL) or stuck rank ends every rank
// within the timeout + 10 s with a message naming the collective, under mpirun and under our
// launcher; nothing is left running.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "alpaca/dist/launcher.h"
#include "test_util.h"

namespace fs = std::filesystem;
using alpaca::testing::run_command;

namespace {

std::string here() { return fs::read_symlink("/proc/self/exe").parent_path().string(); }
std::string worker() { return here() + "/dist_test_worker"; }

struct Outcome {
  int rc = 0;
  double seconds = 0;
  std::string output;
};

Outcome run(const std::string& cmd) {
  Outcome r;
  auto t0 = std::chrono::steady_clock::now();
  r.rc = run_command(cmd, &r.output);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::string mpirun(int n) { return "mpirun -np " + std::to_string(n) + " --allow-run-as-root --oversubscribe "; }

// Every pid recorded by the workers is gone (or a zombie awaiting a reaper) shortly after.
void expect_nothing_left(const fs::path& piddir) {
  int count = 0;
  for (int attempt = 0; attempt < 40; ++attempt) {
    std::vector<std::string> alive;
    count = 0;
    for (const auto& e : fs::directory_iterator(piddir)) {
      ++count;
      std::ifstream stat("/proc/" + e.path().filename().string() + "/stat");
      std::string pid, comm, state;
      if (stat >> pid >> comm >> state && state != "Z") alive.push_back(pid);
    }
    if (alive.empty()) {
      EXPECT_GT(count, 0) << "the workers recorded no pids";
      return;
    }
    if (attempt == 39) {
      for (auto& p : alive) ::kill(std::stoi(p), SIGKILL);
      FAIL() << alive.size() << " worker process(es) left running, e.g. pid " << alive[0];
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
}

}  // namespace

TEST(Launcher, WorkersSeeDistinctRanksAndOneWorld) {
  Outcome r = run(worker() + " --nproc_per_node 3 report");
  ASSERT_EQ(r.rc, 0) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    std::string line = "[rank " + std::to_string(rank) + "]: RANK " + std::to_string(rank) + " WORLD 3 LOCAL " +
                       std::to_string(rank) + "/3 SOURCE torchrun BACKEND store SUM 3";
    EXPECT_NE(r.output.find(line), std::string::npos) << "missing '" << line << "' in:\n" << r.output;
  }
}

TEST(Launcher, AFailingWorkerEndsTheRestAndItsExitCodeComesBack) {
  alpaca::testing::TempDir pids("launcher_fail");
  Outcome r = run("ALPACA_TEST_PIDDIR=" + pids.path().string() + " " + worker() + " --nproc_per_node 3 fail 1 7");
  EXPECT_EQ(r.rc, 7) << r.output;
  EXPECT_LT(r.seconds, 15) << r.output;
  EXPECT_NE(r.output.find("worker rank 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("exited with code 7"), std::string::npos) << r.output;
  // The survivors were stopped while waiting in the barrier, and say so.
  EXPECT_NE(r.output.find("while waiting in barrier"), std::string::npos) << r.output;
  expect_nothing_left(pids.path());
}

TEST(Launcher, ForwardsSigtermAndStopsEveryWorker) {
  alpaca::testing::TempDir pids("launcher_term");
  Outcome r = run("{ ALPACA_TEST_PIDDIR=" + pids.path().string() + " " + worker() +
                  " --nproc_per_node 2 stuck 0 60 & pid=$!; sleep 4; kill -TERM $pid; wait $pid; }");
  EXPECT_EQ(r.rc, 128 + SIGTERM) << r.output;
  EXPECT_LT(r.seconds, 15) << r.output;
  EXPECT_NE(r.output.find("forwarding it to the workers"), std::string::npos) << r.output;
  expect_nothing_left(pids.path());
}

TEST(Launcher, StoreBackendCollectivesPass) {
  // The collectives suite (written for mpirun) under our launcher, over the TCPStore backend.
  alpaca::dist::LauncherOptions o;
  o.nproc_per_node = 3;
  o.program = here() + "/test_collectives";
  ::setenv("ALPACA_TEST_BACKEND", "store", 1);
  int rc = alpaca::dist::run_workers(o);
  ::unsetenv("ALPACA_TEST_BACKEND");
  EXPECT_EQ(rc, 0);
}

class DeadOrStuck : public ::testing::TestWithParam<std::string> {};

// One rank dies (SIGKILL) or hangs while the others are in an all_reduce with a 5 s timeout.
TEST_P(DeadOrStuck, OthersExitNonZeroInTimeNamingTheCollective) {
  const int timeout_s = 5;
  const std::string mode = GetParam().substr(GetParam().find('_') + 1);
  const bool use_mpirun = GetParam().rfind("mpirun", 0) == 0;
  alpaca::testing::TempDir pids("dead_or_stuck");
  std::string args = mode + " 1 " + std::to_string(timeout_s);
  std::string cmd = "ALPACA_TEST_PIDDIR=" + pids.path().string() + " " +
                    (use_mpirun ? mpirun(3) + worker() + " " + args : worker() + " --nproc_per_node 3 " + args);
  Outcome r = run(cmd);
  EXPECT_NE(r.rc, 0) << r.output;
  // The victim stops 1 s after start-up; everyone must be gone within timeout + 10 s of that.
  EXPECT_LT(r.seconds, 1 + timeout_s + 10 + 3) << r.output;
  EXPECT_NE(r.output.find("all_reduce #2 (65536 x BFloat16, sum)"), std::string::npos)
      << "no rank named the collective:\n" << r.output;
  if (mode == "stuck") {
    EXPECT_NE(r.output.find("error: all_reduce #2"), std::string::npos) << r.output;
  }
  std::cout << GetParam() << ": exit code " << r.rc << " after " << r.seconds << " s\n";
  expect_nothing_left(pids.path());
}

INSTANTIATE_TEST_SUITE_P(Failure, DeadOrStuck,
                         ::testing::Values("mpirun_die", "mpirun_stuck", "launcher_die", "launcher_stuck"));

// Checked wherever the tests run: with no GPU, or with fewer GPUs than local ranks, the nccl
// backend refuses with a hint instead of putting two ranks on one GPU.
TEST(Nccl, ALocalRankBeyondTheGpusIsAnErrorWithAHint) {
  Outcome r = run("RANK=7 WORLD_SIZE=8 LOCAL_RANK=7 LOCAL_WORLD_SIZE=8 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 "
                  "ALPACA_TEST_BACKEND=nccl " +
                  worker() + " report");
  EXPECT_EQ(r.rc, 1) << r.output;
  const bool no_gpu = r.output.find("needs a CUDA GPU but none is visible") != std::string::npos;
  const bool too_few = r.output.find("local rank 7 has no GPU") != std::string::npos &&
                       r.output.find("start at most one rank per GPU") != std::string::npos;
  EXPECT_TRUE(no_gpu || too_few) << r.output;
}
