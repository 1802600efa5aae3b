// The fused CPU decode step (model::CpuDecoder) against the module path it replaces
// (forward_cached with one new token per row): same logits and same KV cache after prefill plus
// decode steps, in fp32 (1e-5 of the logits' scale; only sum order differs) and bf16 (a few bf16
// roundings of the logits' scale: a product that rounds to the neighbouring bf16 carries through
// the later layers), for multi-head and grouped-query attention, head_dim off the 16-lane vector
// width, biases on every projection (qwen2-style), linear RoPE scaling, a left-padded batch of
// two, peft LoRA branches on every linear (unmerged), trainable-token rows (embedding and head),
// and 1 or 2 intra-op threads (bitwise
// equal: each output is summed by one thread). Also the cases it refuses, by name.
#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include "alpaca/model/cpu_decode.h"
#include "alpaca/model/kv_cache.h"
#include "alpaca/model/llama.h"
#include "alpaca/model/lora.h"
#include "alpaca/model/matmul.h"
#include "model_test_util.h"

namespace test_cpu_decode {

using namespace alpaca::model;

namespace {

struct Case {
  const char* name;
  int64_t kv_heads;
  int64_t head_dim;
  bool biases;
  bool bf16;
  bool lora = false;
  bool tokens = false;  // trainable-token rows on the embedding and the LM head
};

LlamaConfig tiny(const Case& c) {
  LlamaConfig cfg = alpaca::testing::llama_config({96, 48, 80, 3, 4, c.kv_heads, c.head_dim, 64});
  cfg.initializer_range = 0.2;
  cfg.attention_bias = c.biases;
  cfg.o_proj_bias = c.biases;
  cfg.mlp_bias = c.biases;
  if (c.biases) {
    cfg.rope_scaling.type = "linear";
    cfg.rope_scaling.factor = 2.0;
  }
  return cfg;
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kFloat) - b.to(at::kFloat)).abs().max().item<double>();
}

class CpuDecodeTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const Case& c = GetParam();
    m_ = LlamaForCausalLM(tiny(c));
    init_weights(m_, 11);
    if (c.biases) {  // init_weights zeroes biases, as transformers does: make them count
      at::manual_seed(5);
      for (auto& item : m_->named_parameters())
        if (item.key().ends_with(".bias")) item.value().normal_(0.0, 0.3);
    }
    if (c.lora) {  // peft's LoRA on every linear, B made non-zero (peft starts it at zero)
      LoraOptions lo;
      lo.r = 4;
      lo.alpha = 8;
      lo.target_modules = {"all-linear"};
      apply_lora(*m_, lo, 6);
      at::manual_seed(6);
      for (auto& item : m_->named_parameters())
        if (item.key().find("lora_B") != std::string::npos) item.value().normal_(0.0, 0.2);
    }
    if (c.tokens) {  // peft trainable_token_indices: every third id, non-zero deltas (fp32, as peft's)
      std::vector<int64_t> ids;
      for (int64_t t = 1; t < 96; t += 3) ids.push_back(t);
      at::manual_seed(8);
      m_->model->embed_tokens->token_adapter = std::make_shared<TrainableTokensImpl>(ids, 48);
      m_->model->embed_tokens->token_adapter->trainable_tokens_delta.normal_(0.0, 0.5);
      m_->lm_head->token_adapter = std::make_shared<TrainableTokensImpl>(std::vector<int64_t>(ids.begin(), ids.begin() + 10), 48);
      m_->lm_head->token_adapter->trainable_tokens_delta.normal_(0.0, 0.5);
    }
    if (c.bf16) {
      m_->to(at::kBFloat16);
      for (auto* t : {m_->model->embed_tokens->token_adapter.get(), m_->lm_head->token_adapter.get()})
        if (t != nullptr) t->trainable_tokens_delta.set_data(t->trainable_tokens_delta.to(at::kFloat));  // stays fp32
    }
    m_->eval();
    dtype_ = c.bf16 ? at::kBFloat16 : at::kFloat;
    why_ = CpuDecoder::unsupported(*m_, 2);
  }
  void TearDown() override { at::set_num_threads(threads_); }

  // Logits of `steps` decode steps after a prefill of `ids` (B, T) with `mask` (B, T) or none,
  // through the module path or the fused step; also returns the cache's keys of layer 1.
  std::pair<std::vector<at::Tensor>, at::Tensor> run(const at::Tensor& ids, const at::Tensor& mask, int64_t steps,
                                                     bool fused) {
    const int64_t b = ids.size(0), t = ids.size(1);
    KvCache cache(m_->config(), b, t + steps, at::TensorOptions().dtype(dtype_));
    at::Tensor pos = mask.defined() ? (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0) : at::Tensor();
    m_->forward_cached(ids, cache, mask, pos);
    at::Tensor next_pos = mask.defined() ? mask.sum(-1, true) : at::full({b, 1}, t, at::kLong);
    at::Tensor full_mask = mask.defined() ? at::cat({mask, at::ones({b, steps}, at::kLong)}, 1) : at::Tensor();
    std::optional<CpuDecoder> dec;
    if (fused) dec.emplace(*m_, b);
    at::manual_seed(9);
    std::vector<at::Tensor> out;
    for (int64_t s = 0; s < steps; ++s) {
      at::Tensor tok = at::randint(1, m_->config().vocab_size, {b, 1}, at::kLong);
      at::Tensor mk = full_mask.defined() ? full_mask.narrow(1, 0, t + s + 1) : at::Tensor();
      at::Tensor logits = fused ? dec->step(tok, cache, mk, next_pos) : m_->forward_cached(tok, cache, mk, next_pos).to(at::kFloat);
      out.push_back(logits);
      next_pos = next_pos + 1;
    }
    EXPECT_EQ(cache.length(), t + steps);
    return {out, cache.key_buffer(1).clone()};
  }

  double tolerance(const std::vector<at::Tensor>& ref) const {
    double scale = 0;
    for (const auto& l : ref) scale = std::max(scale, l.abs().max().item<double>());
    return (GetParam().bf16 ? 4 * 0.0078125 : 1e-5) * std::max(1.0, scale);
  }

  void expect_same(const std::pair<std::vector<at::Tensor>, at::Tensor>& got,
                   const std::pair<std::vector<at::Tensor>, at::Tensor>& want, const std::string& what) {
    const double tol = tolerance(want.first);
    ASSERT_EQ(got.first.size(), want.first.size());
    for (size_t s = 0; s < got.first.size(); ++s) {
      EXPECT_EQ(got.first[s].scalar_type(), at::kFloat);
      EXPECT_EQ(got.first[s].sizes(), want.first[s].sizes());
      EXPECT_LE(max_diff(got.first[s], want.first[s]), tol) << what << ", step " << s;
    }
    EXPECT_LE(max_diff(got.second, want.second), tol) << what << ": the cached keys";
  }

  LlamaForCausalLM m_{nullptr};
  at::ScalarType dtype_ = at::kFloat;
  std::string why_;
  int threads_ = at::get_num_threads();
  at::NoGradGuard no_grad_;
};

TEST_P(CpuDecodeTest, StepsEqualTheModulePath) {
  if (!why_.empty()) GTEST_SKIP() << "the fused step does not run here: " << why_;
  at::manual_seed(1);
  at::Tensor ids = at::randint(1, 96, {1, 7}, at::kLong);
  expect_same(run(ids, {}, 6, true), run(ids, {}, 6, false), "batch 1");
}

TEST_P(CpuDecodeTest, LeftPaddedPairEqualsTheModulePath) {
  if (!why_.empty()) GTEST_SKIP() << "the fused step does not run here: " << why_;
  at::manual_seed(2);
  at::Tensor ids = at::randint(1, 96, {2, 8}, at::kLong);
  at::Tensor mask = at::ones({2, 8}, at::kLong);
  mask.select(0, 1).narrow(0, 0, 3).zero_();  // row 1: 3 pads on the left
  ids.select(0, 1).narrow(0, 0, 3).fill_(0);
  expect_same(run(ids, mask, 5, true), run(ids, mask, 5, false), "left-padded batch of 2");
  at::Tensor plain = at::randint(1, 96, {2, 5}, at::kLong);
  expect_same(run(plain, {}, 4, true), run(plain, {}, 4, false), "unpadded batch of 2");
}

TEST_P(CpuDecodeTest, PaddedBatchOfFiveAndEightEqualTheModulePath) {
  if (!why_.empty()) GTEST_SKIP() << "the fused step does not run here: " << why_;
  for (int64_t b : {5, 8}) {
    at::manual_seed(10 + b);
    at::Tensor ids = at::randint(1, 96, {b, 7}, at::kLong);
    at::Tensor mask = at::ones({b, 7}, at::kLong);
    for (int64_t r = 1; r < b; r += 2) {  // every other row left-padded by r % 5 + 1
      mask.select(0, r).narrow(0, 0, r % 5 + 1).zero_();
      ids.select(0, r).narrow(0, 0, r % 5 + 1).fill_(0);
    }
    expect_same(run(ids, mask, 4, true), run(ids, mask, 4, false), "left-padded batch of " + std::to_string(b));
  }
}

TEST_P(CpuDecodeTest, ThreadsChangeNoBit) {
  if (!why_.empty()) GTEST_SKIP() << "the fused step does not run here: " << why_;
  at::manual_seed(3);
  at::Tensor ids = at::randint(1, 96, {2, 6}, at::kLong);
  at::set_num_threads(1);
  auto one = run(ids, {}, 4, true);
  at::set_num_threads(2);
  auto two = run(ids, {}, 4, true);
  for (size_t s = 0; s < one.first.size(); ++s) EXPECT_TRUE(at::equal(one.first[s], two.first[s])) << "step " << s;
  EXPECT_TRUE(at::equal(one.second, two.second));
}

INSTANTIATE_TEST_SUITE_P(Models, CpuDecodeTest,
                         ::testing::Values(Case{"Fp32Mha", 4, 12, false, false}, Case{"Fp32GqaBiases", 2, 16, true, false},
                                           Case{"Fp32Dh40", 1, 40, false, false}, Case{"Bf16Mha", 4, 12, false, true},
                                           Case{"Bf16GqaBiases", 2, 16, true, true},
                                           Case{"Fp32GqaLora", 2, 16, false, false, true},
                                           Case{"Bf16BiasesLora", 4, 12, true, true, true},
                                           Case{"Fp32LoraTokens", 2, 16, false, false, true, true},
                                           Case{"Bf16Tokens", 4, 12, false, true, false, true}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(CpuDecode, SaysWhyItCannotRun) {
  LlamaConfig cfg = tiny(Case{"", 2, 16, false, false});
  LlamaForCausalLM m(cfg);
  init_weights(m, 1);
  EXPECT_NE(CpuDecoder::unsupported(*m, 9).find("batch of 9"), std::string::npos);
  EXPECT_NE(CpuDecoder::unsupported(*m, 0).find("batch of 0"), std::string::npos);
  if (CpuDecoder::unsupported(*m, 1).empty()) {
    m->set_layer_runner([](int64_t, const at::Tensor& h, const LayerContext&) { return h; });
    EXPECT_NE(CpuDecoder::unsupported(*m, 1).find("layer runner"), std::string::npos);
    m->set_layer_runner({});
    LoraOptions lo;  // dropout 0.05: only in training mode does the branch differ from eval's
    lo.target_modules = {"q_proj"};
    apply_lora(*m, lo, 3);
    m->train();
    const std::string why = CpuDecoder::unsupported(*m, 1);
    EXPECT_NE(why.find("LoRA dropout in training mode"), std::string::npos) << why;
    try {
      CpuDecoder dec(*m, 1);
      FAIL() << "expected an error";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("LoRA dropout"), std::string::npos) << e.what();
    }
    m->eval();
    EXPECT_EQ(CpuDecoder::unsupported(*m, 1), "");
    m->model->embed_tokens->token_adapter = std::make_shared<TrainableTokensImpl>(std::vector<int64_t>{5}, 48);
    EXPECT_EQ(CpuDecoder::unsupported(*m, 1), "") << "trainable tokens (fp32 deltas) are computed";
  } else {
    EXPECT_NE(CpuDecoder::unsupported(*m, 1).find("AVX-512F"), std::string::npos) << CpuDecoder::unsupported(*m, 1);
  }
  LlamaForCausalLM half(cfg);
  half->to(at::kHalf);
  EXPECT_NE(CpuDecoder::unsupported(*half, 1).find("Half"), std::string::npos) << CpuDecoder::unsupported(*half, 1);
}

TEST(CpuDecode, BadStepInputsAreClearErrors) {
  LlamaConfig cfg = tiny(Case{"", 2, 16, false, false});
  LlamaForCausalLM m(cfg);
  init_weights(m, 1);
  at::NoGradGuard no_grad;
  if (!CpuDecoder::unsupported(*m, 1).empty()) GTEST_SKIP() << CpuDecoder::unsupported(*m, 1);
  CpuDecoder dec(*m, 1);
  KvCache cache(cfg, 1, 3, at::kFloat);
  m->forward_cached(at::ones({1, 2}, at::kLong), cache);
  auto error_of = [&](const at::Tensor& ids, const at::Tensor& mask) {
    try {
      dec.step(ids, cache, mask, at::full({1, 1}, cache.length(), at::kLong));
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of(at::full({1, 1}, 96, at::kLong), {}).find("outside the model's vocabulary"), std::string::npos);
  EXPECT_EQ(cache.length(), 2) << "a refused step moved the cache";
  KvCache bf16_cache(cfg, 1, 3, at::kBFloat16);
  try {
    dec.step(at::ones({1, 1}, at::kLong), bf16_cache, {}, at::full({1, 1}, 0, at::kLong));
    ADD_FAILURE() << "expected an error for a bf16 cache under an fp32 model";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("KV cache must hold contiguous CPU buffers"), std::string::npos) << e.what();
  }
  EXPECT_EQ(bf16_cache.length(), 0);
  EXPECT_NE(error_of(at::ones({2, 1}, at::kLong), {}).find("ids must be 1"), std::string::npos);
  EXPECT_NE(error_of(at::ones({1, 1}, at::kLong), at::ones({1, 2}, at::kLong)).find("attention_mask must be (1, 3)"),
            std::string::npos);
  EXPECT_EQ(error_of(at::ones({1, 1}, at::kLong), {}), "");
  EXPECT_NE(error_of(at::ones({1, 1}, at::kLong), {}).find("KvCache is full"), std::string::npos);
}

}  // namespace

}  // namespace test_cpu_decode
