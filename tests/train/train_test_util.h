// Helpers for the trainer's tests: run alpaca-train (optionally under mpirun) and read the
// metrics.jsonl it writes.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace alpaca::testing {

struct StepLog {
  int64_t step = 0;
  double loss = 0, learning_rate = 0, grad_norm = 0;
};

// Runs `alpaca-train <args>` with `ranks` processes (1 = plain, >1 = mpirun -np). Returns the
// exit status; `output` receives stdout+stderr.
int run_trainer(const std::string& args, int ranks, std::string* output);

// The per-step training logs (entries with "loss" and "step") of output_dir/metrics.jsonl.
std::vector<StepLog> read_step_logs(const std::filesystem::path& output_dir);
// Every metrics.jsonl entry as key -> number (non-numbers skipped).
std::vector<std::map<std::string, double>> read_metrics(const std::filesystem::path& output_dir);

}  // namespace alpaca::testing
