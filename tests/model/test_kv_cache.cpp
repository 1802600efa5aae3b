// The KV-cache forward (generation) against the full forward: prefill plus decode steps must give
// the logits of one forward over the whole sequence (1e-5 abs in fp32), unpadded, left-padded
// (transformers' generate masks and positions) and right-padded (continuing after the padding
// with positions counted over real tokens gives the unpadded sequence's logits).
#include <gtest/gtest.h>

#include "alpaca/model/kv_cache.h"
#include "alpaca/model/llama.h"
#include "model_test_util.h"

namespace test_kv_cache {

using namespace alpaca::model;

namespace {

LlamaConfig tiny(int64_t kv_heads) {
  LlamaConfig c = alpaca::testing::llama_config({64, 32, 48, 2, 4, kv_heads, 8, 64});
  c.initializer_range = 0.2;
  c.pad_token_id = 0;
  return c;
}

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

class KvCacheTest : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override {
    m_ = LlamaForCausalLM(tiny(GetParam()));
    init_weights(m_, 7);
    m_->eval();
  }
  LlamaForCausalLM m_{nullptr};
  at::NoGradGuard no_grad_;
};

TEST_P(KvCacheTest, PrefillThenStepsEqualsFullForward) {
  at::manual_seed(1);
  at::Tensor ids = at::randint(3, 64, {2, 10}, at::kLong);
  at::Tensor full_btv = m_->forward(ids);
  KvCache cache(m_->config(), 2, 16, at::kFloat);
  at::Tensor logits = m_->forward_cached(ids.narrow(1, 0, 6), cache);
  EXPECT_LE(max_diff(logits, full_btv.select(1, 5)), 1e-5);
  // A chunk of 2 after cached positions (needs the offset causal mask), then single steps.
  logits = m_->forward_cached(ids.narrow(1, 6, 2), cache);
  EXPECT_LE(max_diff(logits, full_btv.select(1, 7)), 1e-5);
  for (int64_t t = 8; t < 10; ++t) {
    logits = m_->forward_cached(ids.narrow(1, t, 1), cache);
    EXPECT_LE(max_diff(logits, full_btv.select(1, t)), 1e-5) << "position " << t;
  }
  EXPECT_EQ(cache.length(), 10);
}

TEST_P(KvCacheTest, LeftPaddedBatchMatchesEachSequenceAlone) {
  at::manual_seed(2);
  at::Tensor ids = at::randint(3, 64, {2, 9}, at::kLong);
  at::Tensor mask = at::ones({2, 9}, at::kLong);
  mask.select(0, 1).narrow(0, 0, 3).zero_();  // row 1: 3 pads on the left
  ids.select(0, 1).narrow(0, 0, 3).fill_(0);
  // transformers' _prepare_position_ids_for_generation.
  at::Tensor pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0);
  KvCache cache(m_->config(), 2, 12, at::kFloat);
  at::Tensor logits = m_->forward_cached(ids.narrow(1, 0, 6), cache, mask.narrow(1, 0, 6), pos.narrow(1, 0, 6));
  at::Tensor step_logits = m_->forward_cached(ids.narrow(1, 6, 3), cache, mask, pos.narrow(1, 6, 3));
  for (int64_t r = 0; r < 2; ++r) {
    const int64_t pad = r == 0 ? 0 : 3;
    at::Tensor alone = m_->forward(ids.narrow(0, r, 1).narrow(1, pad, 9 - pad));  // (1, 9 - pad, V)
    EXPECT_LE(max_diff(step_logits[r], alone[0][8 - pad]), 1e-5) << "row " << r;
    EXPECT_LE(max_diff(logits[r], alone[0][5 - pad]), 1e-5) << "row " << r;
  }
  // A decode step with a fully real new column.
  at::Tensor next = at::randint(3, 64, {2, 1}, at::kLong);
  at::Tensor mask2 = at::cat({mask, at::ones({2, 1}, at::kLong)}, 1);
  at::Tensor pos2 = pos.narrow(1, 8, 1) + 1;
  at::Tensor out = m_->forward_cached(next, cache, mask2, pos2);
  at::Tensor alone1 = m_->forward(at::cat({ids.narrow(0, 1, 1).narrow(1, 3, 6), next.narrow(0, 1, 1)}, 1));
  EXPECT_LE(max_diff(out[1], alone1[0][6]), 1e-5);
}

TEST_P(KvCacheTest, RightPaddedBatchContinuesAfterThePadding) {
  at::manual_seed(3);
  at::Tensor ids = at::randint(3, 64, {2, 7}, at::kLong);
  at::Tensor mask = at::ones({2, 7}, at::kLong);
  mask.select(0, 0).narrow(0, 4, 3).zero_();  // row 0: 4 real tokens, 3 pads on the right
  ids.select(0, 0).narrow(0, 4, 3).fill_(0);
  at::Tensor pos = (mask.cumsum(-1) - 1).clamp_min(0);
  KvCache cache(m_->config(), 2, 10, at::kFloat);
  at::Tensor last = at::tensor({3, 6}, at::kLong);
  at::Tensor logits = m_->forward_cached(ids, cache, mask, pos, last);
  at::Tensor alone0 = m_->forward(ids.narrow(0, 0, 1).narrow(1, 0, 4));
  at::Tensor alone1 = m_->forward(ids.narrow(0, 1, 1));
  EXPECT_LE(max_diff(logits[0], alone0[0][3]), 1e-5);
  EXPECT_LE(max_diff(logits[1], alone1[0][6]), 1e-5);
  // The next token of row 0 goes after its padding, at position 4.
  at::Tensor next = at::randint(3, 64, {2, 1}, at::kLong);
  at::Tensor out = m_->forward_cached(next, cache, at::cat({mask, at::ones({2, 1}, at::kLong)}, 1),
                                      at::tensor({4, 7}, at::kLong).view({2, 1}));
  at::Tensor seq0 = at::cat({ids.narrow(0, 0, 1).narrow(1, 0, 4), next.narrow(0, 0, 1)}, 1);
  EXPECT_LE(max_diff(out[0], m_->forward(seq0)[0][4]), 1e-5);
  at::Tensor seq1 = at::cat({ids.narrow(0, 1, 1), next.narrow(0, 1, 1)}, 1);
  EXPECT_LE(max_diff(out[1], m_->forward(seq1)[0][7]), 1e-5);
}

TEST_P(KvCacheTest, SelectRowsKeepsTheChosenSequences) {
  at::manual_seed(4);
  at::Tensor ids = at::randint(3, 64, {3, 6}, at::kLong);
  KvCache cache(m_->config(), 3, 8, at::kFloat);
  m_->forward_cached(ids.narrow(1, 0, 5), cache);
  cache.select_rows(at::tensor({2, 0}, at::kLong));
  at::Tensor out = m_->forward_cached(at::stack({ids[2], ids[0]}).narrow(1, 5, 1), cache);
  at::Tensor full = m_->forward(ids);
  EXPECT_LE(max_diff(out[0], full[2][5]), 1e-5);
  EXPECT_LE(max_diff(out[1], full[0][5]), 1e-5);
}

TEST(KvCache, OverflowIsAClearError) {
  LlamaForCausalLM m(tiny(2));
  at::NoGradGuard no_grad;
  KvCache cache(m->config(), 1, 4, at::kFloat);
  m->forward_cached(at::zeros({1, 4}, at::kLong), cache);
  try {
    m->forward_cached(at::zeros({1, 1}, at::kLong), cache);
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("KvCache is full"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Heads, KvCacheTest, ::testing::Values(4, 2), [](const auto& info) {
  return info.param == 4 ? std::string("Mha") : std::string("Gqa");
});

}  // namespace

}  // namespace test_kv_cache
