// The collator: right padding to the longest example, -100 labels, attention mask, label count.
#include <gtest/gtest.h>

#include "alpaca/data/collate.h"
#include "alpaca/util/error.h"

namespace alpaca::data::test_collate {
namespace {

TEST(Collate, RightPadsToLongest) {
  Example a{{1, 5, 6, 7}, {-100, -100, 6, 7}, {}, {}};
  Example b{{1, 9}, {-100, 9}, {}, {}};
  Batch batch = collate({&a, &b}, 32000, AttentionMask::kNotPadId);
  ASSERT_EQ(batch.input_ids_bt.sizes(), (at::IntArrayRef{2, 4}));
  EXPECT_TRUE(batch.input_ids_bt.equal(at::tensor({1, 5, 6, 7, 1, 9, 32000, 32000}, at::kLong).view({2, 4})));
  EXPECT_TRUE(batch.labels_bt.equal(
      at::tensor({-100, -100, 6, 7, -100, 9, -100, -100}, at::kLong).view({2, 4})));
  EXPECT_TRUE(batch.attention_mask_bt.equal(
      at::tensor({1, 1, 1, 1, 1, 1, 0, 0}, at::kLong).view({2, 4}).to(at::kBool)));
  EXPECT_FALSE(batch.position_ids_bt.defined());
  EXPECT_FALSE(batch.segment_ids_bt.defined());
  // labels[:, 1:] != -100: a has 2, b has 1.
  EXPECT_EQ(batch.num_label_tokens, 3);
  EXPECT_EQ(batch.num_label_tokens,
            batch.labels_bt.slice(1, 1).ne(kIgnoreIndex).sum().item<int64_t>());
}

// A pad id inside an example: train.py's mask (ids != pad) hides it, TRL's (every example token) keeps it;
// the padding after the example is masked by both.
TEST(Collate, PadIdInsideTheTextIsMaskedByTrainPyRuleOnly) {
  Example a{{1, 5, 2, 7, 2}, {-100, -100, 2, 7, 2}, {}, {}};
  Example b{{1, 9}, {-100, 9}, {}, {}};
  const Batch train_py = collate({&a, &b}, 2, AttentionMask::kNotPadId);
  EXPECT_TRUE(train_py.attention_mask_bt.equal(
      at::tensor({1, 1, 0, 1, 0, 1, 1, 0, 0, 0}, at::kLong).view({2, 5}).to(at::kBool)));
  const Batch trl = collate({&a, &b}, 2, AttentionMask::kExampleTokens);
  EXPECT_TRUE(trl.attention_mask_bt.equal(
      at::tensor({1, 1, 1, 1, 1, 1, 1, 0, 0, 0}, at::kLong).view({2, 5}).to(at::kBool)));
  EXPECT_TRUE(trl.input_ids_bt.equal(train_py.input_ids_bt));
  EXPECT_TRUE(trl.labels_bt.equal(train_py.labels_bt));
}

TEST(Collate, PackedCarriesPositionsAndSegments) {
  Example p{{1, 5, 1, 6, 7}, {-100, 5, -100, 6, 7}, {0, 1, 0, 1, 2}, {0, 0, 1, 1, 1}};
  Example q{{1, 8}, {-100, 8}, {0, 1}, {0, 0}};
  Batch batch = collate({&p, &q}, 0, AttentionMask::kNotPadId);
  EXPECT_TRUE(batch.position_ids_bt.equal(
      at::tensor({0, 1, 0, 1, 2, 0, 1, 0, 0, 0}, at::kLong).view({2, 5})));
  EXPECT_TRUE(batch.segment_ids_bt.equal(
      at::tensor({0, 0, 1, 1, 1, 0, 0, -1, -1, -1}, at::kLong).view({2, 5})));
  EXPECT_EQ(batch.num_label_tokens, 4);
  Example plain{{1, 2}, {-100, 2}, {}, {}};
  EXPECT_THROW(collate({&p, &plain}, 0, AttentionMask::kNotPadId), Error);
}

// TRL's pad_to_multiple_of: the batch length rounds up to the multiple; the extra positions are
// padding (pad id, -100, masked; packed: position 0, segment -1); a length already a multiple stays.
TEST(Collate, PadToMultipleOfRoundsTheBatchLengthUp) {
  Example a{{1, 5, 6, 7, 8}, {-100, -100, 6, 7, 8}, {}, {}};
  Example b{{1, 9}, {-100, 9}, {}, {}};
  const Batch batch = collate({&a, &b}, 0, AttentionMask::kExampleTokens, 4);
  ASSERT_EQ(batch.input_ids_bt.sizes(), (at::IntArrayRef{2, 8}));
  EXPECT_TRUE(batch.input_ids_bt.equal(at::tensor({1, 5, 6, 7, 8, 0, 0, 0, 1, 9, 0, 0, 0, 0, 0, 0}, at::kLong).view({2, 8})));
  EXPECT_TRUE(batch.labels_bt.slice(1, 5).eq(kIgnoreIndex).all().item<bool>());
  EXPECT_EQ(batch.attention_mask_bt.sum().item<int64_t>(), 7);
  EXPECT_EQ(batch.num_label_tokens, 4);
  EXPECT_EQ(collate({&a, &b}, 0, AttentionMask::kExampleTokens, 5).input_ids_bt.size(1), 5);
  EXPECT_EQ(collate({&a, &b}, 0, AttentionMask::kExampleTokens, 1).input_ids_bt.size(1), 5);
  EXPECT_EQ(collate({&a, &b}, 0, AttentionMask::kExampleTokens, 64).input_ids_bt.size(1), 64);

  Example p{{1, 5, 1, 6, 7}, {-100, 5, -100, 6, 7}, {0, 1, 0, 1, 2}, {0, 0, 1, 1, 1}};
  const Batch packed = collate({&p}, 0, AttentionMask::kExampleTokens, 8);
  EXPECT_TRUE(packed.position_ids_bt.equal(at::tensor({0, 1, 0, 1, 2, 0, 0, 0}, at::kLong).view({1, 8})));
  EXPECT_TRUE(packed.segment_ids_bt.equal(at::tensor({0, 0, 1, 1, 1, -1, -1, -1}, at::kLong).view({1, 8})));
  EXPECT_THROW(collate({&a}, 0, AttentionMask::kExampleTokens, 0), Error);
}

// The counts HF and TRL log. Rows as collated: the attention mask's tokens and input_ids' elements.
// TRL's padding-free (bfd) collator: the micro-batch concatenated into one row padded to the
// multiple, no mask: its length for num_tokens and "all", its ids != pad id for "non_padding".
TEST(Collate, TokenCountsOfRowsAndOfThePaddingFreeRow) {
  Example a{{1, 5, 6, 7, 8}, {-100, -100, 6, 7, 8}, {}, {}};
  Example b{{1, 9}, {-100, 9}, {}, {}};
  const Batch rows = collate({&a, &b}, 0, AttentionMask::kExampleTokens, 4);
  const TokenCounts r = token_counts(rows, 0, 4, /*padding_free=*/false);
  EXPECT_EQ(r.attended, 7);
  EXPECT_EQ(r.non_padding, 7);
  EXPECT_EQ(r.elements, 16);

  // Two packed rows of 5 and 3 tokens, the pad id (2) also ending each document (TRL pads with eos).
  Example p{{1, 5, 2, 6, 2}, {-100, 5, 2, 6, 2}, {0, 1, 2, 0, 1}, {0, 0, 0, 1, 1}};
  Example q{{1, 8, 2}, {-100, 8, 2}, {0, 1, 2}, {0, 0, 0}};
  const Batch packed = collate({&p, &q}, 2, AttentionMask::kExampleTokens, 4);
  const TokenCounts f = token_counts(packed, 2, 4, /*padding_free=*/true);
  EXPECT_EQ(f.attended, 8);      // 5 + 3 tokens, already a multiple of 4
  EXPECT_EQ(f.elements, 8);
  EXPECT_EQ(f.non_padding, 5);   // the three eos (= pad) tokens are not counted, as HF counts them
  EXPECT_EQ(token_counts(packed, 2, 3, true).attended, 9);
  EXPECT_EQ(token_counts(packed, 2, 1, true).attended, 8);
  const TokenCounts w = token_counts(packed, 2, 4, /*padding_free=*/false);  // wrapped packing keeps the mask
  EXPECT_EQ(w.attended, 8);
  EXPECT_EQ(w.elements, 16);
  EXPECT_EQ(round_up_to_multiple(0, 8), 0);
  EXPECT_EQ(round_up_to_multiple(9, 8), 16);
  EXPECT_THROW(round_up_to_multiple(3, 0), Error);
}

TEST(Collate, RejectsBadInput) {
  EXPECT_THROW(collate({}, 0, AttentionMask::kNotPadId), Error);
  Example empty;
  EXPECT_THROW(collate({&empty}, 0, AttentionMask::kNotPadId), Error);
  Example mismatch{{1, 2}, {-100}, {}, {}};
  EXPECT_THROW(collate({&mismatch}, 0, AttentionMask::kNotPadId), Error);
}

}  // namespace
}  // namespace alpaca::data::test_collate
