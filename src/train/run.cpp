// alpaca::train::run_training: the `alpaca-train [train]` job on this rank.
#include "alpaca/train/run.h"

#include <ATen/detail/CUDAHooksInterface.h>  // defines: at::detail::getCUDAHooks

#include <ATen/Context.h>  // defines: at::globalContext

#include <chrono>
#include <cstdlib>

#include "alpaca/ckpt/preemption.h"
#include "alpaca/dist/runtime.h"
#include "alpaca/train/trainer.h"
#include "alpaca/util/log.h"

namespace alpaca::train {

namespace {

// transformers' enable_full_determinism (the seed is always set here): the environment the CUDA
// runtime and cuBLAS read when they start, then LibTorch's deterministic switches. Before anything
// touches CUDA.
void enable_full_determinism() {
  ::setenv("CUDA_LAUNCH_BLOCKING", "1", 1);
  ::setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8", 1);
  ::setenv("FLASH_ATTENTION_DETERMINISTIC", "1", 1);
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  at::globalContext().setDeterministicCuDNN(true);
  at::globalContext().setBenchmarkCuDNN(false);
  ALPACA_INFO("full_determinism: deterministic algorithms on (an op without one fails, naming it), "
              "CUDA_LAUNCH_BLOCKING=1, CUBLAS_WORKSPACE_CONFIG=:16:8");
}

}  // namespace

int run_training(const TrainerOptions& options, const dist::LaunchInfo& launch) {
  if (options.full_determinism) enable_full_determinism();
  // The runtime outlives the trainer (its communicator is gone before MPI is finalized); on an
  // exception it finalizes uncleanly so the launcher ends the other ranks.
  // A scheduler's SIGTERM while a torchrun-style rank still waits for its peers ends it at once.
  dist::set_startup_interrupt([] {
    const int sig = ckpt::stop_signal();
    return sig == 0 ? 0 : ckpt::exit_code_for_stop(sig);
  });
  dist::Runtime runtime(launch);
  int rc = 0;
  {
    dist::CommOptions co;  // NCCL on cuda:local_rank when this process sees a GPU, else a CPU backend
    const bool gpu = at::detail::getCUDAHooks().hasCUDA() && at::detail::getCUDAHooks().deviceCount() > 0;
    co.cuda = gpu && !options.use_cpu;
    if (gpu && options.use_cpu && runtime.launch().rank == 0)
      ALPACA_INFO("--use_cpu: training on the CPU; the visible GPUs are not used");
    co.timeout = std::chrono::seconds(options.ddp_timeout_seconds);
    Trainer trainer(options, dist::make_communicator(co), runtime.launch().local_rank);
    rc = trainer.train();
  }
  return rc;
}

}  // namespace alpaca::train
