#include "alpaca/ckpt/trainer_state.h"

#include <fstream>
#include <nlohmann/json.hpp>  // defines: nlohmann::json

#include "alpaca/ckpt/checkpoint_dir.h"
#include "alpaca/util/error.h"
#include "alpaca/util/file.h"

namespace alpaca::ckpt {
namespace {

nlohmann::json to_json_value(const LogValue& v) {
  if (std::holds_alternative<int64_t>(v)) return std::get<int64_t>(v);
  return std::get<double>(v);
}

template <typename T>
nlohmann::json opt(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

// An integer field, strictly: nlohmann's get<int64_t>() of a float such as 1e300 is an undefined
// conversion, and a float step count means the file is not what we wrote.
int64_t int_field(const nlohmann::json& j, const char* key, int64_t fallback, const std::string& what) {
  if (!j.contains(key)) return fallback;
  const nlohmann::json& v = j.at(key);
  ALPACA_CHECK(v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)),
               what << ": \"" << key << "\" must be an integer, got " << v.dump()
                    << "; the checkpoint is corrupt, resume from an older one");
  return v.get<int64_t>();
}

}  // namespace

double log_value_as_double(const LogValue& v) {
  return std::holds_alternative<int64_t>(v) ? static_cast<double>(std::get<int64_t>(v)) : std::get<double>(v);
}

std::optional<double> find_log_value(const LogEntry& entry, const std::string& key) {
  for (const auto& [k, v] : entry)
    if (k == key) return log_value_as_double(v);
  return std::nullopt;
}

std::string TrainerState::to_json() const {
  nlohmann::json history = nlohmann::json::array();
  for (const auto& entry : log_history) {
    nlohmann::json e = nlohmann::json::object();
    for (const auto& [k, v] : entry) e[k] = to_json_value(v);
    history.push_back(std::move(e));
  }
  // nlohmann::json objects are std::map-backed: keys come out sorted, as HF's sort_keys=True.
  nlohmann::json j = {
      {"epoch", epoch},
      {"global_step", global_step},
      {"max_steps", max_steps},
      {"logging_steps", logging_steps},
      {"eval_steps", eval_steps},
      {"save_steps", save_steps},
      {"train_batch_size", opt(train_batch_size)},
      {"num_train_epochs", num_train_epochs},
      {"num_input_tokens_seen", num_input_tokens_seen},
      {"total_flos", total_flos},
      {"log_history", history},
      {"best_metric", opt(best_metric)},
      {"best_global_step", opt(best_global_step)},
      {"best_model_checkpoint", opt(best_model_checkpoint)},
      {"is_local_process_zero", is_local_process_zero},
      {"is_world_process_zero", is_world_process_zero},
      {"is_hyper_param_search", is_hyper_param_search},
      {"trial_name", nullptr},
      {"trial_params", nullptr},
      {"stateful_callbacks", nlohmann::json::object()},
  };
  return j.dump(2) + "\n";
}

TrainerState TrainerState::from_json(const std::string& text, const std::string& what) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    ALPACA_FAIL(what << " is not valid JSON: " << e.what() << "; the checkpoint is corrupt, resume from an older one");
  }
  ALPACA_CHECK(j.is_object(), what << " must hold a JSON object");
  TrainerState s;
  try {
    s.epoch = j.value("epoch", 0.0);
    ALPACA_CHECK(j.contains("global_step"), what << " has no \"global_step\"; the checkpoint is corrupt, resume from an older one");
    s.global_step = int_field(j, "global_step", 0, what);
    s.max_steps = int_field(j, "max_steps", 0, what);
    s.logging_steps = int_field(j, "logging_steps", 500, what);
    s.eval_steps = int_field(j, "eval_steps", 500, what);
    s.save_steps = int_field(j, "save_steps", 500, what);
    if (j.contains("train_batch_size") && !j["train_batch_size"].is_null())
      s.train_batch_size = int_field(j, "train_batch_size", 0, what);
    s.num_train_epochs = int_field(j, "num_train_epochs", 0, what);
    s.num_input_tokens_seen = int_field(j, "num_input_tokens_seen", 0, what);
    s.total_flos = j.value("total_flos", 0.0);
    if (j.contains("best_metric") && !j["best_metric"].is_null()) s.best_metric = j["best_metric"].get<double>();
    if (j.contains("best_global_step") && !j["best_global_step"].is_null())
      s.best_global_step = int_field(j, "best_global_step", 0, what);
    if (j.contains("best_model_checkpoint") && !j["best_model_checkpoint"].is_null())
      s.best_model_checkpoint = j["best_model_checkpoint"].get<std::string>();
    s.is_local_process_zero = j.value("is_local_process_zero", true);
    s.is_world_process_zero = j.value("is_world_process_zero", true);
    s.is_hyper_param_search = j.value("is_hyper_param_search", false);
    for (const auto& e : j.value("log_history", nlohmann::json::array())) {
      LogEntry entry;
      for (const auto& [k, v] : e.items()) {
        if (v.is_number_integer()) entry.emplace_back(k, v.get<int64_t>());
        else if (v.is_number()) entry.emplace_back(k, v.get<double>());
        // Non-numeric entries (none written by us) are dropped rather than guessed at.
      }
      s.log_history.push_back(std::move(entry));
    }
  } catch (const nlohmann::json::exception& e) {
    ALPACA_FAIL(what << ": " << e.what() << "; the checkpoint is corrupt, resume from an older one");
  }
  return s;
}

void TrainerState::save(const std::string& path) const { write_file_durable(path, to_json()); }

TrainerState TrainerState::load(const std::string& path) {
  const std::optional<std::string> text = util::read_file(path);
  ALPACA_CHECK(text, "cannot open " << path << "; is this a checkpoint directory written by alpaca-train or HF Trainer?");
  return from_json(*text, path);
}

}  // namespace alpaca::ckpt
