// trainer_state.json exactly as Hugging Face's TrainerState writes it (dataclasses.asdict,
// indent 2, sorted keys), so HF tooling that reads it (and people who know it) find what they
// expect: global_step, epoch, max_steps, logging/eval/save steps, train_batch_size,
// num_train_epochs, total_flos, log_history (one entry per log call, with "step"), best model.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace alpaca::ckpt {

// A logged value: integers stay integers in JSON ("step": 5), the rest are floats.
using LogValue = std::variant<int64_t, double>;
// One log_history entry, keys in insertion order (JSON output sorts them like HF).
using LogEntry = std::vector<std::pair<std::string, LogValue>>;

double log_value_as_double(const LogValue& v);
// The value of `key` in `entry`; nullopt when absent.
std::optional<double> find_log_value(const LogEntry& entry, const std::string& key);

struct TrainerState {
  double epoch = 0;
  int64_t global_step = 0;
  int64_t max_steps = 0;
  int64_t logging_steps = 500;
  int64_t eval_steps = 500;
  int64_t save_steps = 500;
  std::optional<int64_t> train_batch_size;
  int64_t num_train_epochs = 0;
  int64_t num_input_tokens_seen = 0;
  double total_flos = 0;
  std::vector<LogEntry> log_history;
  std::optional<double> best_metric;
  std::optional<int64_t> best_global_step;
  std::optional<std::string> best_model_checkpoint;
  bool is_local_process_zero = true;
  bool is_world_process_zero = true;
  bool is_hyper_param_search = false;

  std::string to_json() const;  // HF's save_to_json text (ends with a newline)
  static TrainerState from_json(const std::string& text, const std::string& what);  // `what` names the source in errors
  void save(const std::string& path) const;  // durable write (fsync'ed)
  static TrainerState load(const std::string& path);
};

inline constexpr const char* kTrainerStateName = "trainer_state.json";

}  // namespace alpaca::ckpt
