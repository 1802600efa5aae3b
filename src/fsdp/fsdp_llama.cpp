// FsdpLlama; see include/alpaca/fsdp/fsdp_llama.h.
#include "alpaca/fsdp/fsdp_llama.h"

#include "alpaca/dist/communicator.h"
#include "alpaca/util/error.h"

namespace alpaca::fsdp {

FsdpLlama::FsdpLlama(model::LlamaForCausalLM model, std::shared_ptr<dist::Communicator> comm,
                     const FsdpPolicy& policy)
    : model_(std::move(model)) {
  check_wrap_classes(policy, model_->config().model_type, "the model's config");
  engine_ = std::make_unique<FsdpEngine>(fsdp_parts(*model_), std::move(comm), policy);
  FsdpEngine* eng = engine_.get();
  model::LlamaForCausalLMImpl* m = model_.get();
  model_->set_layer_runner([eng, m](int64_t i, const at::Tensor& h, const model::LayerContext& ctx) {
    model::LlamaDecoderLayerImpl* layer = m->layers()[static_cast<size_t>(i)].get();
    // ctx is captured by value: a checkpointed layer re-runs with it in backward.
    return eng->run_layer(i, h, [layer, ctx](const at::Tensor& x) { return layer->forward(x, ctx); });
  });
}

FsdpLlama::~FsdpLlama() { model_->set_layer_runner({}); }

at::Tensor FsdpLlama::forward(const at::Tensor& input_ids_bt, const at::Tensor& attention_mask_bt,
                              const at::Tensor& position_ids_bt, const at::Tensor& segment_ids_bt) {
  const at::Device dev = engine_->comm().device();
  auto to_dev = [&](const at::Tensor& t) { return t.defined() ? t.to(dev) : t; };
  at::Tensor ids = to_dev(input_ids_bt), mask = to_dev(attention_mask_bt), pos = to_dev(position_ids_bt),
             seg = to_dev(segment_ids_bt);
  return engine_->forward([&] { return model_->forward(ids, mask, pos, seg); });
}

model::LossSum FsdpLlama::forward_loss_sum(const at::Tensor& input_ids_bt, const at::Tensor& labels_bt,
                                           const at::Tensor& attention_mask_bt, const at::Tensor& position_ids_bt,
                                           const at::Tensor& segment_ids_bt) {
  int64_t count = 0;
  at::Tensor token_stats;
  at::Tensor sum = engine_->forward([&] {
    model::LossSum ls =
        model_->forward_loss_sum(input_ids_bt, labels_bt, attention_mask_bt, position_ids_bt, segment_ids_bt);
    count = ls.num_tokens;
    token_stats = ls.token_stats;
    return ls.sum;
  });
  return {sum, count, token_stats};
}

FsdpModelParts fsdp_parts(model::LlamaForCausalLMImpl& model) {
  FsdpModelParts parts;
  parts.root = &model;
  for (auto& layer : model.layers()) parts.layers.push_back(layer.get());
  // Untied, the embedding is its own unit: its full gradient exists only at the end of backward,
  // and [norm, lm_head]'s is reduced right after the head. Tied, the table is also the head: one unit.
  if (!model.config().tie_word_embeddings) parts.embed = model.model->embed_tokens.ptr().get();
  return parts;
}

std::unique_ptr<FsdpLlama> apply_fsdp(model::LlamaForCausalLM model, std::shared_ptr<dist::Communicator> comm,
                                      const FsdpPolicy& policy) {
  return std::make_unique<FsdpLlama>(std::move(model), std::move(comm), policy);
}

}  // namespace alpaca::fsdp
