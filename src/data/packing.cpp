// Packing of tokenized examples into model_max_length blocks, TRL's pack_dataset (see packing.h).
#include "alpaca/data/packing.h"

#include <algorithm>
#include <deque>
#include <map>
#include <numeric>

#include "alpaca/data/shuffle.h"
#include "alpaca/util/error.h"
#include "alpaca/util/user_error.h"

namespace alpaca::data {
namespace {

void check_example(const Example& ex, size_t i) {
  ALPACA_CHECK(!ex.input_ids.empty(), "packing: example " << i << " has no tokens");
  ALPACA_CHECK(ex.labels.size() == ex.input_ids.size(), "packing: example " << i << " has mismatched ids and labels");
  ALPACA_CHECK(ex.position_ids.empty(), "packing: example " << i << " is already packed");
}

// Appends the first n tokens of `ex` to `block` as document number `segment` (positions from 0;
// its first label -100: after the causal shift it would be predicted from the previous document).
void append_document(Example& block, const Example& ex, int64_t n, int64_t segment) {
  block.input_ids.insert(block.input_ids.end(), ex.input_ids.begin(), ex.input_ids.begin() + n);
  block.labels.insert(block.labels.end(), ex.labels.begin(), ex.labels.begin() + n);
  block.labels[block.labels.size() - static_cast<size_t>(n)] = kIgnoreIndex;
  for (int64_t t = 0; t < n; ++t) {
    block.position_ids.push_back(t);
    block.segment_ids.push_back(segment);
  }
}

// _pack_bfd over examples [begin, end): lengths cut to block_size, stable sort longest first,
// best fit by the smallest free space that holds the example (TRL's segment tree search), FIFO
// among blocks with that space.
void pack_bfd_batch(const std::vector<Example>& examples, size_t begin, size_t end, int64_t block_size,
                    std::vector<Example>& out, PackingStats& st) {
  std::vector<int64_t> len(end - begin);
  for (size_t i = begin; i < end; ++i) {
    const int64_t n = static_cast<int64_t>(examples[i].input_ids.size());
    st.num_truncated += n > block_size ? 1 : 0;
    len[i - begin] = std::min(n, block_size);
  }
  std::vector<size_t> order(len.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return len[a] > len[b]; });
  std::vector<std::vector<size_t>> bins;
  std::vector<int64_t> used;
  std::map<int64_t, std::deque<size_t>> open;  // free space -> bins with it, in the order they got it
  for (size_t k : order) {
    size_t bin;
    auto it = open.lower_bound(len[k]);
    if (it != open.end()) {
      bin = it->second.front();
      it->second.pop_front();
      if (it->second.empty()) open.erase(it);
    } else {
      bin = bins.size();
      bins.emplace_back();
      used.push_back(0);
    }
    bins[bin].push_back(k);
    used[bin] += len[k];
    if (used[bin] < block_size) open[block_size - used[bin]].push_back(bin);
  }
  for (const auto& b : bins) {
    Example block;
    for (size_t s = 0; s < b.size(); ++s) append_document(block, examples[begin + b[s]], len[b[s]], static_cast<int64_t>(s));
    out.push_back(std::move(block));
  }
}

// _pack_wrapped over examples [begin, end): the concatenation cut every block_size tokens.
void pack_wrapped_batch(const std::vector<Example>& examples, size_t begin, size_t end, int64_t block_size,
                        std::vector<Example>& out) {
  Example cur;
  auto flush = [&] {
    const size_t n = cur.input_ids.size();
    cur.position_ids.resize(n);
    std::iota(cur.position_ids.begin(), cur.position_ids.end(), int64_t{0});
    cur.segment_ids.assign(n, 0);
    out.push_back(std::move(cur));
    cur = Example{};
  };
  for (size_t i = begin; i < end; ++i) {
    const Example& ex = examples[i];
    for (size_t t = 0; t < ex.input_ids.size(); ++t) {
      cur.input_ids.push_back(ex.input_ids[t]);
      cur.labels.push_back(ex.labels[t]);
      if (static_cast<int64_t>(cur.input_ids.size()) == block_size) flush();
    }
  }
  if (!cur.input_ids.empty()) flush();
}

}  // namespace

PackingStrategy parse_packing_strategy(const std::string& name) {
  if (name == "bfd") return PackingStrategy::kBfd;
  if (name == "wrapped") return PackingStrategy::kWrapped;
  ALPACA_USER_CHECK(name != "bfd_split" && name != "bfd-requeue",
                    "--packing_strategy " << name << " (TRL's best-fit decreasing that splits long examples into "
                                          << "several documents) is not implemented; use bfd (TRL's default: long "
                                          << "examples are truncated) or wrapped");
  ALPACA_USER_FAIL("--packing_strategy '" << name << "' is not a packing strategy; give bfd (TRL's default) or wrapped");
}

const char* packing_strategy_name(PackingStrategy strategy) {
  return strategy == PackingStrategy::kBfd ? "bfd" : "wrapped";
}

std::vector<Example> pack_examples(const std::vector<Example>& examples, int64_t block_size, PackingStats* stats,
                                   PackingStrategy strategy) {
  ALPACA_CHECK(block_size > 0, "--model_max_length must be positive for packing, got " << block_size);
  PackingStats st;
  for (size_t i = 0; i < examples.size(); ++i) check_example(examples[i], i);
  std::vector<Example> blocks;
  for (size_t b = 0; b < examples.size(); b += kPackingBatchSize) {
    const size_t e = std::min(examples.size(), b + kPackingBatchSize);
    if (strategy == PackingStrategy::kBfd)
      pack_bfd_batch(examples, b, e, block_size, blocks, st);
    else
      pack_wrapped_batch(examples, b, e, block_size, blocks);
  }
  for (const auto& blk : blocks) st.num_tokens += static_cast<int64_t>(blk.input_ids.size());
  st.num_blocks = static_cast<int64_t>(blocks.size());
  st.fill_ratio = blocks.empty() ? 0.0 : static_cast<double>(st.num_tokens) / (static_cast<double>(st.num_blocks) * block_size);
  if (stats) *stats = st;
  return blocks;
}

std::vector<Example> pack_and_shuffle(std::vector<Example> examples, std::optional<PackingStrategy> packing,
                                      int64_t block_size, PackingStats* stats, std::optional<uint64_t> shuffle_seed) {
  auto shuffle = [&] {
    if (shuffle_seed) examples = datasets_shuffle(examples, *shuffle_seed);
  };
  if (packing) {
    shuffle();
    examples = pack_examples(examples, block_size, stats, *packing);
  }
  shuffle();
  return examples;
}

}  // namespace alpaca::data
