// LlamaForCausalLM: the Hugging Face LLaMA causal LM as a single-device LibTorch module whose
// named_parameters() are exactly the HF state-dict names. The FSDP engine drives the decoder
// layers through set_layer_runner(); the model knows nothing of sharding or communicators.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include <ATen/ATen.h>          // defines: at::Tensor
#include <torch/nn/module.h>    // defines: torch::nn::Module
#include <torch/nn/pimpl.h>     // defines: TORCH_MODULE

#include "alpaca/model/config.h"
#include "alpaca/model/kv_cache.h"
#include "alpaca/model/layers.h"
#include "alpaca/model/loss.h"

namespace alpaca::model {

// Runs decoder layer `layer_idx`; FSDP installs one that unshards / reshards around the call.
using LayerRunner =
    std::function<at::Tensor(int64_t layer_idx, const at::Tensor& hidden_btd, const LayerContext& ctx)>;

// "model": embed_tokens, layers.{i}, norm.
class LlamaModelImpl : public torch::nn::Module {
 public:
  LlamaModelImpl(const LlamaConfig& cfg, const at::TensorOptions& options, ParamInit init = ParamInit::kDefault);
  Embedding embed_tokens{nullptr};
  std::vector<LlamaDecoderLayer> layers;  // also registered as "layers.{i}"
  RMSNorm norm{nullptr};
};
TORCH_MODULE(LlamaModel);

class LlamaForCausalLMImpl : public torch::nn::Module {
 public:
  // Parameters are created with `options` (dtype, device; the meta device gives a model with no
  // storage). Values (kDefault): zeros for linear/embedding weights and biases, ones for norms;
  // call init_weights() for a random model or io::load_hf_weights() for a checkpoint.
  explicit LlamaForCausalLMImpl(const LlamaConfig& cfg, const at::TensorOptions& options = at::kFloat,
                                ParamInit init = ParamInit::kDefault);

  // input_ids_bt: int64 (B, T). attention_mask_bt: 1/true = real token (undefined = all real); it
  // may stay on the host (its padding is then checked there and it moves without a host wait).
  // position_ids_bt: (B, T) or (1, T) (undefined = 0..T-1). segment_ids_bt: packing, attend only
  // inside equal ids. Returns logits (B, T, V) in the parameter dtype.
  at::Tensor forward(const at::Tensor& input_ids_bt, const at::Tensor& attention_mask_bt = {},
                     const at::Tensor& position_ids_bt = {}, const at::Tensor& segment_ids_bt = {});

  // Training forward: the summed shifted cross-entropy against labels_bt (int64 (B, T), -100 =
  // ignored) through the fused chunked head (causal_lm_head_loss_sum), never forming the logits.
  LossSum forward_loss_sum(const at::Tensor& input_ids_bt, const at::Tensor& labels_bt,
                           const at::Tensor& attention_mask_bt = {}, const at::Tensor& position_ids_bt = {},
                           const at::Tensor& segment_ids_bt = {}, int64_t chunk_tokens = 0);

  // Generation forward over a KV cache (no autograd needed; call under at::NoGradGuard).
  // input_ids_bt: the T new tokens of each of the cache's B rows. attention_mask_bk: (B, L + T)
  // where L = cache.length(), 1 = real token, covering the cached positions too (transformers'
  // generate keeps extending it); undefined = no padding anywhere. position_ids_bt: (B, T)
  // (undefined = L .. L+T-1). logit_index_b: int64 (B), which of the T positions to return
  // logits for (undefined = the last one, as transformers' logits_to_keep=1). Writes the T
  // positions into the cache, advances it, and returns logits (B, V) in the parameter dtype.
  at::Tensor forward_cached(const at::Tensor& input_ids_bt, KvCache& cache, const at::Tensor& attention_mask_bk = {},
                            const at::Tensor& position_ids_bt = {}, const at::Tensor& logit_index_b = {});
  // The mask and RoPE of forward_cached (exposed for tests): query i of row b (at cache position
  // L + i) sees key j when j <= L + i and attention_mask_bk[b, j]; a query that would see nothing
  // (a padding position) sees itself, so no NaN appears. No mask for T = 1 or an empty cache
  // without padding (the fused causal kernel, as transformers).
  LayerContext make_cached_context(int64_t batch, int64_t num_new, int64_t cached, const at::Tensor& attention_mask_bk,
                                   const at::Tensor& position_ids_bt, const at::Device& device,
                                   at::ScalarType dtype) const;

  // The pieces of forward, for callers that run the root unit themselves. In training mode with
  // NEFTune set, embed adds its noise (set_neftune_noise_alpha).
  at::Tensor embed(const at::Tensor& input_ids_bt) const;  // (B, T, D)
  LayerContext make_context(const at::Tensor& input_ids_bt, const at::Tensor& attention_mask_bt,
                            const at::Tensor& position_ids_bt, const at::Tensor& segment_ids_bt,
                            at::ScalarType dtype) const;
  at::Tensor head(const at::Tensor& hidden_btd) const;     // final norm + lm_head -> (B, T, V)

  std::vector<LlamaDecoderLayer>& layers() { return model->layers; }
  void set_layer_runner(LayerRunner runner);  // empty = default: layers()[i]->forward(h, ctx)
  // NEFTune (transformers' neftune_post_forward_hook): in training mode, embed's output gets
  // uniform noise in [-a, a], a = alpha / sqrt(T * D), drawn from the default generator (so a
  // checkpoint's RNG state resumes it); nullopt = none. Evaluation mode adds nothing.
  void set_neftune_noise_alpha(std::optional<double> alpha) { neftune_alpha_ = alpha; }
  // What forward_loss_sum's tokens contribute (label smoothing, DFT; loss.h), in training and
  // evaluation alike, as HF's label smoother and TRL's DFT loss act in both.
  void set_loss_options(const LossOptions& options) { loss_options_ = options; }
  bool has_layer_runner() const { return static_cast<bool>(runner_); }

  // Grows (or shrinks) the vocabulary; new rows are the mean of the old rows in the input and
  // output embeddings (Stanford Alpaca's smart_tokenizer_and_embedding_resize).
  void resize_token_embeddings(int64_t new_vocab_size);
  // Rows from..V-1 of the input and output embeddings := the fp32 mean of rows 0..from-1 (train.py's
  // last num_new_tokens rows after its resize). 0 < from <= V.
  void fill_rows_with_mean(int64_t from);

  const LlamaConfig& config() const { return cfg_; }
  // Whether a sliding layer's window cuts a sequence of `positions` positions (a generation's cached
  // + new): past that, plain causal attention is not the model's. make_context and
  // make_cached_context then mask the window; a caller running the layers another way (CpuDecoder,
  // which has no window) switches to forward_cached there.
  bool window_cuts(int64_t positions) const {
    return cfg_.sliding_window && positions > *cfg_.sliding_window && cfg_.any_layer_slides();
  }
  // The output projection (V, D): lm_head.weight, or embed_tokens.weight when tied.
  at::Tensor lm_head_weight() const;
  // The head's trainable token rows (peft trainable_token_indices; tied: the embedding's), or null.
  TrainableTokensImpl* lm_head_token_adapter() const;

  LlamaModel model{nullptr};
  Linear lm_head{nullptr};  // null when tie_word_embeddings (then embed_tokens' weight is used)

 private:
  LlamaConfig cfg_;
  LayerRunner runner_;
  std::optional<double> neftune_alpha_;
  LossOptions loss_options_;
  at::Tensor decoder(const at::Tensor& input_ids_bt, const at::Tensor& attention_mask_bt,
                     const at::Tensor& position_ids_bt, const at::Tensor& segment_ids_bt);  // before the final norm
};
TORCH_MODULE(LlamaForCausalLM);

// transformers' _init_weights: normal(0, initializer_range) for linear and embedding weights,
// zero biases, zero padding row of the embedding, ones for norms. Deterministic in `seed`.
void init_weights(LlamaForCausalLM& m, uint64_t seed);

// Number of parameters (tied weights counted once).
int64_t num_parameters(LlamaForCausalLM& m);

}  // namespace alpaca::model
