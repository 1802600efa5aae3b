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
