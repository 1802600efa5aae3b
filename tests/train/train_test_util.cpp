#include "train_test_util.h"

#include <signal.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace alpaca::testing {

std::filesystem::path fixture_dir(const std::string& name) { return binary_dir() / "fixtures" / name; }

TrainFlags::TrainFlags(const std::filesystem::path& fixture, const std::filesystem::path& output_dir) {
  set("--model_name_or_path", (fixture / "model").string());
  set("--data_path", (fixture / "data.json").string());
  set("--output_dir", output_dir.string());
  set("--model_max_length 64 --logging_steps 1 --report_to jsonl --seed 42");
}

TrainFlags& TrainFlags::set(const std::string& name, const std::string& value) {
  for (auto& [n, v] : flags_)
    if (n == name) {
      v = value;
      return *this;
    }
  flags_.emplace_back(name, value);
  return *this;
}

TrainFlags& TrainFlags::set(const std::string& flags) {
  std::vector<std::string> words;
  for (size_t i = flags.find_first_not_of(' '); i != std::string::npos; i = flags.find_first_not_of(' ', i)) {
    const size_t end = flags[i] == '\'' ? flags.find('\'', i + 1) + 1 : flags.find(' ', i);
    words.push_back(flags.substr(i, end == std::string::npos ? std::string::npos : end - i));
    i = end;
  }
  for (size_t w = 0; w < words.size(); ++w) {
    const bool has_value = w + 1 < words.size() && words[w + 1].rfind("--", 0) != 0;
    set(words[w], has_value ? words[w + 1] : "");
    w += has_value;
  }
  return *this;
}

TrainFlags& TrainFlags::steps(int64_t max_steps) { return set("--max_steps", std::to_string(max_steps)); }

TrainFlags& TrainFlags::batch(int64_t per_device, int64_t accum) {
  set("--per_device_train_batch_size", std::to_string(per_device));
  return set("--gradient_accumulation_steps", std::to_string(accum));
}

std::string TrainFlags::str() const {
  std::string out;
  for (const auto& [name, value] : flags_) out += (out.empty() ? "" : " ") + name + (value.empty() ? "" : " " + value);
  return out;
}

TrainFlags parity_flags(const std::filesystem::path& fixture, const std::filesystem::path& out, int64_t steps,
                        int64_t per_device, int64_t accum, const std::string& lr) {
  return TrainFlags(fixture, out)
      .steps(steps)
      .batch(per_device, accum)
      .set("--learning_rate", lr)
      .set("--weight_decay 0.01 --save_strategy no")
      .set(kCosineWarmup);
}

std::string trainer_command(const std::string& args, int ranks, const std::string& faults) {
  std::string cmd = faults.empty() ? "" : "env ALPACA_FAULTS=" + faults + " ";
  if (ranks > 1) cmd += "mpirun -np " + std::to_string(ranks) + " --allow-run-as-root --oversubscribe --bind-to none ";
  return cmd + train_bin() + " " + args;
}

int run_trainer(const std::string& args, int ranks, std::string* output) {
  return run_command(trainer_command(args, ranks), output);
}

int signal_rank(const std::filesystem::path& output_dir, int rank, int sig) {
  const std::string rank_env = "OMPI_COMM_WORLD_RANK=" + std::to_string(rank) + '\0';
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string cmdline = read_text(e.path() / "cmdline");
    if (cmdline.find(output_dir.string()) == std::string::npos || cmdline.find("mpirun") != std::string::npos) continue;
    if (read_text(e.path() / "environ").find(rank_env) == std::string::npos) continue;
    const int pid = std::stoi(e.path().filename().string());
    ::kill(pid, sig);
    return pid;
  }
  return -1;
}

BackgroundRun launch_trainer(const std::string& args, int ranks, const std::filesystem::path& log,
                             const std::string& faults) {
  return BackgroundRun(trainer_command(args, ranks, faults), log);
}

SharedRun::SharedRun(const std::string& tag, const std::function<std::string(const std::filesystem::path&)>& args,
                     int ranks)
    : tmp_(tag), dir_(tmp_.path() / "run") {
  rc_ = run_trainer(args(dir_), ranks, &log_);
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

ReferenceSteps read_reference_steps(const std::filesystem::path& reference_json) {
  std::ifstream f(reference_json);
  const auto j = nlohmann::json::parse(f);
  auto list = [&](const char* key) { return j.contains(key) ? j[key].get<std::vector<double>>() : std::vector<double>{}; };
  return {list("losses"), list("grad_norms"), list("learning_rates")};
}

StepParity expect_steps_match(const std::vector<StepLog>& steps, const ReferenceSteps& ref, const std::string& who) {
  StepParity p;
  for (size_t i = 0; i < steps.size() && i < ref.losses.size(); ++i) {
    const double r = ref.losses[i];
    const double rel = std::abs(steps[i].loss - r) / std::abs(r);
    p.worst_loss = std::max(p.worst_loss, rel);
    EXPECT_LE(rel, 1e-4) << "step " << i + 1 << ": ours " << steps[i].loss << " " << who << " " << r;
    if (!ref.learning_rates.empty()) {
      EXPECT_NEAR(steps[i].learning_rate, ref.learning_rates.at(i), 1e-12) << "step " << i + 1;
    }
    const double n = ref.grad_norms.at(i);
    p.worst_norm = std::max(p.worst_norm, std::abs(steps[i].grad_norm - n) / n);
    EXPECT_NEAR(steps[i].grad_norm, n, 1e-3 * n) << "step " << i + 1;
  }
  return p;
}

double expect_losses_close(const std::vector<StepLog>& got, const std::vector<StepLog>& want, double rel_tol,
                           const std::string& what) {
  double worst = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const double rel = std::abs(got[i].loss - want[i].loss) / std::abs(want[i].loss);
    worst = std::max(worst, rel);
    EXPECT_LE(rel, rel_tol) << what << " step " << i + 1 << ": " << got[i].loss << " vs " << want[i].loss;
  }
  return worst;
}

PeftLoadCheck peft_load_check(const std::filesystem::path& base, const std::filesystem::path& adapter,
                              const std::filesystem::path& ours, const std::filesystem::path& merged) {
  PeftLoadCheck c;
  c.rc = run_command(python() + " " + (source_dir() / "tests/reference/lora_peft_load_check.py").string() + " --base " +
                         base.string() + " --adapter " + adapter.string() + " --ours " + ours.string() +
                         (merged.empty() ? std::string() : " --merged " + merged.string()) + " 2>&1",
                     &c.output);
  const auto brace = c.output.rfind("{\"max_abs_diff\"");
  if (brace == std::string::npos) return c;
  const auto j = nlohmann::json::parse(c.output.substr(brace, c.output.find('\n', brace) - brace));
  c.ok = true;
  c.max_abs_diff = j["max_abs_diff"].get<double>();
  c.max_abs = j.value("max_abs", 0.0);
  if (j.contains("merged_max_abs_diff") && !j["merged_max_abs_diff"].is_null())
    c.merged_max_abs_diff = j["merged_max_abs_diff"].get<double>();
  c.warnings = j["warnings"].dump();
  return c;
}

}  // namespace alpaca::testing
