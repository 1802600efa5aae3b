// The LLaMA building blocks (linear, RMSNorm, attention, MLP, decoder layer) as LibTorch modules
// whose parameter names match Hugging Face's, so a named_parameters() walk is a state dict.
// Single-device code: the FSDP engine wraps each LlamaDecoderLayer call from outside.
#pragma once

#include <ATen/ATen.h>          // defines: at::Tensor
#include <torch/nn/module.h>    // defines: torch::nn::Module
#include <torch/nn/pimpl.h>     // defines: TORCH_MODULE

#include <vector>

#include "alpaca/model/config.h"

namespace alpaca::model {

class KvCache;  // alpaca/model/kv_cache.h

// How constructors fill parameters. kUninitialized (at::empty) is for loaders that overwrite
// every parameter: no fill pass, and untouched pages cost no resident memory.
enum class ParamInit { kDefault /* zeros; ones for norm weights */, kUninitialized };

// Per-forward tensors shared by every decoder layer (computed once by the root module).
struct LayerContext {
  at::Tensor cos;        // (B, T, head_dim) in the compute dtype
  at::Tensor sin;        // (B, T, head_dim) in the compute dtype
  at::Tensor attn_mask;  // undefined => pure causal; else bool (B, 1, T, K), true = attend
  // The sliding layers' mask (LlamaConfig::layer_slides): attn_mask within the window; undefined
  // when the window cuts nothing (T <= W), where those layers take attn_mask.
  at::Tensor window_mask;
  // Generation: the layer appends its keys/values to `kv_cache` (layer `layer_idx`) and attends
  // over every cached position (K = cached + T). Null in training.
  KvCache* kv_cache = nullptr;
  int64_t layer_idx = -1;
};

// peft's TrainableTokensLayer (trainable_token_indices): a few rows of a frozen table trained on
// their own. "trainable_tokens_delta" (k, D) holds the *values* of rows `token_indices` (peft
// replaces, it does not add: W' = W.index_copy(0, indices, delta)); it is the only trainable
// parameter, so only those rows get gradients. Attached by model::apply_lora to embed_tokens and,
// untied, lm_head (tied, the head uses the embedding's adapter, as peft ties them).
class TrainableTokensImpl : public torch::nn::Module {
 public:
  TrainableTokensImpl(std::vector<int64_t> token_indices, int64_t dim);
  // The indices as an int64 tensor on `device` (the delta's rows, in order).
  at::Tensor index(const at::Device& device) const;
  std::vector<int64_t> token_indices;
  at::Tensor trainable_tokens_delta;  // (k, D) fp32
};
TORCH_MODULE(TrainableTokens);

// y = x W^T (+ b). Parameters "weight" (out, in) and optionally "bias" (out).
// With a LoRA adapter attached (model::apply_lora, peft's lora.Linear):
//   y = x W^T (+ b) + s * B(A(dropout(x))), A = "lora_A.weight" (r, in), B = "lora_B.weight" (out, r),
// or its DoRA form (lora_magnitude below).
class LinearImpl : public torch::nn::Module {
 public:
  LinearImpl(int64_t in_features, int64_t out_features, bool bias, const at::TensorOptions& options,
             ParamInit init = ParamInit::kDefault);
  at::Tensor forward(const at::Tensor& x) const;
  at::Tensor weight;
  at::Tensor bias;  // undefined without bias

  // LoRA branch (null without an adapter). Dropout acts only on the branch's input and only while
  // the module is in training mode (torch::nn::Module::train / eval).
  std::shared_ptr<LinearImpl> lora_A, lora_B;
  double lora_scaling = 0.0;
  double lora_dropout = 0.0;
  // DoRA (peft use_dora; undefined without): the trainable magnitude m, "lora_magnitude_vector" (out).
  // peft's DoraLinearLayer: with n = ||W + s B A||_row (detached, as the DoRA paper's section 4.3
  // asks) and g = m / n, y = x W^T (+ b) + (g - 1) (x W^T) + g s B(A(x)); under dropout the middle
  // term takes the dropped input, as peft recomputes it.
  at::Tensor lora_magnitude;
  // Trainable rows of `weight` (lm_head's added tokens; null without). Only the LM head's weight
  // is used this way (LlamaForCausalLMImpl::head / forward_loss_sum); forward() ignores it.
  std::shared_ptr<TrainableTokensImpl> token_adapter;

 private:
  at::Tensor dora_forward(const at::Tensor& x, const at::Tensor& result) const;
};
TORCH_MODULE(Linear);

// DoRA's column norm (peft get_weight_norm): ||W + scaling * lora_weight|| over each output row,
// in W's dtype; lora_weight = B A, or undefined for ||W|| (a fresh adapter, B = 0).
at::Tensor dora_weight_norm(const at::Tensor& weight, const at::Tensor& lora_weight, double scaling);

// Token embedding table "weight" (V, D). With `token_adapter`, the rows it holds come from its
// delta (peft's TrainableTokensLayer: embedding(W.index_copy(0, indices, delta), ids)).
class EmbeddingImpl : public torch::nn::Module {
 public:
  EmbeddingImpl(int64_t num_embeddings, int64_t dim, const at::TensorOptions& options,
                ParamInit init = ParamInit::kDefault);
  at::Tensor forward(const at::Tensor& ids) const;
  at::Tensor weight;
  int64_t padding_idx = -1;  // as torch.nn.Embedding: this row's gradient is zero; -1 = none
  std::shared_ptr<TrainableTokensImpl> token_adapter;
};
TORCH_MODULE(Embedding);

// LLaMA RMSNorm exactly as transformers: normalise in fp32, cast back, then scale.
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps, const at::TensorOptions& options, ParamInit init = ParamInit::kDefault);
  at::Tensor forward(const at::Tensor& x) const;
  at::Tensor weight;  // (dim)
  double eps;
};
TORCH_MODULE(RMSNorm);

class LlamaAttentionImpl : public torch::nn::Module {
 public:
  LlamaAttentionImpl(const LlamaConfig& cfg, const at::TensorOptions& options,
                     ParamInit init = ParamInit::kDefault);
  at::Tensor forward(const at::Tensor& x_btd, const LayerContext& ctx) const;
  Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};

 private:
  int64_t num_heads_, num_kv_heads_, head_dim_;
};
TORCH_MODULE(LlamaAttention);

class LlamaMLPImpl : public torch::nn::Module {
 public:
  LlamaMLPImpl(const LlamaConfig& cfg, const at::TensorOptions& options,
               ParamInit init = ParamInit::kDefault);
  at::Tensor forward(const at::Tensor& x_btd) const;
  Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(LlamaMLP);

class LlamaDecoderLayerImpl : public torch::nn::Module {
 public:
  LlamaDecoderLayerImpl(const LlamaConfig& cfg, const at::TensorOptions& options,
                        ParamInit init = ParamInit::kDefault);
  // hidden_btd: (B, T, hidden) in the parameter dtype; returns the same shape.
  at::Tensor forward(const at::Tensor& hidden_btd, const LayerContext& ctx);
  LlamaAttention self_attn{nullptr};
  LlamaMLP mlp{nullptr};
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(LlamaDecoderLayer);

}  // namespace alpaca::model
