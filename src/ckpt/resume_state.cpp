// ResumeState <-> alpaca_resume_state.json. No LibTorch here (the RNG capture is rng_state.cpp), so
// the parse links into the fuzz target alone.
#include "alpaca/ckpt/resume_state.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>  // defines: nlohmann::json

#include "alpaca/ckpt/checkpoint_dir.h"
#include "alpaca/util/error.h"
#include "alpaca/util/file.h"

namespace alpaca::ckpt {
namespace {

// An integer field, strictly: nlohmann's get<int64_t>() of a float such as 1e300 is an undefined
// conversion, and a float step count means the file is not what we wrote.
int64_t int_field(const nlohmann::json& j, const char* key, const std::string& what) {
  const nlohmann::json& v = j.at(key);
  ALPACA_CHECK(v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)),
               what << ": \"" << key << "\" must be an integer, got " << v.dump()
                    << "; the checkpoint is corrupt, resume from an older one");
  return v.get<int64_t>();
}

}  // namespace

std::string ResumeState::to_json() const {
  nlohmann::json j = {
      {"format_version", kResumeStateVersion},
      {"global_step", global_step},
      {"epoch", epoch},
      {"samples_in_epoch", samples_in_epoch},
      {"steps_in_epoch", steps_in_epoch},
      {"seed", seed},
      {"data_seed", data_seed},
      {"world_size", world_size},
      {"global_batch_size", global_batch_size},
      {"scheduler_step", scheduler_step},
      {"num_input_tokens_seen", num_input_tokens_seen},
      {"total_loss_sum", total_loss_sum},
      {"cpu_rng_state", cpu_rng_state},
      {"cuda_rng_states", cuda_rng_states},
      {"model", model},
      {"tokenizer", tokenizer},
  };
  if (!rank_rng_states.empty()) j["rank_rng_states"] = rank_rng_states;
  if (learning_rate) j["learning_rate"] = *learning_rate;
  if (num_tokens) j["num_tokens"] = *num_tokens;
  if (loss_scaler) j["loss_scaler"] = {{"scale", loss_scaler->scale}, {"growth_tracker", loss_scaler->growth_tracker}};
  else j["loss_scaler"] = nullptr;
  if (plateau) {
    auto opt = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(); };
    j["plateau"] = {{"lr", opt(plateau->lr)}, {"best", opt(plateau->best)}, {"num_bad_epochs", plateau->num_bad_epochs},
                    {"cooldown_counter", plateau->cooldown_counter}, {"last_epoch", plateau->last_epoch}};
  }
  return j.dump(2) + "\n";
}

ResumeState ResumeState::from_json(const std::string& text, const std::string& what) {
  ResumeState s;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    const int64_t version = int_field(j, "format_version", what);
    ALPACA_CHECK(version == kResumeStateVersion, what << " has format_version " << version << "; this build reads version "
                                                      << kResumeStateVersion << ". Resume with the alpaca-train that wrote it");
    s.global_step = int_field(j, "global_step", what);
    s.epoch = int_field(j, "epoch", what);
    s.samples_in_epoch = int_field(j, "samples_in_epoch", what);
    s.steps_in_epoch = int_field(j, "steps_in_epoch", what);
    s.seed = int_field(j, "seed", what);
    s.data_seed = int_field(j, "data_seed", what);
    s.world_size = int_field(j, "world_size", what);
    s.global_batch_size = int_field(j, "global_batch_size", what);
    s.scheduler_step = int_field(j, "scheduler_step", what);
    s.num_input_tokens_seen = int_field(j, "num_input_tokens_seen", what);
    s.total_loss_sum = j.at("total_loss_sum").get<double>();
    s.cpu_rng_state = j.at("cpu_rng_state").get<std::string>();
    s.cuda_rng_states = j.at("cuda_rng_states").get<std::vector<std::string>>();
    if (j.contains("rank_rng_states")) s.rank_rng_states = j["rank_rng_states"].get<std::vector<std::string>>();
    s.model = j.at("model").get<Fingerprint>();
    s.tokenizer = j.at("tokenizer").get<Fingerprint>();
    if (j.contains("learning_rate") && !j["learning_rate"].is_null()) s.learning_rate = j["learning_rate"].get<double>();
    if (j.contains("num_tokens") && !j["num_tokens"].is_null()) s.num_tokens = int_field(j, "num_tokens", what);
    if (!j.at("loss_scaler").is_null())
      s.loss_scaler = LossScalerState{j["loss_scaler"].at("scale").get<double>(),
                                      int_field(j["loss_scaler"], "growth_tracker", what)};
    if (j.contains("plateau") && !j["plateau"].is_null()) {
      const auto& p = j["plateau"];
      optim::PlateauState ps;
      if (!p.at("lr").is_null()) ps.lr = p["lr"].get<double>();
      if (!p.at("best").is_null()) ps.best = p["best"].get<double>();
      ps.num_bad_epochs = int_field(p, "num_bad_epochs", what);
      ps.cooldown_counter = int_field(p, "cooldown_counter", what);
      ps.last_epoch = int_field(p, "last_epoch", what);
      s.plateau = ps;
    }
  } catch (const nlohmann::json::exception& e) {
    ALPACA_FAIL(what << " is not a valid resume state (" << e.what() << "); the checkpoint is corrupt, resume from an older one");
  }
  return s;
}

void ResumeState::save(const std::string& path) const { write_file_durable(path, to_json()); }

ResumeState ResumeState::load(const std::string& path) {
  const std::optional<std::string> text = util::read_file(path);
  ALPACA_CHECK(text, "cannot open " << path << "; the checkpoint was not written by alpaca-train (or is incomplete)");
  return from_json(*text, path);
}

std::string fingerprint_mismatch(const std::string& what, const Fingerprint& expected, const Fingerprint& actual) {
  std::ostringstream os;
  for (const auto& [k, v] : expected) {
    auto it = actual.find(k);
    const std::string here = it == actual.end() ? "(absent)" : it->second;
    if (here != v) os << (os.tellp() > 0 ? "; " : "") << k << " is " << v << " in the checkpoint, " << here << " here";
  }
  for (const auto& [k, v] : actual) {
    if (!expected.count(k)) os << (os.tellp() > 0 ? "; " : "") << k << " is (absent) in the checkpoint, " << v << " here";
  }
  if (os.tellp() == 0) return "";
  return "the checkpoint was written with a different " + what + ": " + os.str();
}

}  // namespace alpaca::ckpt
