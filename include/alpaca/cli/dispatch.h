// Picks what `alpaca-train <argv...>` runs: a subcommand (train, init-model, preprocess, merge,
// generate, estimate-memory), --version, the
// built-in launcher when --nproc_per_node is present, grouped help, else training. main() only
// calls this and maps exceptions to exit codes.
#pragma once

#include <string>
#include <vector>

namespace alpaca::cli {

// `argv` without the program name. Returns the exit code; throws UsageError / alpaca::Error.
int dispatch(const std::vector<std::string>& argv);

// `alpaca-train --version`: version, git commit (at configure time) and LibTorch version.
std::string version_text();

// The subcommand names main dispatches, for help and "did you mean" suggestions.
const std::vector<std::string>& subcommand_names();

}  // namespace alpaca::cli
