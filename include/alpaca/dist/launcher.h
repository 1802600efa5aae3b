// The built-in torchrun-style launcher: starts this node's workers with torchrun's environment
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT), streams their output with "[rank r]: " prefixes, forwards SIGINT/SIGTERM/SIGUSR1
// (the trainer saves a checkpoint and exits on them), and when one worker fails stops the others
// and returns the failing worker's exit code.
// The workers rendezvous through rank 0's c10d::TCPStore (dist::make_communicator).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "alpaca/dist/launch.h"

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

// Kubeflow pods that run our binary itself as the torchrun of the pod: PyTorchJob (training-operator
// v1) sets pod-level RANK (the pod index, also PET_NODE_RANK), WORLD_SIZE (the pod count before
// v1.7, pods x nprocPerNode since; kubeflow/trainer#1790, #1840), PET_NPROC_PER_NODE, PET_NNODES,
// MASTER_ADDR/MASTER_PORT; Trainer v2's torch runtime sets the PET_* ones (PET_MASTER_ADDR/PORT).
// With PET_NPROC_PER_NODE set and LOCAL_RANK unset (not yet a worker), returns the options that
// start this pod's local ranks with global ranks node_rank * nproc + local (program and args left
// empty); otherwise nullopt. Throws alpaca::Error showing the variables when they disagree.
std::optional<LauncherOptions> pod_launcher_options(const EnvMap& env);

// A TCP port that is free on this host now (for a single-node job's store).
int pick_free_port();

}  // namespace alpaca::dist
