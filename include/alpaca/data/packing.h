// --packing: several tokenized examples in one sequence of at most model_max_length tokens, built
// as TRL 1.16's pack_dataset does (SFTTrainer with packing=True; trl/data_utils.py):
//
//  - "bfd" (TRL's default, best-fit decreasing, _pack_bfd with "truncate"): per batch of 1000
//    examples (datasets.map's batch size; SFTTrainer passes no other), each example longer than the
//    block is cut to its first block_size tokens; the batch's examples, longest first (ties in
//    dataset order: a stable sort), each go into the open block whose free space is the smallest
//    that fits them (among equal spaces the block that reached it first), else a new block. Blocks
//    are in the order they were opened, examples in each in the order they went in. Documents stay
//    whole: position ids restart at 0 and segment ids number the documents (TRL's seq_lengths ->
//    position_ids, padding-free), and the first label of every document is -100 (the collator's
//    labels[position_ids == 0] = -100) so no token is predicted from the previous document. Loss
//    over packed blocks therefore equals the unpacked loss.
//  - "wrapped" (_pack_wrapped): per batch of 1000 examples, the concatenation cut every block_size
//    tokens (the batch's last block shorter), across document boundaries; one segment per block,
//    positions 0..n-1 and the labels as they are (TRL's collator without padding_free): attention
//    and prediction cross documents, as TRL's.
//  - "bfd_split" (TRL's third strategy) is refused by name.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "alpaca/data/alpaca_example.h"

namespace alpaca::data {

enum class PackingStrategy { kBfd, kWrapped };

// "bfd" / "wrapped" (TRL's SFTConfig.packing_strategy names); "bfd_split" and anything else is an
// error naming the value and the strategies known.
PackingStrategy parse_packing_strategy(const std::string& name);
const char* packing_strategy_name(PackingStrategy strategy);

// TRL's pack_dataset batch size (datasets.map(batched=True) default).
inline constexpr size_t kPackingBatchSize = 1000;

struct PackingStats {
  int64_t num_blocks = 0;
  int64_t num_tokens = 0;       // real tokens over all blocks
  int64_t num_truncated = 0;    // bfd: examples cut to block_size
  double fill_ratio = 0.0;      // num_tokens / (num_blocks * block_size)
};

// The blocks of `examples` (see above). Throws if an example is empty (TRL drops those silently;
// ours never are: an empty row is an error when it is tokenized), has ids and labels of different
// lengths, or is already packed.
std::vector<Example> pack_examples(const std::vector<Example>& examples, int64_t block_size,
                                   PackingStats* stats = nullptr,
                                   PackingStrategy strategy = PackingStrategy::kBfd);

// The end of TRL SFTTrainer._prepare_dataset: with `shuffle_seed` (SFTConfig.shuffle_dataset with
// args.seed), datasets' shuffle (shuffle.h) before packing and after; with `packing`, pack_examples.
std::vector<Example> pack_and_shuffle(std::vector<Example> examples, std::optional<PackingStrategy> packing,
                                      int64_t block_size, PackingStats* stats, std::optional<uint64_t> shuffle_seed);

}  // namespace alpaca::data
