#include "alpaca/generate/generation_config.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>  // defines: nlohmann::json

#include "alpaca/util/error.h"

namespace alpaca::generate {
namespace {

using nlohmann::json;

template <typename T>
std::optional<T> field(const json& j, const char* name, const std::string& source) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return std::nullopt;
  try {
    if constexpr (std::is_same_v<T, bool>) {
      ALPACA_CHECK(it->is_boolean(), "not a boolean");
    } else if constexpr (std::is_integral_v<T>) {
      ALPACA_CHECK(it->is_number_integer(), "not an integer");
    } else {
      ALPACA_CHECK(it->is_number(), "not a number");
    }
    return it->get<T>();
  } catch (const std::exception&) {
    ALPACA_FAIL(source << ": field \"" << name << "\" has the wrong type (" << it->dump()
                       << "); fix or delete the field");
  }
}

}  // namespace

GenerationConfig parse_generation_config(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    ALPACA_FAIL(source << " is not valid JSON: " << e.what());
  }
  ALPACA_CHECK(j.is_object(), source << " must hold a JSON object");
  GenerationConfig c;
  // transformers 5's GenerationConfig fields that change decoding, each with the value(s) that
  // leave it off; anything else is named in `unimplemented`.
  static const std::vector<std::pair<const char*, std::vector<json>>> kOff = {
      {"num_beams", {1}}, {"num_beam_groups", {1}}, {"penalty_alpha", {0}}, {"min_p", {0}}, {"typical_p", {1}},
      {"epsilon_cutoff", {0}}, {"eta_cutoff", {0}}, {"no_repeat_ngram_size", {0}}, {"min_new_tokens", {0}},
      {"min_length", {0}}, {"encoder_repetition_penalty", {1}}, {"bad_words_ids", {}}, {"suppress_tokens", {}},
      {"begin_suppress_tokens", {}}, {"forced_bos_token_id", {}}, {"forced_eos_token_id", {}},
      {"renormalize_logits", {false}}, {"sequence_bias", {}}, {"guidance_scale", {1}}, {"diversity_penalty", {0}},
      {"stop_strings", {}}, {"exponential_decay_length_penalty", {}}, {"dola_layers", {}},
      {"prompt_lookup_num_tokens", {}}, {"watermarking_config", {}}, {"top_h", {}}};
  for (const auto& [key, off] : kOff) {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null() || (it->is_array() && it->empty()) || (it->is_object() && it->empty())) continue;
    bool is_off = false;
    for (const json& v : off) is_off = is_off || (it->is_number() && v.is_number() ? it->get<double>() == v.get<double>() : *it == v);
    if (!is_off) c.unimplemented.push_back(std::string(key) + " " + it->dump());
  }
  c.do_sample = field<bool>(j, "do_sample", source);
  c.temperature = field<double>(j, "temperature", source);
  c.top_k = field<int64_t>(j, "top_k", source);
  c.top_p = field<double>(j, "top_p", source);
  c.repetition_penalty = field<double>(j, "repetition_penalty", source);
  c.max_new_tokens = field<int64_t>(j, "max_new_tokens", source);
  c.max_length = field<int64_t>(j, "max_length", source);
  c.pad_token_id = field<int64_t>(j, "pad_token_id", source);
  c.bos_token_id = field<int64_t>(j, "bos_token_id", source);
  if (auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
    if (it->is_number_integer()) {
      c.eos_token_id.push_back(it->get<int64_t>());
    } else {
      ALPACA_CHECK(it->is_array(), source << ": \"eos_token_id\" must be an integer or a list of integers");
      for (const json& e : *it) {
        ALPACA_CHECK(e.is_number_integer(), source << ": \"eos_token_id\" must be an integer or a list of integers");
        c.eos_token_id.push_back(e.get<int64_t>());
      }
    }
  }
  return c;
}

GenerationConfig read_generation_config(const std::string& model_dir) {
  const std::filesystem::path path = std::filesystem::path(model_dir) / "generation_config.json";
  if (!std::filesystem::exists(path)) return {};
  std::ifstream f(path);
  ALPACA_CHECK(f, "cannot read " << path.string());
  std::stringstream ss;
  ss << f.rdbuf();
  GenerationConfig c = parse_generation_config(ss.str(), path.string());
  c.from_file = true;
  return c;
}

}  // namespace alpaca::generate
