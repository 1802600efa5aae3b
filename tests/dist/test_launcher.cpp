// The built-in launcher end to end with real processes: N workers get distinct ranks and one
// world (also across two "nodes" on this host), a failing worker ends the rest and its exit code
// comes back, SIGTERM and SIGUSR1 are forwarded, the gloo and store backends run the collectives suite, and the
// runtime's backend choices and refusals.
#include <gtest/gtest.h>

#include "alpaca/dist/launcher.h"
#include "dist_test_helpers.h"

using namespace alpaca::testing::dist;

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
  const std::string log = (pids.path() / "out.log").string();
  Outcome r = run("{ ALPACA_TEST_PIDDIR=" + pids.path().string() + " " + worker() + " --nproc_per_node 2 stuck 0 60 > " +
                  log + " 2>&1 & pid=$!; for i in $(seq 1200); do [ $(grep -c 'RANK ' " + log +
                  ") -ge 2 ] && break; sleep 0.1; done; sleep 1; kill -TERM $pid; wait $pid; rc=$?; cat " + log + "; rm " +
                  log + "; exit $rc; }");
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
  // seconds to start them), then SIGTERM on top: neither cuts the 11 s save short.
  const std::string log = (pids.path() / "out.log").string();
  Outcome r = run("{ ALPACA_TEST_PIDDIR=" + pids.path().string() + " " + worker() + " --nproc_per_node 2 save 11000 75 > " +
                  log + " 2>&1 & pid=$!; for i in $(seq 1200); do [ $(grep -c WAITING " + log +
                  ") -ge 2 ] && break; sleep 0.1; done; kill -USR1 $pid; sleep 1; kill -TERM $pid; wait $pid; rc=$?; cat " +
                  log + "; rm " + log + "; exit $rc; }");
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
