// A tiny causal LM for FSDP tests with the same structure as the project's LlamaForCausalLM:
// root "model" (embed_tokens, layers.{i}, norm) + lm_head (optionally tied), decoder layers called
// through a replaceable layer runner so the engine can wrap each call from outside.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <functional>

#include "alpaca/fsdp/engine.h"
#include "fsdp_test_env.h"

namespace alpaca::testing {

struct TinyConfig {
  int64_t vocab = 13, dim = 5, hidden = 7, layers = 3;
  bool tie = false;
  bool bias = true;
  double norm_eps = 1e-6;  // dim 1 needs a large eps, else the norm is sign(x) and its gradient noise
};

inline at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor y = xf * at::rsqrt(xf.pow(2).mean(-1, true) + eps);
  return w * y.to(x.scalar_type());
}

struct TinyNormImpl : torch::nn::Module {
  explicit TinyNormImpl(at::Tensor w) { weight = register_parameter("weight", std::move(w)); }
  at::Tensor weight;
};
TORCH_MODULE(TinyNorm);

struct TinyBlockImpl : torch::nn::Module {
  explicit TinyBlockImpl(const TinyConfig& c) : eps(c.norm_eps) {
    norm = register_module("input_layernorm", TinyNorm(at::ones({c.dim}) + 0.1 * at::randn({c.dim})));
    up = register_module("up_proj", torch::nn::Linear(torch::nn::LinearOptions(c.dim, c.hidden).bias(c.bias)));
    down = register_module("down_proj", torch::nn::Linear(torch::nn::LinearOptions(c.hidden, c.dim).bias(false)));
  }
  at::Tensor forward(const at::Tensor& x) {
    return x + down->forward(at::silu(up->forward(rms_norm(x, norm->weight, eps))));
  }
  double eps;
  TinyNorm norm{nullptr};
  torch::nn::Linear up{nullptr}, down{nullptr};
};
TORCH_MODULE(TinyBlock);

struct TinyInnerImpl : torch::nn::Module {
  explicit TinyInnerImpl(const TinyConfig& c) {
    embed = register_module("embed_tokens", torch::nn::Embedding(c.vocab, c.dim));
    layers = register_module("layers", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.layers; ++i) {
      blocks.push_back(TinyBlock(c));
      layers->push_back(blocks.back());
    }
    norm = register_module("norm", TinyNorm(at::ones({c.dim})));
  }
  torch::nn::Embedding embed{nullptr};
  torch::nn::ModuleList layers{nullptr};
  std::vector<TinyBlock> blocks;
  TinyNorm norm{nullptr};
};
TORCH_MODULE(TinyInner);

using TinyRunner = std::function<at::Tensor(int64_t, const at::Tensor&)>;

struct TinyLMImpl : torch::nn::Module {
  explicit TinyLMImpl(const TinyConfig& c) : cfg(c) {
    model = register_module("model", TinyInner(c));
    // A head holding either the embedding tensor itself (tied: one tensor, two names) or its own.
    lm_head = register_module("lm_head", TinyNorm(c.tie ? model->embed->weight : 0.2 * at::randn({c.vocab, c.dim})));
  }
  at::Tensor forward(const at::Tensor& ids_bt) {
    at::Tensor h = model->embed->forward(ids_bt);
    for (int64_t i = 0; i < cfg.layers; ++i)
      h = runner ? runner(i, h) : model->blocks[i]->forward(h);
    h = rms_norm(h, model->norm->weight, cfg.norm_eps);
    return at::linear(h, lm_head->weight);
  }
  std::vector<torch::nn::Module*> layer_modules() {
    std::vector<torch::nn::Module*> out;
    for (auto& b : model->blocks) out.push_back(b.get());
    return out;
  }
  TinyConfig cfg;
  TinyInner model{nullptr};
  TinyNorm lm_head{nullptr};
  TinyRunner runner;
};
TORCH_MODULE(TinyLM);

// Every layer call of `m` through `engine`, which gathers the layer's unit around it.
inline void run_layers_through(TinyLM& m, fsdp::FsdpEngine& engine) {
  m->runner = [&engine, &m](int64_t i, const at::Tensor& h) {
    TinyBlockImpl* layer = m->model->blocks[i].get();
    return engine.run_layer(i, h, [layer](const at::Tensor& x) { return layer->forward(x); });
  };
}

// One optimizer step's forwards and backwards on this rank: its `accum` micro-batches of `b` (the
// k-th starts at row (k * world + rank) * micro-batch), each loss over the whole batch's label
// tokens, backward of loss * `scale` (the loss scaler's; 1: plain). Returns the sum of the losses.
inline double backward_micro_batches(fsdp::FsdpEngine& engine, TinyLM& m, const GlobalBatch& b, int world, int rank,
                                     int accum, double scale = 1.0) {
  const int64_t mb = b.ids_bt.size(0) / (world * accum);
  double step_loss = 0;
  for (int k = 0; k < accum; ++k) {
    const int64_t start = (static_cast<int64_t>(k) * world + rank) * mb;
    at::Tensor ids = b.ids_bt.narrow(0, start, mb), labels = b.labels_bt.narrow(0, start, mb);
    at::Tensor logits = engine.forward([&] { return m->forward(ids); });
    at::Tensor loss = token_loss_sum(logits, labels) / static_cast<double>(b.num_tokens);
    (scale != 1.0 ? loss * scale : loss).backward();
    step_loss += loss.item<double>();
  }
  return step_loss;
}

}  // namespace alpaca::testing
