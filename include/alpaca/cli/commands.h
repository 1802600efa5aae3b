// Subcommands of the alpaca-train binary. main.cpp dispatches on the first argument; each
// subcommand parses its own flags from `args` (argv without the program and subcommand name)
// and returns the process exit code. They throw alpaca::Error on bad input.
#pragma once

#include <string>
#include <vector>

namespace alpaca::cli {

int run_train(const std::vector<std::string>& args);       // default: `alpaca-train [train] ...`
int run_init_model(const std::vector<std::string>& args);  // `init-model --config c.json --output_dir d`
int run_preprocess(const std::vector<std::string>& args);  // `preprocess --data_path ... --output ...`
int run_generate(const std::vector<std::string>& args);    // `generate --model_name_or_path d --instruction ...`
int run_merge(const std::vector<std::string>& args);       // `merge --model_name_or_path B --adapter A --output_dir O`
int run_consolidate(const std::vector<std::string>& args);  // `consolidate CHECKPOINT OUT`
// `estimate-memory <train flags> [--num_gpus N] ...`: the memory planner (plan/memory_plan.h).
int run_estimate_memory(const std::vector<std::string>& args);
// The built-in torchrun-style launcher: `alpaca-train --nproc_per_node N ... <train flags>`.
int run_launcher(const std::vector<std::string>& args);

}  // namespace alpaca::cli
