// alpaca::train::run_training: the `alpaca-train [train]` job on this rank.
#include "alpaca/train/run.h"

#include "alpaca/dist/runtime.h"
#include "alpaca/train/trainer.h"

namespace alpaca::train {

int run_training(const TrainerOptions& options, const dist::LaunchInfo& launch) {
  // The runtime outlives the trainer (its communicator is gone before MPI is finalized); on an
  // exception it finalizes uncleanly so the launcher ends the other ranks.
  dist::Runtime runtime(launch);
  int rc = 0;
  {
    Trainer trainer(options);
    rc = trainer.train();
  }
  return rc;
}

}  // namespace alpaca::train
