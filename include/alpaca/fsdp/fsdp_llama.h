// apply_fsdp for the project's LlamaForCausalLM: one unit per LlamaDecoderLayer plus the root
// (embed_tokens, model.norm, lm_head; tied weights stored once), installed through the model's
// layer-runner hook. The returned object owns the engine and uninstalls the hook when destroyed.
#pragma once

#include <memory>

#include "alpaca/fsdp/engine.h"
#include "alpaca/model/llama.h"

namespace alpaca::fsdp {

class FsdpLlama {
 public:
  // Collective over comm. The model's current parameter values become the initial shards (all
  // ranks must hold the same values unless policy.sync_module_states, which broadcasts rank 0's);
  // afterwards the model holds no full copy of its parameters. A model built on the meta device
  // (no storage at all) is the low-memory path: its shards start at zero and take their values
  // from load_checkpoint / load_parameters, so no rank ever allocates the full model.
  FsdpLlama(model::LlamaForCausalLM model, std::shared_ptr<dist::Communicator> comm, const FsdpPolicy& policy);
  ~FsdpLlama();
  FsdpLlama(const FsdpLlama&) = delete;
  FsdpLlama& operator=(const FsdpLlama&) = delete;

  // The model's forward under the engine: logits (B, T, V) in param_dtype.
  at::Tensor forward(const at::Tensor& input_ids_bt, const at::Tensor& attention_mask_bt = {},
                     const at::Tensor& position_ids_bt = {}, const at::Tensor& segment_ids_bt = {});

  FsdpEngine& engine() { return *engine_; }
  model::LlamaForCausalLM& model() { return model_; }

 private:
  model::LlamaForCausalLM model_;
  std::unique_ptr<FsdpEngine> engine_;
};

// Convenience: the same as std::make_unique<FsdpLlama>(...).
std::unique_ptr<FsdpLlama> apply_fsdp(model::LlamaForCausalLM model, std::shared_ptr<dist::Communicator> comm,
                                      const FsdpPolicy& policy);

}  // namespace alpaca::fsdp
