// The built-in launcher end to end with real processes: N workers get distinct ranks and one
// world (also across two "nodes" on this host), a failing worker ends the rest and its exit code
// comes back, SIGTERM and SIGUSR1 are forwarded, the gloo and store backends run the collectives suite, and the
// runtime's backend choices and refusals.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <functional>

#include "alpaca/dist/launcher.h"
#include "dist_test_helpers.h"

namespace test_launcher {

using namespace alpaca::testing::dist;
using alpaca::testing::BackgroundRun;

namespace {

// The launcher running 2 workers in `mode` in the background (they record their pids in `pids`);
// `act` once `ready` is in two lines of its output. Its exit code (128 + signal when signalled),
// seconds from its start and output.
Outcome signalled_launcher(const fs::path& pids, const std::string& mode, const std::string& ready,
                           const std::function<void(BackgroundRun&)>& act) {
  const auto t0 = std::chrono::steady_clock::now();
  BackgroundRun run("env ALPACA_TEST_PIDDIR=" + pids.string() + " " + worker() + " --nproc_per_node 2 " + mode,
                    pids / "out.log");
  run.wait_until([&] {
    const std::string log = run.log();
    size_t n = 0;
    for (size_t at = log.find(ready); at != std::string::npos; at = log.find(ready, at + 1)) ++n;
    return n >= 2;
  });
  act(run);
  const int status = run.wait();
  Outcome r;
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.output = run.log();
  fs::remove(pids / "out.log");  // only the workers' pid files stay for expect_nothing_left
  return r;
}

}  // namespace

TEST(Launcher, WorkersSeeDistinctRanksAndOneWorld) {
  Outcome r = run(worker() + " --nproc_per_node 3 report");
  ASSERT_EQ(r.rc, 0) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    std::string line = "[rank " + std::to_string(rank) + "]: RANK " + std::to_string(rank) + " WORLD 3 LOCAL " +
                       std::to_string(rank) + "/3 NODE 0/1 SOURCE torchrun BACKEND gloo SUM 3";
    EXPECT_NE(r.output.find(line), std::string::npos) << "missing '" << line << "' in:\n" << r.output;
  }
}

// Two "nodes" on this host: two launchers with --nnodes 2 and node ranks 0 and 1 meet at one
// master port and form one world of 4.
TEST(Launcher, TwoNodesFormOneWorld) {
  const std::string port = std::to_string(alpaca::dist::pick_free_port());
  auto node = [&](int r) {
    return worker() + " --nnodes 2 --node_rank " + std::to_string(r) +
           " --master_addr 127.0.0.1 --master_port " + port + " --nproc_per_node 2 report";
  };
  Outcome r = run("{ " + node(1) + " & pid=$!; " + node(0) + "; rc0=$?; wait $pid; rc1=$?; exit $((rc0 + rc1)); }");
  ASSERT_EQ(r.rc, 0) << r.output;
  for (int rank = 0; rank < 4; ++rank) {
    std::string line = "[rank " + std::to_string(rank) + "]: RANK " + std::to_string(rank) + " WORLD 4 LOCAL " +
                       std::to_string(rank % 2) + "/2 NODE " + std::to_string(rank / 2) + "/2 SOURCE torchrun BACKEND gloo SUM 6";
    EXPECT_NE(r.output.find(line), std::string::npos) << "missing '" << line << "' in:\n" << r.output;
  }
}

TEST(Launcher, BadFlagsAreErrors) {
  Outcome r = run(worker() + " --nproc_per_node 2 --nnodes 2 --node_rank 1 report");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.output.find("--nnodes 2 needs --master_addr"), std::string::npos) << r.output;
  r = run(worker() + " --nproc_per_node two report");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.output.find("--nproc_per_node expects a non-negative integer, got 'two'"), std::string::npos) << r.output;
  r = run(worker() + " --nproc_per_node 2 --nnodes 1:2 report");
  EXPECT_NE(r.output.find("elastic node ranges are not supported"), std::string::npos) << r.output;
}

// Under mpirun the placement comes from MPI itself (one node here).
TEST(Runtime, MpirunPlacement) {
  Outcome r = run(mpirun(3) + worker() + " report");
  ASSERT_EQ(r.rc, 0) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    std::string line = "RANK " + std::to_string(rank) + " WORLD 3 LOCAL " + std::to_string(rank) +
                       "/3 NODE 0/1 SOURCE openmpi BACKEND mpi SUM 3";
    EXPECT_NE(r.output.find(line), std::string::npos) << "missing '" << line << "' in:\n" << r.output;
  }
}

// The mpi backend without an MPI launcher is refused with the way out.
TEST(Runtime, MpiBackendNeedsAnMpiLauncher) {
  Outcome r = run("RANK=0 WORLD_SIZE=1 ALPACA_TEST_BACKEND=mpi " + worker() + " report");
  EXPECT_EQ(r.rc, 1) << r.output;
  EXPECT_NE(r.output.find("the mpi backend needs an MPI launch"), std::string::npos) << r.output;
  r = run("ALPACA_TEST_BACKEND=ucc " + worker() + " report");
  EXPECT_NE(r.output.find("unknown communicator backend 'ucc'; use one of auto, mpi, gloo, store, nccl"), std::string::npos)
      << r.output;
}

// A single process (no launcher) gets a working one-rank MPI communicator (MPI singleton).
TEST(Runtime, SingleProcessWorks) {
  Outcome r = run("env -u RANK -u WORLD_SIZE " + worker() + " report");
  EXPECT_EQ(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("RANK 0 WORLD 1 LOCAL 0/1 NODE 0/1 SOURCE single BACKEND mpi SUM 0"), std::string::npos) << r.output;
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
  // Signalled once both workers are past start-up (a loaded machine may take seconds to start them).
  const Outcome r = signalled_launcher(pids.path(), "stuck 0 60", "RANK ", [](BackgroundRun& run) { run.signal(SIGTERM); });
  EXPECT_EQ(r.rc, 128 + SIGTERM) << r.output;
  EXPECT_LT(r.seconds, 15) << r.output;
  EXPECT_NE(r.output.find("forwarding it to the workers"), std::string::npos) << r.output;
  expect_nothing_left(pids.path());
}

// A preemption notice (Slurm's --signal=USR1, or SIGTERM) reaches every worker, the workers get
// longer than the failure grace (10 s) to save, and their common exit code comes back.
TEST(Launcher, ForwardsSigusr1AndWaitsForTheWorkersToSave) {
  alpaca::testing::TempDir pids("launcher_usr1");
  // Signalled once both workers wait with their handlers installed (a loaded machine may take
  // seconds to start them), then SIGTERM on top once the launcher has forwarded SIGUSR1: neither
  // cuts the 11 s save short.
  const Outcome r = signalled_launcher(pids.path(), "save 11000 75", "WAITING", [](BackgroundRun& run) {
    run.signal(SIGUSR1);
    run.wait_for_log("forwarding it to the workers");
    run.signal(SIGTERM);
  });
  EXPECT_EQ(r.rc, 75) << r.output;
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_NE(r.output.find("[rank " + std::to_string(rank) + "]: SAVED rank " + std::to_string(rank) + " on signal " +
                            std::to_string(SIGUSR1)),
              std::string::npos)
        << r.output;
  EXPECT_EQ(r.output.find("killing"), std::string::npos) << r.output;
  expect_nothing_left(pids.path());
}

// The collectives suite (written for mpirun) under our launcher: over gloo (the default for
// torchrun-style launches) at 2, 3 and 4 ranks, and over the TCPStore backend (the bench baseline).
int collectives_under_launcher(int ranks, const char* backend) {
  alpaca::dist::LauncherOptions o;
  o.nproc_per_node = ranks;
  o.program = here() + "/test_collectives";
  ::setenv("ALPACA_TEST_BACKEND", backend, 1);
  int rc = alpaca::dist::run_workers(o);
  ::unsetenv("ALPACA_TEST_BACKEND");
  return rc;
}

TEST(Launcher, GlooBackendCollectivesPass) {
  for (int ranks : {2, 3, 4}) EXPECT_EQ(collectives_under_launcher(ranks, "gloo"), 0) << ranks << " ranks";
}

// The same over gloo's TCP pairs (the shared-memory path turned off), and through a 1 MiB
// shared-memory buffer per rank, so the large collectives move in many pieces.
TEST(Launcher, GlooBackendCollectivesPassOverTcpAndInSmallPieces) {
  ::setenv("ALPACA_GLOO_SHM", "0", 1);
  EXPECT_EQ(collectives_under_launcher(3, "gloo"), 0) << "over TCP";
  ::unsetenv("ALPACA_GLOO_SHM");
  ::setenv("ALPACA_GLOO_SHM_MB", "1", 1);
  EXPECT_EQ(collectives_under_launcher(3, "gloo"), 0) << "1 MiB shared-memory buffers";
  ::unsetenv("ALPACA_GLOO_SHM_MB");
}

TEST(Launcher, StoreBackendCollectivesPass) { EXPECT_EQ(collectives_under_launcher(3, "store"), 0); }

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

}  // namespace test_launcher
