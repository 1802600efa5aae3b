// PLACEHOLDER until the trainer lands: replaced wholesale by src/train's implementation.
#include "alpaca/train/run.h"
#include "alpaca/util/error.h"

namespace alpaca::train {
int run_training(const cli::TrainArgs&) { ALPACA_FAIL("training is not part of this build yet"); }
}  // namespace alpaca::train
