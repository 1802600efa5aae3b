// LlamaForCausalLM: embeddings -> decoder layers (through the layer runner) -> norm -> lm_head.
#include "alpaca/model/llama.h"

#include <cmath>

#include <torch/nn/modules/container/modulelist.h>  // defines: torch::nn::ModuleList

#include "alpaca/model/matmul.h"
#include "alpaca/model/rope.h"
#include "alpaca/util/error.h"
#include "alpaca/util/trace.h"
#include "alpaca/util/host_sync.h"

namespace alpaca::model {

LlamaModelImpl::LlamaModelImpl(const LlamaConfig& cfg, const at::TensorOptions& options, ParamInit init) {
  embed_tokens = register_module("embed_tokens", Embedding(cfg.vocab_size, cfg.hidden_size, options, init));
  embed_tokens->padding_idx = cfg.embedding_padding_idx;
  torch::nn::ModuleList list;
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    layers.emplace_back(cfg, options, init);
    list->push_back(layers.back());
  }
  register_module("layers", list);
  norm = register_module("norm", RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, options, init));
}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const LlamaConfig& cfg, const at::TensorOptions& options, ParamInit init)
    : cfg_(cfg) {
  cfg_.validate("LlamaForCausalLM config");
  model = register_module("model", LlamaModel(cfg_, options, init));
  if (!cfg_.tie_word_embeddings)
    lm_head = register_module("lm_head", Linear(cfg_.hidden_size, cfg_.vocab_size, false, options, init));
}

at::Tensor LlamaForCausalLMImpl::lm_head_weight() const {
  return lm_head ? lm_head->weight : model->embed_tokens->weight;
}

TrainableTokensImpl* LlamaForCausalLMImpl::lm_head_token_adapter() const {
  return (lm_head ? lm_head->token_adapter : model->embed_tokens->token_adapter).get();
}

void LlamaForCausalLMImpl::set_layer_runner(LayerRunner runner) { runner_ = std::move(runner); }

at::Tensor LlamaForCausalLMImpl::embed(const at::Tensor& input_ids_bt) const {
  at::Tensor h_btd = model->embed_tokens->forward(input_ids_bt);
  if (!neftune_alpha_ || !is_training()) return h_btd;
  // transformers' hook: mag = alpha / sqrt(T * D) (a float32 tensor there), noise drawn in the
  // output's dtype and added.
  const float mag = static_cast<float>(*neftune_alpha_) / std::sqrt(static_cast<float>(h_btd.size(1) * h_btd.size(2)));
  return h_btd + at::empty_like(h_btd).uniform_(-mag, mag);
}

namespace {

// `allow` (B or 1, 1, T, K) with each query that may see no key allowed to see itself (`self_11tk`):
// a row with nothing to attend to gives NaN, which would poison the gradients although its output
// (a padded position) never reaches the loss. Expanded to the batch.
at::Tensor with_self_when_empty(const at::Tensor& allow, const at::Tensor& self_11tk, int64_t b) {
  const at::Tensor empty_row = at::logical_not(allow.any(-1, /*keepdim=*/true));
  return (allow | (empty_row & self_11tk)).expand({b, 1, allow.size(2), allow.size(3)});
}

// The sliding layers' context: `ctx` with the window's mask when it has one (else the same).
LayerContext window_context(const LayerContext& ctx) {
  LayerContext w = ctx;
  if (ctx.window_mask.defined()) w.attn_mask = ctx.window_mask;
  return w;
}

}  // namespace

LayerContext LlamaForCausalLMImpl::make_context(const at::Tensor& input_ids_bt, const at::Tensor& attention_mask_bt,
                                                const at::Tensor& position_ids_bt, const at::Tensor& segment_ids_bt,
                                                at::ScalarType dtype) const {
  const int64_t b = input_ids_bt.size(0), t = input_ids_bt.size(1);
  const at::Device device = input_ids_bt.device();
  at::Tensor pos = position_ids_bt;
  if (!pos.defined()) pos = at::arange(t, at::TensorOptions().dtype(at::kLong).device(device)).unsqueeze(0);
  ALPACA_CHECK(pos.dim() == 2 && pos.size(1) == t && (pos.size(0) == 1 || pos.size(0) == b),
               "position_ids must be (" << b << ", " << t << ") or (1, " << t << "), got " << pos.sizes());
  pos = pos.to(at::kLong).expand({b, t});
  LayerContext ctx;
  {
    ALPACA_TRACE("cat:rope");
    std::tie(ctx.cos, ctx.sin) = rope_cos_sin(cfg_, pos, dtype);
  }
  ALPACA_CHECK(!attention_mask_bt.defined() || attention_mask_bt.sizes() == input_ids_bt.sizes(),
               "attention_mask must match input_ids " << input_ids_bt.sizes() << ", got " << attention_mask_bt.sizes());

  // Like transformers, drop an all-ones padding mask so the fused causal kernel runs (and the
  // numbers match transformers', which takes the same shortcut).
  // A mask given on the host (the trainer's collated batch) is checked there, at no cost, and then
  // moved without a host wait; a mask already on the device costs a synchronisation to check.
  at::Tensor mask_bt = attention_mask_bt;
  bool has_padding = false;
  if (mask_bt.defined()) {
    if (!mask_bt.is_cpu()) util::count_host_sync();
    has_padding = !mask_bt.to(at::kBool).all().item<bool>();
    mask_bt = util::to_device_async(mask_bt, device);
  }
  // Sliding layers: transformers' sliding_window_overlay on the absolute indices (within a packed
  // document they differ as its positions do), kv > q - W, on top of the same causal, padding and
  // document masks.
  const bool windowed = window_cuts(t);
  if (has_padding || segment_ids_bt.defined() || windowed) {
    auto bopts = at::TensorOptions().dtype(at::kBool).device(device);
    at::Tensor allow_b1tt = at::ones({t, t}, bopts).tril().view({1, 1, t, t});
    if (mask_bt.defined()) {
      allow_b1tt = allow_b1tt & mask_bt.to(at::kBool).view({b, 1, 1, t});
    }
    if (segment_ids_bt.defined()) {
      ALPACA_CHECK(segment_ids_bt.sizes() == input_ids_bt.sizes(),
                   "segment_ids must match input_ids " << input_ids_bt.sizes() << ", got " << segment_ids_bt.sizes());
      allow_b1tt = allow_b1tt & (segment_ids_bt.view({b, 1, t, 1}) == segment_ids_bt.view({b, 1, 1, t}));
    }
    const at::Tensor self_11tt = at::eye(t, bopts).view({1, 1, t, t});
    if (windowed) {
      const at::Tensor window_11tt = at::ones({t, t}, bopts).triu(1 - *cfg_.sliding_window).view({1, 1, t, t});
      ctx.window_mask = with_self_when_empty(allow_b1tt & window_11tt, self_11tt, b);
    }
    // Without padding or documents the full layers need no mask (the fused causal kernel).
    if (has_padding || segment_ids_bt.defined()) ctx.attn_mask = with_self_when_empty(allow_b1tt, self_11tt, b);
  }
  return ctx;
}

LayerContext LlamaForCausalLMImpl::make_cached_context(int64_t b, int64_t t, int64_t cached,
                                                       const at::Tensor& attention_mask_bk,
                                                       const at::Tensor& position_ids_bt, const at::Device& device,
                                                       at::ScalarType dtype) const {
  const int64_t k = cached + t;
  auto lopts = at::TensorOptions().dtype(at::kLong).device(device);
  at::Tensor pos = position_ids_bt;
  if (!pos.defined()) pos = at::arange(cached, k, lopts).unsqueeze(0);
  ALPACA_CHECK(pos.dim() == 2 && pos.size(1) == t && (pos.size(0) == 1 || pos.size(0) == b),
               "position_ids must be (" << b << ", " << t << ") or (1, " << t << "), got " << pos.sizes());
  LayerContext ctx;
  std::tie(ctx.cos, ctx.sin) = rope_cos_sin(cfg_, pos.to(lopts).expand({b, t}), dtype);
  ALPACA_CHECK(!attention_mask_bk.defined() || (attention_mask_bk.dim() == 2 && attention_mask_bk.size(0) == b &&
                                                attention_mask_bk.size(1) == k),
               "attention_mask must be (" << b << ", " << k << ") = (batch, cached + new positions), got "
                                          << attention_mask_bk.sizes());
  // Sliding layers (the cache keeps every key): query at cache position p sees keys p - W < j <= p.
  const bool windowed = window_cuts(k);
  if (!attention_mask_bk.defined() && (t == 1 || cached == 0) && !windowed) return ctx;
  // Query i sits at cache position cached + i: it sees keys 0 .. cached + i.
  at::Tensor q_pos_t1 = at::arange(cached, k, lopts).view({t, 1});
  const at::Tensor k_pos_1k = at::arange(k, lopts).view({1, k});
  at::Tensor allow_b1tk = (k_pos_1k <= q_pos_t1).view({1, 1, t, k});
  if (attention_mask_bk.defined()) allow_b1tk = allow_b1tk & attention_mask_bk.to(device).to(at::kBool).view({b, 1, 1, k});
  const at::Tensor self_11tk = (k_pos_1k == q_pos_t1).view({1, 1, t, k});
  if (windowed) {
    const at::Tensor window_11tk = (k_pos_1k > q_pos_t1 - *cfg_.sliding_window).view({1, 1, t, k});
    ctx.window_mask = with_self_when_empty(allow_b1tk & window_11tk, self_11tk, b);
  }
  if (attention_mask_bk.defined() || !(t == 1 || cached == 0)) ctx.attn_mask = with_self_when_empty(allow_b1tk, self_11tk, b);
  return ctx;
}

at::Tensor LlamaForCausalLMImpl::forward_cached(const at::Tensor& input_ids_bt, KvCache& cache,
                                                const at::Tensor& attention_mask_bk, const at::Tensor& position_ids_bt,
                                                const at::Tensor& logit_index_b) {
  ALPACA_CHECK(input_ids_bt.dim() == 2 && input_ids_bt.scalar_type() == at::kLong,
               "input_ids must be int64 (batch, seq), got " << input_ids_bt.scalar_type() << " "
                                                            << input_ids_bt.sizes());
  const int64_t b = input_ids_bt.size(0), t = input_ids_bt.size(1);
  ALPACA_CHECK(b == cache.batch(), "input_ids has " << b << " rows but the KV cache holds " << cache.batch());
  at::Tensor h_btd = embed(input_ids_bt);
  LayerContext ctx = make_cached_context(b, t, cache.length(), attention_mask_bk, position_ids_bt,
                                         input_ids_bt.device(), h_btd.scalar_type());
  ctx.kv_cache = &cache;
  LayerContext window_ctx = window_context(ctx);
  auto& ls = model->layers;
  for (int64_t i = 0; i < static_cast<int64_t>(ls.size()); ++i) {
    LayerContext& c = cfg_.layer_slides(i) ? window_ctx : ctx;
    c.layer_idx = i;
    h_btd = runner_ ? runner_(i, h_btd, c) : ls[i]->forward(h_btd, c);
  }
  cache.advance(t);
  at::Tensor last_b1d;
  if (logit_index_b.defined()) {
    at::Tensor idx = logit_index_b.to(input_ids_bt.device(), at::kLong).view({b, 1, 1}).expand({b, 1, h_btd.size(2)});
    last_b1d = h_btd.gather(1, idx);
  } else {
    last_b1d = h_btd.narrow(1, t - 1, 1);
  }
  return head(last_b1d).squeeze(1);
}

at::Tensor LlamaForCausalLMImpl::head(const at::Tensor& hidden_btd) const {
  // A LoRA branch on lm_head (peft: lora.Linear, dropout included); apply_lora refuses it next to
  // trainable token rows.
  if (lm_head && lm_head->lora_A) return lm_head->forward(model->norm->forward(hidden_btd));
  const at::Tensor w = lm_head_weight();
  const TrainableTokensImpl* tok = lm_head_token_adapter();
  if (!tok) return model::linear(model->norm->forward(hidden_btd), w);
  // peft's TrainableTokensLayer on the head: F.linear(x, W.index_copy(0, indices, delta)).
  const at::Tensor merged = w.index_copy(0, tok->index(w.device()), tok->trainable_tokens_delta.to(w.scalar_type()));
  return model::linear(model->norm->forward(hidden_btd), merged);
}

at::Tensor LlamaForCausalLMImpl::decoder(const at::Tensor& input_ids_bt, const at::Tensor& attention_mask_bt,
                                         const at::Tensor& position_ids_bt, const at::Tensor& segment_ids_bt) {
  ALPACA_CHECK(input_ids_bt.dim() == 2 && input_ids_bt.scalar_type() == at::kLong,
               "input_ids must be int64 (batch, seq), got " << input_ids_bt.scalar_type() << " "
                                                            << input_ids_bt.sizes());
  at::Tensor h_btd = embed(input_ids_bt);
  LayerContext ctx = make_context(input_ids_bt, attention_mask_bt, position_ids_bt, segment_ids_bt,
                                  h_btd.scalar_type());
  auto& ls = model->layers;
  const LayerContext window_ctx = window_context(ctx);
  for (int64_t i = 0; i < static_cast<int64_t>(ls.size()); ++i) {
    const LayerContext& c = cfg_.layer_slides(i) ? window_ctx : ctx;
    h_btd = runner_ ? runner_(i, h_btd, c) : ls[i]->forward(h_btd, c);
  }
  return h_btd;
}

at::Tensor LlamaForCausalLMImpl::forward(const at::Tensor& input_ids_bt, const at::Tensor& attention_mask_bt,
                                         const at::Tensor& position_ids_bt, const at::Tensor& segment_ids_bt) {
  return head(decoder(input_ids_bt, attention_mask_bt, position_ids_bt, segment_ids_bt));
}

LossSum LlamaForCausalLMImpl::forward_loss_sum(const at::Tensor& input_ids_bt, const at::Tensor& labels_bt,
                                               const at::Tensor& attention_mask_bt, const at::Tensor& position_ids_bt,
                                               const at::Tensor& segment_ids_bt, int64_t chunk_tokens) {
  const at::Tensor h_btd = decoder(input_ids_bt, attention_mask_bt, position_ids_bt, segment_ids_bt);
  at::Tensor w = lm_head_weight();
  if (lm_head && lm_head->lora_A) {
    // The fused loss takes one weight: W + scaling * B A, the same logits as peft's
    // x W^T + scaling * (x A^T) B^T up to rounding, and the same gradients for A and B. peft's
    // dropout acts on the branch's input only, which one weight cannot express.
    ALPACA_CHECK(!(is_training() && lm_head->lora_dropout > 0),
                 "LoRA dropout on lm_head is not supported in training (the fused loss takes one weight); use "
                 "--lora_dropout 0 or leave lm_head out of --lora_target_modules");
    w = w + at::matmul(lm_head->lora_B->weight, lm_head->lora_A->weight).to(w.scalar_type()) * lm_head->lora_scaling;
  }
  const TrainableTokensImpl* tok = lm_head_token_adapter();
  if (!tok) return causal_lm_head_loss_sum(model->norm->forward(h_btd), w, labels_bt, chunk_tokens, {}, {}, loss_options_);
  return causal_lm_head_loss_sum(model->norm->forward(h_btd), w, labels_bt, chunk_tokens, tok->trainable_tokens_delta,
                                 tok->index(w.device()), loss_options_);
}

void LlamaForCausalLMImpl::resize_token_embeddings(int64_t new_vocab_size) {
  ALPACA_CHECK(new_vocab_size > 0, "resize_token_embeddings: new vocabulary size must be positive");
  const int64_t old = cfg_.vocab_size;
  if (new_vocab_size == old) return;
  at::NoGradGuard no_grad;
  auto resized = [&](const at::Tensor& w) {
    at::Tensor out = at::empty({new_vocab_size, w.size(1)}, w.options());
    const int64_t keep = std::min(old, new_vocab_size);
    out.narrow(0, 0, keep).copy_(w.narrow(0, 0, keep));
    return out;
  };
  auto& emb = model->embed_tokens->weight;
  emb.set_data(resized(emb));
  if (lm_head) lm_head->weight.set_data(resized(lm_head->weight));
  cfg_.vocab_size = new_vocab_size;
  // transformers keeps padding_idx unless the row is cut off.
  if (cfg_.embedding_padding_idx >= new_vocab_size) cfg_.embedding_padding_idx = -1;
  model->embed_tokens->padding_idx = cfg_.embedding_padding_idx;
  if (new_vocab_size > old) fill_rows_with_mean(old);
}

void LlamaForCausalLMImpl::fill_rows_with_mean(int64_t from) {
  const int64_t v = cfg_.vocab_size;
  ALPACA_CHECK(from > 0 && from <= v, "fill_rows_with_mean: row " << from << " is outside 1.." << v);
  if (from == v) return;
  at::NoGradGuard no_grad;
  auto fill = [&](const at::Tensor& w) {  // the mean in fp32, so bf16 weights get an accurate mean
    w.narrow(0, from, v - from).copy_(w.narrow(0, 0, from).to(at::kFloat).mean(0, true).expand({v - from, w.size(1)}));
  };
  fill(model->embed_tokens->weight);
  if (lm_head) fill(lm_head->weight);
}

int64_t num_parameters(LlamaForCausalLM& m) {
  int64_t n = 0;
  for (const auto& p : m->parameters()) n += p.numel();
  return n;
}

}  // namespace alpaca::model
