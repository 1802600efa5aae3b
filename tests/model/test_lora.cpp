// LoRA on the model (model/lora.h): peft's math (init, scaling, dropout on the branch only),
// target matching (names, all-linear, errors naming what exists) and which parameters train.
#include <gtest/gtest.h>

#include <cmath>

#include "alpaca/model/llama.h"
#include "alpaca/model/loss.h"
#include "alpaca/model/lora.h"
#include "alpaca/util/error.h"
#include "model_test_util.h"
#include "test_util.h"

namespace test_lora {

using namespace alpaca::model;

namespace {

LlamaConfig tiny() { return alpaca::testing::llama_config({64, 32, 48, 2, 4, 2, 8, 64}); }

using alpaca::testing::error_of;

LoraOptions rank_alpha(int64_t r, double alpha) {
  LoraOptions o;
  o.r = r;
  o.alpha = alpha;
  return o;
}

}  // namespace

TEST(Lora, DefaultTargetsAreQAndVWithPeftInitAndNames) {
  LlamaForCausalLM m(tiny());
  init_weights(m, 1);
  LoraOptions o = rank_alpha(4, 8);
  const LoraPlan plan = apply_lora(*m, o, 7);
  EXPECT_EQ(plan.lora_modules, (std::vector<std::string>{"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj",
                                                         "model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.v_proj"}));
  auto params = m->named_parameters(true);
  at::Tensor a = params["model.layers.0.self_attn.q_proj.lora_A.weight"];
  at::Tensor b = params["model.layers.0.self_attn.v_proj.lora_B.weight"];
  EXPECT_EQ(a.sizes(), (std::vector<int64_t>{4, 32}));
  EXPECT_EQ(b.sizes(), (std::vector<int64_t>{16, 4}));  // v_proj: 2 kv heads x 8
  // kaiming_uniform(a = sqrt(5)) on fan_in 32: U(-1/sqrt(32), 1/sqrt(32)); B zeros.
  const double bound = 1.0 / std::sqrt(32.0);
  EXPECT_LE(a.abs().max().item<double>(), bound + 1e-7);
  EXPECT_GT(a.abs().max().item<double>(), 0.8 * bound);
  EXPECT_EQ(b.abs().max().item<double>(), 0.0);
  int trainable = 0;
  for (const auto& item : params) {
    const bool lora = is_lora_param(item.key());
    EXPECT_EQ(item.value().requires_grad(), lora) << item.key();
    trainable += lora;
  }
  EXPECT_EQ(trainable, 8);
  // Same seed, same draw; another seed, another draw.
  LlamaForCausalLM m2(tiny()), m3(tiny());
  apply_lora(*m2, o, 7);
  apply_lora(*m3, o, 8);
  EXPECT_TRUE(at::equal(a, m2->named_parameters(true)["model.layers.0.self_attn.q_proj.lora_A.weight"]));
  EXPECT_FALSE(at::equal(a, m3->named_parameters(true)["model.layers.0.self_attn.q_proj.lora_A.weight"]));
}

TEST(Lora, ForwardIsBasePlusScaledBranchAndDropoutOnlyTouchesTheBranch) {
  LlamaForCausalLM m(tiny());
  init_weights(m, 1);
  at::Tensor x = at::randn({2, 5, 32});
  Linear& q = m->model->layers[0]->self_attn->q_proj;
  at::NoGradGuard ng;
  const at::Tensor base = q->forward(x);
  LoraOptions o;
  o.r = 4;
  o.alpha = 8;
  o.dropout = 0.5;
  apply_lora(*m, o, 3);
  EXPECT_DOUBLE_EQ(q->lora_scaling, 2.0);
  // B = 0 at init: the output is the base output exactly, with dropout active (training mode).
  EXPECT_TRUE(at::equal(q->forward(x), base));
  q->lora_B->weight.normal_();
  m->eval();  // no dropout
  const at::Tensor want = base + at::matmul(at::matmul(x, q->lora_A->weight.t()), q->lora_B->weight.t()) * 2.0;
  EXPECT_TRUE(at::allclose(q->forward(x), want, 1e-5, 1e-6));
  m->train();
  at::Tensor d = q->forward(x) - base;  // the branch alone, on a dropped-out input
  // Dropout zeroes inputs of the branch, never the base path: the branch differs from no-dropout.
  EXPECT_FALSE(at::allclose(d, want - base, 1e-4, 1e-5));
  // rsLoRA: alpha / sqrt(r).
  LoraOptions rs = o;
  rs.use_rslora = true;
  EXPECT_DOUBLE_EQ(rs.scaling(), 8.0 / 2.0);
  rs.r = 16;
  EXPECT_DOUBLE_EQ(rs.scaling(), 2.0);
}

// DoRA (peft use_dora): m starts at ||W||_row, so a fresh adapter is the base; then
// y = x W^T + (g - 1) x W^T + g s B(A(x)) with g = m / ||W + s B A|| held constant to autograd, i.e.
// x (g (W + s B A))^T; under dropout the middle term takes the dropped input (peft recomputes it).
TEST(Lora, DoraIsTheRescaledWeightWithTheNormConstantAndItsDropoutForm) {
  LlamaForCausalLM m(tiny());
  init_weights(m, 1);
  at::Tensor x = at::randn({2, 5, 32});
  Linear& q = m->model->layers[0]->self_attn->q_proj;
  const at::Tensor base = q->forward(x).detach();
  LoraOptions o = rank_alpha(4, 8);
  o.use_dora = true;
  o.dropout = 0.25;
  const LoraPlan plan = apply_lora(*m, o, 3);
  auto params = m->named_parameters(true);
  ASSERT_TRUE(params.contains("model.layers.0.self_attn.q_proj.lora_magnitude_vector"));
  EXPECT_TRUE(is_lora_param("model.layers.0.self_attn.q_proj.lora_magnitude_vector"));
  EXPECT_TRUE(at::allclose(q->lora_magnitude, q->weight.norm(2, {1}), 1e-6, 1e-7));
  m->eval();
  EXPECT_TRUE(at::allclose(q->forward(x), base, 1e-5, 1e-6)) << "a fresh DoRA adapter changes the output";
  {
    at::NoGradGuard ng;
    q->lora_B->weight.normal_(0, 0.1);
    q->lora_magnitude.mul_(1.3);
  }
  const at::Tensor w_eff = q->weight + at::matmul(q->lora_B->weight, q->lora_A->weight) * 2.0;
  const at::Tensor g = (q->lora_magnitude / w_eff.norm(2, {1})).detach();
  const at::Tensor want = at::matmul(x, (g.view({-1, 1}) * w_eff).t()).detach();
  at::Tensor y = q->forward(x);
  EXPECT_TRUE(at::allclose(y, want, 1e-4, 1e-5));
  // Gradients: the magnitude gets one; the norm is a constant, so B's gradient is g s (dy)^T A x.
  y.sum().backward();
  ASSERT_TRUE(q->lora_magnitude.grad().defined());
  EXPECT_GT(q->lora_magnitude.grad().abs().max().item<double>(), 0);
  const at::Tensor a_x = at::matmul(x, q->lora_A->weight.t()).reshape({-1, 4});      // (N, r)
  const at::Tensor dy = (g * 2.0).view({1, -1}).expand({a_x.size(0), -1});              // (N, out)
  EXPECT_TRUE(at::allclose(q->lora_B->weight.grad(), at::matmul(dy.t(), a_x), 1e-4, 1e-5));
  // Dropout (training): result + (g - 1) x' W^T + g s B(A(x')), x' the dropped input; the same
  // draw reproduces x'.
  m->train();
  at::NoGradGuard ng;
  at::manual_seed(11);
  const at::Tensor yt = q->forward(x);
  at::manual_seed(11);
  const at::Tensor xd = at::dropout(x, 0.25, true);
  const at::Tensor want_t = base + (g - 1) * at::matmul(xd, q->weight.t()) +
                            g * at::matmul(at::matmul(xd, q->lora_A->weight.t()), q->lora_B->weight.t()) * 2.0;
  EXPECT_TRUE(at::allclose(yt, want_t, 1e-4, 1e-5));
  EXPECT_EQ(plan.lora_modules.size(), 4u);
  EXPECT_NE(error_of([&] {
              LlamaForCausalLM h(tiny());
              LoraOptions lo = o;
              lo.target_modules = {"lm_head"};
              apply_lora(*h, lo, 0);
            }).find("DoRA on lm_head is not supported"),
            std::string::npos);
}

TEST(Lora, AllLinearIsEveryLinearButLmHeadAndModulesToSaveTrain) {
  LlamaForCausalLM m(tiny(), at::TensorOptions().device(at::kMeta));  // the trainer's meta model
  LoraOptions o;
  o.r = 2;
  o.target_modules = {"all-linear"};
  o.modules_to_save = {"lm_head"};
  const LoraPlan plan = apply_lora(*m, o, 1);
  EXPECT_EQ(plan.lora_modules.size(), 14u);
  EXPECT_EQ(plan.target_modules,
            (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}));
  EXPECT_EQ(plan.saved_modules, (std::vector<std::string>{"lm_head"}));
  auto params = m->named_parameters(true);
  EXPECT_TRUE(params["lm_head.weight"].requires_grad());
  EXPECT_FALSE(params["model.embed_tokens.weight"].requires_grad());
  EXPECT_FALSE(params["model.layers.1.mlp.down_proj.weight"].requires_grad());
  EXPECT_TRUE(params["model.layers.1.mlp.down_proj.lora_B.weight"].requires_grad());
  EXPECT_TRUE(params["model.layers.1.mlp.down_proj.weight"].is_meta());
  EXPECT_FALSE(params["model.layers.1.mlp.down_proj.lora_A.weight"].is_meta());  // adapters have values
  EXPECT_EQ(params.find("lm_head.lora_A.weight"), nullptr);
}

TEST(Lora, BadTargetsNameWhatExists) {
  LoraOptions o;
  o.target_modules = {"q_proj", "qkv_proj"};
  LlamaForCausalLM m(tiny());
  std::string e = error_of([&] { apply_lora(*m, o, 1); });
  EXPECT_NE(e.find("'qkv_proj' matches no module"), std::string::npos) << e;
  EXPECT_NE(e.find("q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head"), std::string::npos) << e;
  o.target_modules = {"input_layernorm"};
  LlamaForCausalLM m2(tiny());
  e = error_of([&] { apply_lora(*m2, o, 1); });
  EXPECT_NE(e.find("not a linear layer"), std::string::npos) << e;
  o.target_modules = {};
  o.modules_to_save = {"embeddings"};
  LlamaForCausalLM m3(tiny());
  e = error_of([&] { apply_lora(*m3, o, 1); });
  EXPECT_NE(e.find("'embeddings' matches no module"), std::string::npos) << e;
  EXPECT_NE(e.find("embed_tokens"), std::string::npos) << e;
  o.modules_to_save = {};
  o.r = 0;
  LlamaForCausalLM m4(tiny());
  e = error_of([&] { apply_lora(*m4, o, 1); });
  EXPECT_NE(e.find("r must be > 0"), std::string::npos) << e;
  EXPECT_EQ(split_module_list("q_proj, v_proj  o_proj"), (std::vector<std::string>{"q_proj", "v_proj", "o_proj"}));
}

// Trainable token rows (peft's TrainableTokensLayer): the forward and every gradient equal the
// same model computed peft's way, with the tables' rows replaced by index_copy (autograd through
// W.index_copy(0, ids, delta)); only the deltas get gradients; tied tables share one delta.
TEST(Lora, TrainableTokenRowsAreRowsReplacedAsPeftDoes) {
  for (bool tied : {false, true}) {
    LlamaConfig c = tiny();
    c.tie_word_embeddings = tied;
    LlamaForCausalLM m(c);
    init_weights(m, 3);
    LoraOptions o;
    o.r = 4;
    o.alpha = 8;
    o.dropout = 0;
    o.trainable_token_indices = {61, 63};
    const LoraPlan plan = apply_lora(*m, o, 7);
    using Tables = std::vector<std::pair<std::string, std::string>>;
    const Tables want_tables = tied ? Tables{{"embed_tokens", "model.embed_tokens"}}
                                    : Tables{{"embed_tokens", "model.embed_tokens"}, {"lm_head", "lm_head"}};
    EXPECT_EQ(plan.token_tables, want_tables);
    auto params = m->named_parameters(true);
    at::Tensor emb_delta = params["model.embed_tokens.token_adapter.trainable_tokens_delta"];
    ASSERT_TRUE(emb_delta.defined() && emb_delta.requires_grad());
    EXPECT_TRUE(is_lora_param("model.embed_tokens.token_adapter.trainable_tokens_delta"));
    at::Tensor idx = at::tensor({61, 63}, at::kLong);
    // Initialised from the table's rows (peft: weight[indices].clone()).
    EXPECT_TRUE(at::equal(emb_delta, m->model->embed_tokens->weight.index_select(0, idx)));
    EXPECT_FALSE(m->model->embed_tokens->weight.requires_grad());
    at::Tensor head_delta = tied ? emb_delta : params["lm_head.token_adapter.trainable_tokens_delta"];
    {
      // Move the deltas off the table rows so a path that ignored them would show.
      at::NoGradGuard ng;
      emb_delta.add_(0.5);
      if (!tied) head_delta.sub_(0.25);
    }
    at::Tensor ids = at::tensor({1, 61, 5, 63, 63, 7, 2, 61}, at::kLong).view({2, 4});
    at::Tensor labels = at::tensor({-100, 63, 5, 61, 63, -100, 61, 2}, at::kLong).view({2, 4});
    LossSum ours = m->forward_loss_sum(ids, labels);
    ours.sum.backward();
    const at::Tensor g_emb = emb_delta.grad().clone(), g_head = head_delta.grad().clone();
    const at::Tensor logits_ours = m->forward(ids).detach();
    // peft's way: plain tables with the rows replaced, leaf copies of the deltas.
    at::Tensor e_leaf = emb_delta.detach().clone().requires_grad_(true);
    at::Tensor h_leaf = tied ? e_leaf : head_delta.detach().clone().requires_grad_(true);
    at::Tensor w_emb = m->model->embed_tokens->weight.detach().index_copy(0, idx, e_leaf);
    at::Tensor w_head = (tied ? m->model->embed_tokens->weight : m->lm_head->weight).detach().index_copy(0, idx, h_leaf);
    at::Tensor h = at::embedding(w_emb, ids);
    LayerContext ctx = m->make_context(ids, {}, {}, {}, h.scalar_type());
    for (auto& layer : m->layers()) h = layer->forward(h, ctx);
    at::Tensor logits = at::matmul(m->model->norm->forward(h), w_head.t());
    at::Tensor ref = causal_lm_loss_sum(logits, labels).sum;
    ref.backward();
    EXPECT_NEAR(ours.sum.item<double>(), ref.item<double>(), 1e-4) << "tied " << tied;
    EXPECT_TRUE(at::allclose(logits_ours, logits.detach(), 1e-5, 1e-5)) << "tied " << tied;
    EXPECT_TRUE(at::allclose(g_emb, e_leaf.grad(), 1e-5, 1e-6)) << "tied " << tied << "\n" << g_emb << e_leaf.grad();
    if (!tied) {
      EXPECT_TRUE(at::allclose(g_head, h_leaf.grad(), 1e-5, 1e-6)) << g_head << h_leaf.grad();
    }
    EXPECT_GT(g_emb.abs().max().item<double>(), 1e-3);
    EXPECT_GT(g_head.abs().max().item<double>(), 1e-3);
  }
}

// LoRA on lm_head (peft targets it like any linear): the fused training loss takes W + s B A, so its
// loss and A/B gradients must equal peft's unmerged x W^T + s (x A^T) B^T through the logits, and
// B must get a gradient at all. Dropout there is refused in training, not silently dropped.
TEST(Lora, LmHeadBranchTrainsThroughTheFusedLossAsPeftsUnmergedMath) {
  LlamaForCausalLM m(tiny());
  init_weights(m, 5);
  LoraOptions o = rank_alpha(4, 8);
  o.dropout = 0;
  o.target_modules = {"q_proj", "lm_head"};
  const LoraPlan plan = apply_lora(*m, o, 11);
  EXPECT_EQ(plan.lora_modules, (std::vector<std::string>{"model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.q_proj", "lm_head"}));
  Linear& head = m->lm_head;
  {
    at::NoGradGuard ng;
    head->lora_B->weight.normal_(0, 0.1);  // off its zero init, so a path ignoring the branch shows
  }
  at::Tensor ids = at::tensor({1, 9, 5, 33, 12, 7, 2, 40}, at::kLong).view({2, 4});
  at::Tensor labels = at::tensor({-100, 33, 5, 9, 12, -100, 40, 2}, at::kLong).view({2, 4});
  LossSum fused = m->forward_loss_sum(ids, labels);
  fused.sum.backward();
  const at::Tensor ga = head->lora_A->weight.grad().clone(), gb = head->lora_B->weight.grad().clone();
  head->lora_A->weight.mutable_grad().zero_();
  head->lora_B->weight.mutable_grad().zero_();
  // peft's path: the logits through lm_head's own forward (base + scaled branch).
  at::Tensor ref = causal_lm_loss_sum(m->forward(ids), labels).sum;
  ref.backward();
  EXPECT_NEAR(fused.sum.item<double>(), ref.item<double>(), 1e-4);
  EXPECT_TRUE(at::allclose(ga, head->lora_A->weight.grad(), 1e-4, 1e-6)) << ga << head->lora_A->weight.grad();
  EXPECT_TRUE(at::allclose(gb, head->lora_B->weight.grad(), 1e-4, 1e-6));
  EXPECT_GT(gb.abs().max().item<double>(), 1e-3);
  head->lora_dropout = 0.1;
  const std::string e = error_of([&] { m->forward_loss_sum(ids, labels); });
  EXPECT_NE(e.find("LoRA dropout on lm_head is not supported in training"), std::string::npos) << e;
}

// modules_to_save matches as peft's _set_trainable does: any module whose name ends with the text
// ("norm" is every norm), and a module cannot be both a LoRA target and saved in full (peft raises).
TEST(Lora, ModulesToSaveMatchNameEndingsAndExcludeLoraTargets) {
  LlamaForCausalLM m(tiny(), at::TensorOptions().device(at::kMeta));
  LoraOptions o;
  o.r = 2;
  o.modules_to_save = {"norm"};
  const LoraPlan plan = apply_lora(*m, o, 1);
  EXPECT_EQ(plan.saved_modules,
            (std::vector<std::string>{"model.layers.0.input_layernorm", "model.layers.0.post_attention_layernorm",
                                      "model.layers.1.input_layernorm", "model.layers.1.post_attention_layernorm",
                                      "model.norm"}));
  EXPECT_TRUE(m->named_parameters(true)["model.layers.1.input_layernorm.weight"].requires_grad());
  LlamaForCausalLM m2(tiny(), at::TensorOptions().device(at::kMeta));
  o.modules_to_save = {"q_proj"};
  o.target_modules = {"q_proj"};
  const std::string e = error_of([&] { apply_lora(*m2, o, 1); });
  EXPECT_NE(e.find("is also a module to save"), std::string::npos) << e;
}

}  // namespace test_lora
