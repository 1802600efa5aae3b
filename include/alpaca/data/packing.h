// --packing: several tokenized examples concatenated into one sequence of at most
// model_max_length tokens. Position ids restart at 0 for every example and segment ids number
// the examples inside a block, so attention (the model masks across segments) and RoPE see each
// example exactly as if it were alone; the first label of every example is -100 so no token is
// predicted from the previous example. Loss over packed blocks therefore equals the unpacked loss.
#pragma once

#include <cstdint>
#include <vector>

#include "alpaca/data/alpaca_example.h"

namespace alpaca::data {

struct PackingStats {
  int64_t num_blocks = 0;
  int64_t num_tokens = 0;       // real tokens over all blocks
  double fill_ratio = 0.0;      // num_tokens / (num_blocks * block_size)
};

// Greedy in dataset order: an example goes into the current block if it fits, else it starts a
// new block; examples are never split. Throws if an example is longer than `block_size` (pack
// with the model_max_length used for tokenization) or is empty.
std::vector<Example> pack_examples(const std::vector<Example>& examples, int64_t block_size,
                                   PackingStats* stats = nullptr);

}  // namespace alpaca::data
