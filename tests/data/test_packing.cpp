// --packing: blocks of concatenated examples give the same fp32 loss as the examples unpacked
// (within 1e-5), through the real LLaMA model with position and segment ids.
#include <gtest/gtest.h>

#include <iostream>
#include <random>

#include "alpaca/data/collate.h"
#include "alpaca/data/packing.h"
#include "alpaca/model/llama.h"
#include "alpaca/util/error.h"
#include "model_test_util.h"

namespace alpaca::data::test_packing {
namespace {

// Random examples shaped like Alpaca ones: BOS, a masked prompt, then answer labels.
std::vector<Example> random_examples(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Example> out;
  for (int64_t i = 0; i < n; ++i) {
    int64_t len = 4 + static_cast<int64_t>(rng() % 37);
    int64_t prompt = 1 + static_cast<int64_t>(rng() % (len - 1));
    Example ex;
    ex.input_ids.push_back(1);
    for (int64_t t = 1; t < len; ++t) ex.input_ids.push_back(2 + static_cast<int64_t>(rng() % (vocab - 2)));
    ex.labels = ex.input_ids;
    for (int64_t t = 0; t < prompt; ++t) ex.labels[t] = kIgnoreIndex;
    out.push_back(std::move(ex));
  }
  return out;
}

std::vector<Example> small_examples() {
  return {{{1, 5, 6}, {-100, 5, 6}, {}, {}},
          {{1, 7}, {-100, 7}, {}, {}},
          {{1, 8, 9, 10}, {-100, -100, 9, 10}, {}, {}},
          {{1, 11}, {11, 11}, {}, {}}};
}

// Best-fit decreasing (TRL's "bfd"): longest first, each into the block with the least room that
// holds it. Test_conversation_masks checks the same against TRL's pack_dataset on 2,300 rows.
TEST(Packing, BfdBlocksRestartPositionsAndNumberSegments) {
  const auto ex = small_examples();
  PackingStats stats;
  auto blocks = pack_examples(ex, 6, &stats);
  ASSERT_EQ(blocks.size(), 2u);
  // Lengths 3, 2, 4, 2: the 4 opens block 0 (room 2), the 3 does not fit there and opens block 1
  // (room 3), the first 2 fills block 0 exactly, the second 2 goes into block 1.
  EXPECT_EQ(blocks[0].input_ids, (std::vector<int64_t>{1, 8, 9, 10, 1, 7}));
  EXPECT_EQ(blocks[0].position_ids, (std::vector<int64_t>{0, 1, 2, 3, 0, 1}));
  EXPECT_EQ(blocks[0].segment_ids, (std::vector<int64_t>{0, 0, 0, 0, 1, 1}));
  EXPECT_EQ(blocks[1].input_ids, (std::vector<int64_t>{1, 5, 6, 1, 11}));
  EXPECT_EQ(blocks[1].segment_ids, (std::vector<int64_t>{0, 0, 0, 1, 1}));
  // The first label of each example is masked (never predicted from the previous example).
  EXPECT_EQ(blocks[1].labels, (std::vector<int64_t>{-100, 5, 6, -100, 11}));
  EXPECT_EQ(stats.num_blocks, 2);
  EXPECT_EQ(stats.num_tokens, 11);
  EXPECT_EQ(stats.num_truncated, 0);
  int64_t packed_labels = 0, plain_labels = 0;
  for (const auto& b : blocks) packed_labels += count_label_tokens(b);
  for (const auto& e : ex) plain_labels += count_label_tokens(e);
  EXPECT_EQ(packed_labels, plain_labels);
  // Longer than the block: truncated (TRL's bfd keeps the start); empty or packed input: an error.
  auto cut = pack_examples(ex, 3, &stats);
  EXPECT_EQ(stats.num_truncated, 1);
  ASSERT_EQ(cut.size(), 4u);  // lengths 3, 2, 3 (cut), 2: the two 3s first, in dataset order
  EXPECT_EQ(cut[0].input_ids, (std::vector<int64_t>{1, 5, 6}));
  EXPECT_EQ(cut[1].input_ids, (std::vector<int64_t>{1, 8, 9}));
  EXPECT_THROW(pack_examples(blocks, 16), Error);
  EXPECT_THROW(pack_examples({Example{}}, 16), Error);
}

// "wrapped": the concatenation cut every block_size tokens, one segment, labels as they are.
TEST(Packing, WrappedCutsTheConcatenation) {
  PackingStats stats;
  auto blocks = pack_examples(small_examples(), 6, &stats, PackingStrategy::kWrapped);
  ASSERT_EQ(blocks.size(), 2u);
  EXPECT_EQ(blocks[0].input_ids, (std::vector<int64_t>{1, 5, 6, 1, 7, 1}));
  EXPECT_EQ(blocks[0].labels, (std::vector<int64_t>{-100, 5, 6, -100, 7, -100}));
  EXPECT_EQ(blocks[1].input_ids, (std::vector<int64_t>{8, 9, 10, 1, 11}));
  EXPECT_EQ(blocks[1].labels, (std::vector<int64_t>{-100, 9, 10, 11, 11}));
  EXPECT_EQ(blocks[1].position_ids, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(blocks[1].segment_ids, (std::vector<int64_t>(5, 0)));
  EXPECT_EQ(parse_packing_strategy("wrapped"), PackingStrategy::kWrapped);
  EXPECT_EQ(parse_packing_strategy("bfd"), PackingStrategy::kBfd);
}

TEST(Packing, Fp32LossOfPackedEqualsUnpacked) {
  model::LlamaConfig c = alpaca::testing::llama_config({97, 32, 64, 2, 4, 2, 8, 128});
  c.pad_token_id = 0;
  model::LlamaForCausalLM m(c);
  model::init_weights(m, 7);
  at::NoGradGuard no_grad;
  const int64_t pad = 0;

  auto examples = random_examples(40, c.vocab_size, 5);
  PackingStats stats;
  auto blocks = pack_examples(examples, 96, &stats);
  ASSERT_LT(stats.num_blocks, 40);
  ASSERT_GT(stats.num_blocks, 4);

  auto total_loss = [&](const std::vector<Example>& exs, int64_t micro) {
    double sum = 0;
    int64_t tokens = 0;
    for (size_t i = 0; i < exs.size(); i += micro) {
      std::vector<const Example*> mb;
      for (size_t k = i; k < std::min(exs.size(), i + micro); ++k) mb.push_back(&exs[k]);
      Batch b = collate(mb, pad, AttentionMask::kExampleTokens);
      at::Tensor logits = m->forward(b.input_ids_bt, b.attention_mask_bt, b.position_ids_bt,
                                     b.segment_ids_bt);
      model::LossSum ls = model::causal_lm_loss_sum(logits, b.labels_bt);
      EXPECT_EQ(ls.num_tokens, b.num_label_tokens);
      sum += ls.sum.item<double>();
      tokens += ls.num_tokens;
    }
    return std::make_pair(sum / tokens, tokens);
  };
  auto [unpacked, unpacked_tokens] = total_loss(examples, 4);
  auto [packed, packed_tokens] = total_loss(blocks, 3);
  EXPECT_EQ(packed_tokens, unpacked_tokens);
  EXPECT_NEAR(packed, unpacked, 1e-5) << "packed " << packed << " unpacked " << unpacked;
  std::cout << "packing: " << examples.size() << " examples -> " << stats.num_blocks
            << " blocks (fill " << stats.fill_ratio << "), loss packed " << packed
            << " unpacked " << unpacked << " |diff| " << std::abs(packed - unpacked) << "\n";
}

}  // namespace
}  // namespace alpaca::data::test_packing
