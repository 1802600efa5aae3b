// The built-in torchrun-style launcher: starts this node's workers with torchrun's environment
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT), streams their output with "[rank r]: " prefixes, forwards SIGINT/SIGTERM/SIGUSR1
// (the trainer saves a checkpoint and exits on them), and when one worker fails stops the others
// and returns the failing worker's exit code.
// The workers rendezvous through rank 0's c10d::TCPStore (dist::make_communicator).
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace alpaca::dist {

struct LauncherOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: a free port on this host (single node only; several nodes need a fixed one)
  std::string program;            // the worker executable
  std::vector<std::string> args;  // its arguments
  // Between SIGTERM and SIGKILL when stopping the other workers after one failed.
  std::chrono::milliseconds stop_grace = std::chrono::seconds(10);
  // Between forwarding a signal the launcher received and SIGKILL: long enough for the workers to
  // finish their step and save a checkpoint (a second SIGINT kills them at once).
  std::chrono::milliseconds signal_grace = std::chrono::minutes(15);
};

// Runs the workers to completion. Returns 0 when all succeed; otherwise the exit code of the
// first worker that failed (128 + signal number for a worker killed by a signal). After a
// forwarded signal: the workers' exit code when they all ended with the same one (the trainer's
// 75 after saving a checkpoint), else 128 + that signal. Throws alpaca::Error on bad options or
// when a worker cannot be started. Must be called from the main thread (it installs
// SIGINT/SIGTERM/SIGUSR1 handlers for its duration).
int run_workers(const LauncherOptions& options);

// A TCP port that is free on this host now (for a single-node job's store).
int pick_free_port();

}  // namespace alpaca::dist
