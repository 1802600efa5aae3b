// Turning Alpaca records into training examples exactly as stanford_alpaca's train.py does:
// the two prompt templates, target = output + EOS, labels = ids with the prompt positions set to
// -100, right truncation to model_max_length (both the full text and the prompt alone).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "alpaca/data/alpaca_record.h"
#include "alpaca/tokenizer/tokenizer.h"

namespace alpaca::data {

inline constexpr int64_t kIgnoreIndex = -100;

// One training sequence. position_ids/segment_ids are empty except for packed examples.
struct Example {
  std::vector<int64_t> input_ids;
  std::vector<int64_t> labels;        // kIgnoreIndex on prompt positions
  std::vector<int64_t> position_ids;  // packing only: restarts at 0 for every example
  std::vector<int64_t> segment_ids;   // packing only: 0, 1, 2, ... per packed example
};

// PROMPT_DICT["prompt_input"] when `input` is non-empty, else "prompt_no_input" (train.py).
std::string format_alpaca_prompt(const AlpacaRecord& record);

struct TokenizeStats {
  int64_t num_truncated = 0;       // full text longer than model_max_length
  int64_t num_no_label_tokens = 0; // every label is -100 (prompt alone fills the window)
};

// Tokenizes every record (train.py's preprocess). `num_threads` <= 0 uses every core.
// Runs tokenizer.check_special_tokens() first: a split EOS stops here, before any output.
// Example i corresponds to record i. `stats`, when given, receives truncation counts.
std::vector<Example> tokenize_alpaca(const std::vector<AlpacaRecord>& records,
                                     const tokenizer::Tokenizer& tokenizer, int64_t model_max_length,
                                     int num_threads = 0, TokenizeStats* stats = nullptr);

}  // namespace alpaca::data
