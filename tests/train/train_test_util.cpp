#include "train_test_util.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace alpaca::testing {

int run_trainer(const std::string& args, int ranks, std::string* output) {
  std::string cmd;
  if (ranks > 1) cmd = "mpirun -np " + std::to_string(ranks) + " --allow-run-as-root --oversubscribe --bind-to none ";
  cmd += train_bin() + " " + args;
  return run_command(cmd, output);
}

std::vector<std::map<std::string, double>> read_metrics(const std::filesystem::path& output_dir) {
  std::vector<std::map<std::string, double>> out;
  std::ifstream f(output_dir / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line);
    std::map<std::string, double> m;
    for (const auto& [k, v] : j.items())
      if (v.is_number()) m[k] = v.get<double>();
    out.push_back(std::move(m));
  }
  return out;
}

std::vector<StepLog> read_step_logs(const std::filesystem::path& output_dir) {
  std::vector<StepLog> out;
  for (const auto& m : read_metrics(output_dir)) {
    if (!m.count("loss") || !m.count("step")) continue;
    StepLog s;
    s.step = static_cast<int64_t>(m.at("step"));
    s.loss = m.at("loss");
    s.learning_rate = m.count("learning_rate") ? m.at("learning_rate") : 0;
    s.grad_norm = m.count("grad_norm") ? m.at("grad_norm") : 0;
    out.push_back(s);
  }
  return out;
}

}  // namespace alpaca::testing
