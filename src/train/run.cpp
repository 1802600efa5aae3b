// alpaca::train::run_training: the `alpaca-train [train]` job on this rank.
#include "alpaca/train/run.h"

#include <ATen/detail/CUDAHooksInterface.h>  // defines: at::detail::getCUDAHooks

#include <chrono>

#include "alpaca/ckpt/preemption.h"
#include "alpaca/dist/runtime.h"
#include "alpaca/train/trainer.h"

namespace alpaca::train {

int run_training(const TrainerOptions& options, const dist::LaunchInfo& launch) {
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
    co.cuda = at::detail::getCUDAHooks().hasCUDA() && at::detail::getCUDAHooks().deviceCount() > 0;
    co.timeout = std::chrono::seconds(options.ddp_timeout_seconds);
    Trainer trainer(options, dist::make_communicator(co), runtime.launch().local_rank);
    rc = trainer.train();
  }
  return rc;
}

}  // namespace alpaca::train
