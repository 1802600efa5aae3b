// Failure handling end to end: a dead (SIGKILL) or stuck rank in the middle of an all_reduce
// ends every rank within the timeout + 10 s with a message naming the collective, under mpirun
// (mpi backend) and under our launcher (gloo backend, through shared memory on one host);
// nothing is left running.
#include <gtest/gtest.h>

#include <sstream>

#include "alpaca/dist/launcher.h"
#include "dist_test_helpers.h"

namespace test_failure {

using namespace alpaca::testing::dist;

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
  if (mode == "stuck") {  // the survivors' own timeout fired: an error line names the collective
    bool named = false;
    std::istringstream lines(r.output);
    for (std::string line; std::getline(lines, line);)
      named |= line.find("error: ") != std::string::npos && line.find("all_reduce #2") != std::string::npos;
    EXPECT_TRUE(named) << r.output;
    // Our launcher's ranks share this host: gloo's shared-memory wait names the rank that never came.
    if (!use_mpirun) {
      EXPECT_NE(r.output.find("timed out waiting for rank 1 (not arrived)"), std::string::npos) << r.output;
    }
  }
  std::cout << GetParam() << ": exit code " << r.rc << " after " << r.seconds << " s\n";
  expect_nothing_left(pids.path());
}

INSTANTIATE_TEST_SUITE_P(Failure, DeadOrStuck,
                         ::testing::Values("mpirun_die", "mpirun_stuck", "launcher_die", "launcher_stuck"));

}  // namespace test_failure
