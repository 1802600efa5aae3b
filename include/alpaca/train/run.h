// The training entry point that `alpaca-train [train]` calls after parsing and validating flags.
#pragma once

#include "alpaca/dist/launch.h"
#include "alpaca/train/options.h"

namespace alpaca::train {

// Runs the whole job (setup -> steps -> eval -> save) on this rank, in the launch `launch` the
// caller discovered (it is not read again). Returns the exit code.
int run_training(const TrainerOptions& options, const dist::LaunchInfo& launch);

}  // namespace alpaca::train
