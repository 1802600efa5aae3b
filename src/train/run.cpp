// alpaca::train::run_training: the `alpaca-train [train]` job on this rank.
#include "alpaca/train/run.h"

#include "alpaca/cli/train_args.h"
#include "alpaca/train/trainer.h"

namespace alpaca::train {

int run_training(const cli::TrainArgs& args) {
  Trainer trainer(args);
  return trainer.train();
}

}  // namespace alpaca::train
