// A tiny LLaMA (init-model, the real LLaMA-2 tokenizer, so [PAD] is added as in train.py) and
// Alpaca data whose every example is longer than the sequence limit, so each micro-batch is
// exactly micro x model_max_length tokens: the case the memory planner assumes.
#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "test_util.h"

namespace alpaca::testing {

inline std::filesystem::path tokenizer_model() {
  return shared_dir() / "data" / "llama2-tokenizer" / "tokenizer.model";
}

// Writes <dir>/model (config.json, weights, tokenizer.model) and <dir>/data.json.
inline std::string make_memory_fixture(const std::filesystem::path& dir, int64_t hidden = 128, int64_t layers = 2,
                                       int num_examples = 32) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  const nlohmann::json cfg = {{"model_type", "llama"}, {"vocab_size", 32000}, {"hidden_size", hidden},
                              {"intermediate_size", hidden * 8 / 3}, {"num_hidden_layers", layers},
                              {"num_attention_heads", 4}, {"num_key_value_heads", 4},
                              {"max_position_embeddings", 512}, {"rms_norm_eps", 1e-5},
                              {"tie_word_embeddings", false}, {"bos_token_id", 1}, {"eos_token_id", 2}};
  std::ofstream(dir / "config.json") << cfg.dump();
  std::string log;
  if (run_command(train_bin() + " init-model --config " + (dir / "config.json").string() + " --output_dir " +
                      (dir / "model").string() + " --seed 7",
                  &log) != 0)
    return "init-model failed: " + log;
  fs::copy_file(tokenizer_model(), dir / "model" / "tokenizer.model", fs::copy_options::overwrite_existing);
  nlohmann::json data = nlohmann::json::array();
  std::string text;
  for (int i = 0; i < 40; ++i) text += "the quick brown fox jumps over the lazy dog number " + std::to_string(i) + ". ";
  for (int i = 0; i < num_examples; ++i)
    data.push_back({{"instruction", "Repeat the sentence " + std::to_string(i) + "."}, {"input", ""}, {"output", text}});
  std::ofstream(dir / "data.json") << data.dump();
  return "";
}

}  // namespace alpaca::testing
