// apply_fsdp for the project's LlamaForCausalLM: one unit per LlamaDecoderLayer plus the root
// (embed_tokens, model.norm, lm_head; tied weights stored once), installed through the model's
// layer-runner hook. The returned object owns the engine and uninstalls the hook when destroyed.
//
// The trainer wraps its model through apply_fsdp too (train/trainer_setup.cpp), so the FSDP
// tests exercise the path users run. The training step the engine expects (train/ owns the real
// loop, src/train/trainer_loop.cpp):
//   FsdpPolicy policy = build_fsdp_policy({.fsdp = "full_shard auto_wrap", .mixed_precision = "bf16", ...});
//   auto fsdp = apply_fsdp(model::LlamaForCausalLM(cfg, at::TensorOptions().device(at::kMeta)), comm, policy);
//   load_checkpoint(fsdp->engine(), dir, policy.cpu_ram_efficient_loading);
//   optim::ShardedAdamW opt(fsdp->engine().optim_shards(), {beta1, beta2, eps, weight_decay});
//   per optimizer step: global_tokens = all-reduced label-token count of all micro-batches
//     per micro-batch: loss = fsdp->forward_loss_sum(ids, labels, mask).sum / global_tokens;
//                      (fp16: loss * scaler.scale()).backward();
//     [fp16: if (!scaler.unscale_or_skip(engine.grad_shards(), &comm)) { engine.zero_grad(); skip; }]
//     norm = optim::clip_grad_norm(engine.grad_shards(), max_grad_norm, engine.norm_comm());
//     opt.step(optim::learning_rate(schedule, step)); engine.zero_grad();
//   save: engine.export_full_state(sink into io::HfExportWriter on rank 0) and
//         engine.gather_optimizer_state_by_name(opt, sink) (+ opt.step_count()).
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

  // The model's fused-head loss under the engine (model::LlamaForCausalLM::forward_loss_sum: no
  // (B, T, V) logits); what the trainer differentiates. input_ids (and position/segment ids) must
  // be on the engine's device; labels and the attention mask may stay on the host, where their
  // counts and padding are read without a device synchronisation (the trainer passes them so).
  model::LossSum forward_loss_sum(const at::Tensor& input_ids_bt, const at::Tensor& labels_bt,
                                  const at::Tensor& attention_mask_bt = {}, const at::Tensor& position_ids_bt = {},
                                  const at::Tensor& segment_ids_bt = {});

  FsdpEngine& engine() { return *engine_; }
  model::LlamaForCausalLM& model() { return model_; }

 private:
  model::LlamaForCausalLM model_;
  std::unique_ptr<FsdpEngine> engine_;
};

// The parts FsdpLlama wraps: the model, its decoder layers and (untied) its input embedding, the
// root's first unit. The memory planner passes the same parts to plan_units.
FsdpModelParts fsdp_parts(model::LlamaForCausalLMImpl& model);

// Convenience: the same as std::make_unique<FsdpLlama>(...).
std::unique_ptr<FsdpLlama> apply_fsdp(model::LlamaForCausalLM model, std::shared_ptr<dist::Communicator> comm,
                                      const FsdpPolicy& policy);

}  // namespace alpaca::fsdp
