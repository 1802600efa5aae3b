// The decoding defaults a model directory carries in generation_config.json, read the way
// transformers' GenerationConfig.from_pretrained reads them. Fields absent from the file stay
// unset; the caller fills them from its flags or from transformers' own defaults.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace alpaca::generate {

struct GenerationConfig {
  std::optional<bool> do_sample;
  std::optional<double> temperature;
  std::optional<int64_t> top_k;
  std::optional<double> top_p;
  std::optional<double> repetition_penalty;
  std::optional<int64_t> max_new_tokens;
  std::optional<int64_t> max_length;  // counts the prompt, as in transformers
  std::vector<int64_t> eos_token_id;  // an int or a list in the file
  std::optional<int64_t> pad_token_id;
  std::optional<int64_t> bos_token_id;
  // The model directory has the file. transformers then takes eos_token_id from it alone (absent:
  // no early stop); without the file it builds one from config.json.
  bool from_file = false;
  // Fields transformers' generate() acts on that `generate` does not implement, set to values that
  // change the output ("num_beams 4", "min_p 0.05", ...): the caller warns about them.
  std::vector<std::string> unimplemented;
};

// Reads `model_dir`/generation_config.json; a missing file gives an empty config. A malformed file
// or a field of the wrong type is an alpaca::Error naming the file and the field.
GenerationConfig read_generation_config(const std::string& model_dir);
// Same, from text; `source` names it in errors.
GenerationConfig parse_generation_config(const std::string& text, const std::string& source);

}  // namespace alpaca::generate
