// Launch discovery over environment maps: every launcher's variables, precedence, and the
// errors for inconsistent ones (which must show the variables).
#include <gtest/gtest.h>

#include <array>
#include <string>
#include <utility>
#include <vector>

#include "alpaca/dist/launch.h"
#include "alpaca/util/error.h"

namespace test_launch {

using alpaca::dist::discover_launch;
using alpaca::dist::EnvMap;
using alpaca::dist::LaunchSource;

namespace {
std::string error_of(const EnvMap& env) {
  try {
    discover_launch(env);
  } catch (const alpaca::Error& e) {
    return e.message();
  }
  return "";
}

// The numbers every launcher's variables give: rank, world size, local rank, local world size,
// node rank and node count.
void expect_numbers(const alpaca::dist::LaunchInfo& li, LaunchSource source, const std::array<int, 6>& want) {
  EXPECT_EQ(li.source, source);
  EXPECT_EQ(li.rank, want[0]);
  EXPECT_EQ(li.world_size, want[1]);
  EXPECT_EQ(li.local_rank, want[2]);
  EXPECT_EQ(li.local_world_size, want[3]);
  EXPECT_EQ(li.node_rank, want[4]);
  EXPECT_EQ(li.num_nodes, want[5]);
}
}  // namespace

TEST(Launch, NothingSetIsASingleProcess) {
  auto li = discover_launch(EnvMap{{"HOME", "/root"}});
  EXPECT_EQ(li.source, LaunchSource::kSingle);
  EXPECT_EQ(li.rank, 0);
  EXPECT_EQ(li.world_size, 1);
  EXPECT_EQ(li.local_world_size, 1);
  EXPECT_FALSE(li.mpi_launched());
}

TEST(Launch, Torchrun) {
  auto li = discover_launch(EnvMap{{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"},
                                   {"GROUP_RANK", "1"}, {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29500"}});
  expect_numbers(li, LaunchSource::kTorchrun, {5, 8, 1, 4, 1, 2});
  EXPECT_EQ(li.master_addr, "node0");
  EXPECT_EQ(li.master_port, 29500);
  EXPECT_FALSE(li.mpi_launched());
}

// torchrun-style variables win over an MPI launcher's when they describe the same process (a
// wrapper mapping OMPI_COMM_WORLD_RANK to RANK) or a larger world (mpirun starting torchrun or
// --nproc_per_node once per node). A smaller world is stale RANK/WORLD_SIZE under mpirun, which
// would make each MPI rank a job of its own: an error showing both.
TEST(Launch, TorchrunWinsOverMpiVariablesThatAgree) {
  auto li = discover_launch(EnvMap{{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"MASTER_ADDR", "n0"}, {"MASTER_PORT", "29500"},
                                   {"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  EXPECT_EQ(li.source, LaunchSource::kTorchrun);
  EXPECT_EQ(li.world_size, 8);
  li = discover_launch(EnvMap{{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "n0"}, {"MASTER_PORT", "29500"},
                              {"PMI_RANK", "3"}, {"PMI_SIZE", "4"}});
  EXPECT_EQ(li.source, LaunchSource::kTorchrun);
  for (const auto& [rank, size] : std::vector<std::pair<std::string, std::string>>{{"3", "4"}, {"1", "2"}}) {
    const std::string e = error_of({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"OMPI_COMM_WORLD_RANK", rank},
                                    {"OMPI_COMM_WORLD_SIZE", size}, {"OMPI_COMM_WORLD_LOCAL_RANK", rank},
                                    {"OMPI_COMM_WORLD_LOCAL_SIZE", size}});
    EXPECT_NE(e.find("RANK=0 WORLD_SIZE=1 contradict Open MPI's OMPI_COMM_WORLD_RANK=" + rank), std::string::npos) << e;
    EXPECT_NE(e.find("unset RANK and WORLD_SIZE"), std::string::npos) << e;
  }
  EXPECT_NE(error_of({{"RANK", "2"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "n0"}, {"MASTER_PORT", "1"}, {"PMI_RANK", "1"},
                      {"PMI_SIZE", "4"}}).find("contradict MPICH/Hydra's PMI_RANK=1 PMI_SIZE=4"), std::string::npos);
}

// A count of 0 (a script's $((NNODES * NPROC)) over an unset variable) is an error naming the
// variable, not a division by zero; LOCAL_RANK without RANK would make each process a job of its own.
TEST(Launch, ZeroCountsAndLocalRankAloneAreErrors) {
  for (const EnvMap& env : std::vector<EnvMap>{
           {{"RANK", "0"}, {"WORLD_SIZE", "0"}},
           {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "0"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}},
           {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
            {"OMPI_COMM_WORLD_LOCAL_SIZE", "0"}},
           {{"PMI_RANK", "0"}, {"PMI_SIZE", "0"}},
           {{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}, {"MPI_LOCALNRANKS", "0"}},
           {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "0"}, {"SLURM_LOCALID", "0"}}}) {
    const std::string e = error_of(env);
    EXPECT_NE(e.find("must be at least 1"), std::string::npos) << e;
  }
  for (const char* var : {"LOCAL_RANK", "LOCAL_WORLD_SIZE"}) {
    const std::string e = error_of({{var, "1"}});
    EXPECT_NE(e.find("RANK and WORLD_SIZE are not"), std::string::npos) << e;
    EXPECT_NE(e.find(std::string(var) + "=1"), std::string::npos) << e;
  }
}

TEST(Launch, OpenMpi) {
  auto li = discover_launch(EnvMap{{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                                   {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  expect_numbers(li, LaunchSource::kOpenMpi, {3, 4, 1, 2, 1, 2});
  EXPECT_TRUE(li.mpi_launched());
}

TEST(Launch, MpichHydra) {
  auto li = discover_launch(
      EnvMap{{"PMI_RANK", "2"}, {"PMI_SIZE", "3"}, {"MPI_LOCALRANKID", "2"}, {"MPI_LOCALNRANKS", "3"}});
  EXPECT_EQ(li.source, LaunchSource::kMpich);
  EXPECT_EQ(li.rank, 2);
  EXPECT_EQ(li.local_rank, 2);
  EXPECT_EQ(li.num_nodes, 1);
}

TEST(Launch, SlurmWithCompressedTasksPerNode) {
  auto li = discover_launch(EnvMap{{"SLURM_PROCID", "9"}, {"SLURM_NTASKS", "11"}, {"SLURM_LOCALID", "1"},
                                   {"SLURM_NODEID", "2"}, {"SLURM_STEP_TASKS_PER_NODE", "4(x2),3"}});
  expect_numbers(li, LaunchSource::kSlurm, {9, 11, 1, 3, 2, 3});
}

TEST(Launch, SlurmStepTasksWinOverAllocation) {
  auto li = discover_launch(EnvMap{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "8"}, {"SLURM_STEP_NUM_TASKS", "2"},
                                   {"SLURM_LOCALID", "1"}, {"SLURM_NTASKS_PER_NODE", "2"}});
  EXPECT_EQ(li.world_size, 2);
  EXPECT_EQ(li.local_world_size, 2);
}

TEST(Launch, InconsistentVariablesAreErrorsThatShowThem) {
  std::string msg = error_of(EnvMap{{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                                    {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}});
  EXPECT_NE(msg.find("rank 4 is outside the world of 4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("OMPI_COMM_WORLD_RANK=4 OMPI_COMM_WORLD_SIZE=4"), std::string::npos) << msg;

  msg = error_of(EnvMap{{"RANK", "1"}, {"MASTER_ADDR", "x"}});
  EXPECT_NE(msg.find("needs both RANK and WORLD_SIZE"), std::string::npos) << msg;
  EXPECT_NE(msg.find("RANK=1"), std::string::npos) << msg;

  msg = error_of(EnvMap{{"RANK", "1"}, {"WORLD_SIZE", "2"}});
  EXPECT_NE(msg.find("needs MASTER_ADDR and MASTER_PORT"), std::string::npos) << msg;

  msg = error_of(EnvMap{{"RANK", "1"}, {"WORLD_SIZE", "two"}, {"MASTER_ADDR", "x"}, {"MASTER_PORT", "1"}});
  EXPECT_NE(msg.find("WORLD_SIZE=two is not a non-negative integer"), std::string::npos) << msg;

  msg = error_of(EnvMap{{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}, {"MPI_LOCALRANKID", "3"}, {"MPI_LOCALNRANKS", "2"}});
  EXPECT_NE(msg.find("local rank 3 is outside the 2 processes of this node"), std::string::npos) << msg;

  msg = error_of(EnvMap{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "5"}, {"SLURM_LOCALID", "0"},
                        {"SLURM_NODEID", "0"}, {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}});
  EXPECT_NE(msg.find("adds up to 4 tasks but the step has 5"), std::string::npos) << msg;

  msg = error_of(EnvMap{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"},
                        {"SLURM_STEP_TASKS_PER_NODE", "2(y2)"}});
  EXPECT_NE(msg.find("cannot read tasks per node '2(y2)'"), std::string::npos) << msg;
}

}  // namespace test_launch
