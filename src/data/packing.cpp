// Greedy packing of tokenized examples into model_max_length blocks (see packing.h).
#include "alpaca/data/packing.h"

#include "alpaca/util/error.h"

namespace alpaca::data {

std::vector<Example> pack_examples(const std::vector<Example>& examples, int64_t block_size,
                                   PackingStats* stats) {
  ALPACA_CHECK(block_size > 0, "--model_max_length must be positive for packing, got "
                                   << block_size);
  std::vector<Example> blocks;
  Example cur;
  int64_t segment = 0;
  int64_t tokens = 0;
  auto flush = [&] {
    if (cur.input_ids.empty()) return;
    blocks.push_back(std::move(cur));
    cur = Example{};
    segment = 0;
  };
  for (size_t i = 0; i < examples.size(); ++i) {
    const Example& ex = examples[i];
    const int64_t n = static_cast<int64_t>(ex.input_ids.size());
    ALPACA_CHECK(n > 0, "packing: example " << i << " has no tokens");
    ALPACA_CHECK(ex.labels.size() == ex.input_ids.size(),
                 "packing: example " << i << " has mismatched ids and labels");
    ALPACA_CHECK(ex.position_ids.empty(), "packing: example " << i << " is already packed");
    ALPACA_CHECK(n <= block_size, "packing: example " << i << " has " << n
                                                      << " tokens, more than the block size "
                                                      << block_size
                                                      << "; tokenize with the same "
                                                         "--model_max_length");
    if (static_cast<int64_t>(cur.input_ids.size()) + n > block_size) flush();
    cur.input_ids.insert(cur.input_ids.end(), ex.input_ids.begin(), ex.input_ids.end());
    cur.labels.insert(cur.labels.end(), ex.labels.begin(), ex.labels.end());
    // After the causal shift this label would be predicted from the previous example's last
    // token; unpacked, the first label is never used, so masking it keeps the two identical.
    cur.labels[cur.labels.size() - n] = kIgnoreIndex;
    for (int64_t t = 0; t < n; ++t) {
      cur.position_ids.push_back(t);
      cur.segment_ids.push_back(segment);
    }
    ++segment;
    tokens += n;
  }
  flush();
  if (stats) {
    stats->num_blocks = static_cast<int64_t>(blocks.size());
    stats->num_tokens = tokens;
    stats->fill_ratio = blocks.empty() ? 0.0
                                       : static_cast<double>(tokens) /
                                             (static_cast<double>(blocks.size()) * block_size);
  }
  return blocks;
}

}  // namespace alpaca::data
