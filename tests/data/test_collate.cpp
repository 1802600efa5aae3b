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

TEST(Collate, RejectsBadInput) {
  EXPECT_THROW(collate({}, 0, AttentionMask::kNotPadId), Error);
  Example empty;
  EXPECT_THROW(collate({&empty}, 0, AttentionMask::kNotPadId), Error);
  Example mismatch{{1, 2}, {-100}, {}, {}};
  EXPECT_THROW(collate({&mismatch}, 0, AttentionMask::kNotPadId), Error);
}

}  // namespace
}  // namespace alpaca::data::test_collate
