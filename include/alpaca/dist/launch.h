// How this process was started and where it sits in the job: launch discovery (DESIGN.md,
// "The communicator"). A pure function over an environment map, so every launcher's variables
// can be unit-tested without starting one.
#pragma once

#include <chrono>
#include <map>
#include <string>

namespace alpaca::dist {

// Who started us, in the order discovery checks: torchrun-style variables (torchrun or our own
// --nproc_per_node launcher), Open MPI's mpirun, MPICH/Hydra (mpiexec, Intel MPI), Slurm srun,
// else a single process.
enum class LaunchSource { kTorchrun, kOpenMpi, kMpich, kSlurm, kSingle };
const char* to_string(LaunchSource source);

struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;        // rank among the processes on this node; picks the GPU
  int local_world_size = 1;  // processes on this node
  int node_rank = 0;
  int num_nodes = 1;
  std::string master_addr;  // torchrun-style only: host of the c10d::TCPStore (rank 0)
  int master_port = 0;      // torchrun-style only
  LaunchSource source = LaunchSource::kSingle;
  // Bound on the start-up roll call in dist::init (every rank must answer within it, else the
  // ones missing are named and the job ends) and on the shutdown barrier: --ddp_timeout. Not a
  // launch variable: discover_launch leaves the default; alpaca-train sets it after parsing flags.
  std::chrono::milliseconds timeout = std::chrono::seconds(1800);

  // True when an MPI launcher (mpirun, mpiexec, srun) started us, i.e. MPI_Init can find peers.
  bool mpi_launched() const {
    return source == LaunchSource::kOpenMpi || source == LaunchSource::kMpich || source == LaunchSource::kSlurm;
  }
};

using EnvMap = std::map<std::string, std::string>;

// Reads the launch variables from `env`. Throws alpaca::Error showing the offending variables
// when they are malformed or inconsistent (rank outside the world, local rank outside the node,
// a torchrun-style launch without MASTER_ADDR/MASTER_PORT, ...).
LaunchInfo discover_launch(const EnvMap& env);
// The same over this process's environment.
LaunchInfo discover_launch();
// This process's environment as a map.
EnvMap process_env();

}  // namespace alpaca::dist
