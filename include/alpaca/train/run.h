// The training entry point that `alpaca-train [train]` calls after parsing and validating flags.
#pragma once

namespace alpaca::cli {
struct TrainArgs;
}

namespace alpaca::train {

// Runs the whole job (setup -> steps -> eval -> save) on this rank. Returns the exit code.
int run_training(const cli::TrainArgs& args);

}  // namespace alpaca::train
