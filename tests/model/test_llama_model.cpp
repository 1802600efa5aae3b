// LlamaForCausalLM behaviour that the trainer and FSDP rely on: HF parameter names, packing
// (segment ids), the layer runner hook, embedding resize, initialisation, meta construction.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "alpaca/model/kv_cache.h"
#include "alpaca/model/llama.h"
#include "alpaca/model/rope.h"
#include "alpaca/util/error.h"
#include "model_test_util.h"

namespace test_llama_model {

using namespace alpaca::model;

namespace {

LlamaConfig tiny(bool tied, int64_t kv_heads = 2) {
  LlamaConfig c = alpaca::testing::llama_config({64, 32, 48, 2, 4, kv_heads, 8, 64});
  c.tie_word_embeddings = tied;
  c.pad_token_id = 0;
  return c;
}

TEST(LlamaModel, ParameterNamesAreHuggingFaces) {
  LlamaConfig c = tiny(false);
  c.attention_bias = c.o_proj_bias = true;  // LLaMA attention_bias: all four projections
  LlamaForCausalLM m(c);
  std::set<std::string> names;
  for (const auto& item : m->named_parameters(true)) names.insert(item.key());
  std::set<std::string> want = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"};
  for (int i = 0; i < 2; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
      want.insert(p + "self_attn." + proj + ".weight");
      want.insert(p + "self_attn." + proj + ".bias");
    }
    for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) want.insert(p + "mlp." + proj + ".weight");
    want.insert(p + "input_layernorm.weight");
    want.insert(p + "post_attention_layernorm.weight");
  }
  EXPECT_EQ(names, want);

  LlamaForCausalLM tied(tiny(true));
  EXPECT_EQ(tied->named_parameters(true).find("lm_head.weight"), nullptr);
  EXPECT_TRUE(tied->lm_head_weight().is_same(tied->model->embed_tokens->weight));
  EXPECT_EQ(tied->named_parameters(true)["model.layers.1.self_attn.k_proj.weight"].sizes(),
            (std::vector<int64_t>{16, 32}));  // 2 kv heads x 8
}

// NEFTune as transformers' hook: training-mode embeddings + U(-a, a), a = alpha / sqrt(T * D), in
// the embedding's dtype; evaluation mode and an unset alpha add nothing; the draws come from the
// default generator (the same seed, the same noise).
TEST(LlamaModel, NeftuneNoiseIsUniformInTrainingOnly) {
  LlamaForCausalLM m(tiny(false));
  init_weights(m, 3);
  at::NoGradGuard no_grad;
  const at::Tensor ids = at::randint(1, 64, {4, 40}, at::kLong);
  const at::Tensor clean = m->embed(ids);
  m->set_neftune_noise_alpha(5.0);
  const double a = 5.0 / std::sqrt(40.0 * 32.0);
  at::manual_seed(7);
  const at::Tensor noisy = m->embed(ids);
  const at::Tensor d = (noisy - clean).to(at::kDouble);
  EXPECT_LE(d.abs().max().item<double>(), a * (1 + 1e-5));
  EXPECT_GE(d.abs().max().item<double>(), 0.95 * a);  // 5,120 draws reach near the bound
  EXPECT_NEAR(d.abs().mean().item<double>(), a / 2, 0.05 * a);
  EXPECT_NEAR(d.mean().item<double>(), 0.0, 0.05 * a);
  at::manual_seed(7);
  EXPECT_TRUE(at::equal(m->embed(ids), noisy)) << "the default generator draws the noise";
  m->eval();
  EXPECT_TRUE(at::equal(m->embed(ids), clean)) << "evaluation mode adds no noise";
  m->train();
  m->set_neftune_noise_alpha(std::nullopt);
  EXPECT_TRUE(at::equal(m->embed(ids), clean));
  LlamaForCausalLM bf(tiny(false));
  init_weights(bf, 3);
  bf->to(at::kBFloat16);
  bf->set_neftune_noise_alpha(5.0);
  EXPECT_EQ(bf->embed(ids).scalar_type(), at::kBFloat16);
}

TEST(LlamaModel, PackedSegmentsMatchSeparateSequences) {
  LlamaForCausalLM m(tiny(false));
  init_weights(m, 3);
  at::NoGradGuard no_grad;
  at::Tensor a = at::randint(1, 64, {1, 5}, at::kLong);
  at::Tensor b = at::randint(1, 64, {1, 7}, at::kLong);
  at::Tensor packed = at::cat({a, b}, 1);
  at::Tensor seg = at::cat({at::zeros({1, 5}, at::kLong), at::ones({1, 7}, at::kLong)}, 1);
  at::Tensor pos = at::cat({at::arange(5, at::kLong), at::arange(7, at::kLong)}).unsqueeze(0);
  at::Tensor out = m->forward(packed, {}, pos, seg);
  at::Tensor la = m->forward(a), lb = m->forward(b);
  EXPECT_LE((out.narrow(1, 0, 5) - la).abs().max().item<double>(), 1e-5);
  EXPECT_LE((out.narrow(1, 5, 7) - lb).abs().max().item<double>(), 1e-5);
  // Without segment ids the second sequence would see the first: the outputs must differ.
  at::Tensor leaky = m->forward(packed, {}, pos);
  EXPECT_GT((leaky.narrow(1, 5, 7) - lb).abs().max().item<double>(), 1e-4);
}

TEST(LlamaModel, RightPaddingDoesNotChangeRealPositionsAndLeftPaddingHasNoNaN) {
  LlamaForCausalLM m(tiny(true));
  init_weights(m, 4);
  at::NoGradGuard no_grad;
  at::Tensor ids = at::randint(1, 64, {1, 6}, at::kLong);
  at::Tensor padded = at::cat({ids, at::zeros({1, 3}, at::kLong)}, 1);
  at::Tensor mask = at::cat({at::ones({1, 6}, at::kLong), at::zeros({1, 3}, at::kLong)}, 1);
  at::Tensor base = m->forward(ids);
  at::Tensor out = m->forward(padded, mask);
  EXPECT_LE((out.narrow(1, 0, 6) - base).abs().max().item<double>(), 1e-5);
  at::Tensor left = m->forward(at::cat({at::zeros({1, 3}, at::kLong), ids}, 1), mask.flip(1));
  EXPECT_FALSE(left.isnan().any().item<bool>());
}

TEST(LlamaModel, LayerRunnerDrivesEveryLayer) {
  LlamaForCausalLM m(tiny(false));
  init_weights(m, 5);
  at::Tensor ids = at::randint(0, 64, {2, 6}, at::kLong);
  at::Tensor want = m->forward(ids).detach();
  std::vector<int64_t> calls;
  m->set_layer_runner([&](int64_t i, const at::Tensor& h, const LayerContext& ctx) {
    calls.push_back(i);
    EXPECT_EQ(ctx.cos.sizes(), (std::vector<int64_t>{2, 6, 8}));
    EXPECT_FALSE(ctx.attn_mask.defined());
    return m->layers()[i]->forward(h, ctx);
  });
  at::Tensor got = m->forward(ids);
  EXPECT_EQ(calls, (std::vector<int64_t>{0, 1}));
  EXPECT_TRUE(at::equal(got, want));
  m->set_layer_runner(nullptr);
}

TEST(LlamaModel, ResizeTokenEmbeddingsUsesMeanRows) {
  for (bool tied : {false, true}) {
    LlamaForCausalLM m(tiny(tied));
    init_weights(m, 6);
    at::Tensor old_in = m->model->embed_tokens->weight.detach().clone();
    at::Tensor old_out = m->lm_head_weight().detach().clone();
    m->resize_token_embeddings(66);
    EXPECT_EQ(m->config().vocab_size, 66);
    at::Tensor in = m->model->embed_tokens->weight;
    EXPECT_EQ(in.size(0), 66);
    EXPECT_TRUE(at::equal(in.narrow(0, 0, 64), old_in));
    EXPECT_TRUE(at::allclose(in[65], old_in.mean(0)));
    EXPECT_TRUE(at::allclose(m->lm_head_weight()[64], old_out.mean(0)));
    EXPECT_EQ(m->forward(at::full({1, 3}, 65, at::kLong)).size(-1), 66);
  }
}

// train.py's last num_new_tokens rows after its resize: the mean of the rows before them, including
// rows the checkpoint stored (a vocabulary saved with len(tokenizer) rows, or one shrunk to it).
TEST(LlamaModel, FillRowsWithMeanOverwritesTheLastRows) {
  for (bool tied : {false, true}) {
    LlamaForCausalLM m(tiny(tied));
    init_weights(m, 7);
    const at::Tensor old_in = m->model->embed_tokens->weight.detach().clone();
    const at::Tensor old_out = m->lm_head_weight().detach().clone();
    m->fill_rows_with_mean(62);
    const at::Tensor in = m->model->embed_tokens->weight;
    EXPECT_TRUE(at::equal(in.narrow(0, 0, 62), old_in.narrow(0, 0, 62)));
    for (int64_t r : {62, 63}) {
      EXPECT_TRUE(at::allclose(in[r], old_in.narrow(0, 0, 62).mean(0)));
      EXPECT_TRUE(at::allclose(m->lm_head_weight()[r], old_out.narrow(0, 0, 62).mean(0)));
    }
    EXPECT_THROW(m->fill_rows_with_mean(0), alpaca::Error);
    EXPECT_THROW(m->fill_rows_with_mean(65), alpaca::Error);
  }
}

// Sliding-window attention (test_llama_parity checks the numbers against transformers' Mistral and
// Qwen2): a window of 4 changes the outputs from position 4 on and not before; generation through
// the KV cache (a prefill, then one token a step past the window) gives the full forward's logits at
// every position; Qwen2's per-layer windows (layer 0 full, layer 1 sliding) sit between the two.
TEST(LlamaModel, SlidingWindowMasksTrainingAndCachedGenerationAlike) {
  LlamaConfig c = tiny(false);
  c.model_type = "mistral";
  LlamaForCausalLM plain(c);
  init_weights(plain, 8);
  c.sliding_window = 4;
  c.sliding_layers = {true, true};
  LlamaForCausalLM m(c);
  init_weights(m, 8);
  const at::Tensor ids = at::randint(3, 64, {1, 12}, at::kLong);
  at::NoGradGuard no_grad;
  const at::Tensor full = plain->forward(ids), windowed = m->forward(ids);
  EXPECT_TRUE(at::equal(full.narrow(1, 0, 4), windowed.narrow(1, 0, 4))) << "the window cuts nothing before position 4";
  EXPECT_GT((full.narrow(1, 4, 8) - windowed.narrow(1, 4, 8)).abs().max().item<double>(), 1e-4);
  EXPECT_FALSE(m->window_cuts(4));
  EXPECT_TRUE(m->window_cuts(5));
  KvCache cache(c, 1, 16, at::kFloat);
  std::vector<at::Tensor> steps = {m->forward_cached(ids.narrow(1, 0, 3), cache)};
  for (int64_t p = 3; p < 12; ++p) steps.push_back(m->forward_cached(ids.narrow(1, p, 1), cache));
  for (int64_t p = 2; p < 12; ++p)
    EXPECT_TRUE(at::allclose(steps[p - 2], windowed.select(1, p), 1e-5, 1e-5)) << "position " << p;
  // Padding on the left of a batch row with the window (the cache's mask and the window together).
  {
    KvCache c2(c, 2, 16, at::kFloat);
    const at::Tensor two = at::cat({ids, ids}).clone();
    at::Tensor mask = at::ones({2, 12}, at::kLong);
    mask[1].narrow(0, 0, 2).zero_();
    const at::Tensor whole = m->forward(two, mask);
    at::Tensor last = m->forward_cached(two.narrow(1, 0, 6), c2, mask.narrow(1, 0, 6));
    for (int64_t p = 6; p < 12; ++p) last = m->forward_cached(two.narrow(1, p, 1), c2, mask.narrow(1, 0, p + 1));
    EXPECT_TRUE(at::allclose(last, whole.select(1, 11), 1e-5, 1e-5));
  }
  c.sliding_layers = {false, true};
  LlamaForCausalLM mixed(c);
  init_weights(mixed, 8);
  const at::Tensor half = mixed->forward(ids);
  EXPECT_GT((half.narrow(1, 4, 8) - windowed.narrow(1, 4, 8)).abs().max().item<double>(), 1e-4);
  EXPECT_GT((half.narrow(1, 4, 8) - full.narrow(1, 4, 8)).abs().max().item<double>(), 1e-4);
}

TEST(LlamaModel, InitWeightsFollowsTransformers) {
  LlamaConfig c = tiny(false);
  c.mlp_bias = true;
  c.vocab_size = 512;
  LlamaForCausalLM m(c), m2(c), m3(c);
  init_weights(m, 11);
  init_weights(m2, 11);
  init_weights(m3, 12);
  auto p = m->named_parameters(true);
  const double std = p["model.embed_tokens.weight"].std().item<double>();
  EXPECT_NEAR(std, 0.02, 0.002);
  EXPECT_NEAR(p["lm_head.weight"].std().item<double>(), 0.02, 0.002);
  EXPECT_TRUE(at::equal(p["model.embed_tokens.weight"][0], at::zeros({32})));  // padding row
  EXPECT_TRUE(at::equal(p["model.norm.weight"], at::ones({32})));
  EXPECT_TRUE(at::equal(p["model.layers.0.mlp.up_proj.bias"], at::zeros({48})));
  EXPECT_TRUE(at::equal(p["lm_head.weight"], m2->named_parameters(true)["lm_head.weight"]));
  EXPECT_FALSE(at::equal(p["lm_head.weight"], m3->named_parameters(true)["lm_head.weight"]));
}

TEST(LlamaModel, BuildsOnMetaDeviceAndInBf16) {
  LlamaForCausalLM meta(tiny(false), at::TensorOptions().device(at::kMeta));
  for (const auto& p : meta->parameters()) EXPECT_TRUE(p.is_meta());
  LlamaForCausalLM bf(tiny(false), at::kBFloat16);
  init_weights(bf, 1);
  EXPECT_EQ(bf->forward(at::zeros({1, 4}, at::kLong)).scalar_type(), at::kBFloat16);
}

TEST(LlamaModel, LossSumCountsLabelTokens) {
  at::Tensor logits = at::randn({2, 4, 10});
  at::Tensor labels = at::tensor({1, 2, -100, 3, -100, -100, 4, 5}, at::kLong).view({2, 4});
  LossSum ls = causal_lm_loss_sum(logits, labels);
  // Shifted labels: row0 -> 2, -100, 3, (pad); row1 -> -100, 4, 5, (pad): 4 tokens.
  EXPECT_EQ(ls.num_tokens, 4);
  EXPECT_NEAR(causal_lm_loss(logits, labels).item<double>(), ls.sum.item<double>() / 4, 1e-6);
}

TEST(Rope, Llama3LeavesHighFrequenciesAndScalesLowOnes) {
  LlamaConfig c = tiny(false);
  c.head_dim = 16;
  c.rope_theta = 500000;
  LlamaConfig s = c;
  s.rope_scaling.type = "llama3";
  s.rope_scaling.factor = 8.0;
  s.rope_scaling.low_freq_factor = 1.0;
  s.rope_scaling.high_freq_factor = 4.0;
  s.rope_scaling.original_max_position_embeddings = 64;
  at::Tensor plain = rope_inv_freq(c, 0, at::kCPU), scaled = rope_inv_freq(s, 0, at::kCPU);
  EXPECT_FLOAT_EQ(scaled[0].item<float>(), plain[0].item<float>());
  EXPECT_FLOAT_EQ(scaled[7].item<float>(), plain[7].item<float>() / 8);
}

}  // namespace

}  // namespace test_llama_model
