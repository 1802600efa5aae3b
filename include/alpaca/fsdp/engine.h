// The FSDP engine (DESIGN.md "FSDP"): wraps a single-device model from outside. One unit per
// decoder layer plus the root: the embedding and [final norm, lm_head] as two units, or one root
// unit when the embedding is tied to the head (fsdp/unit_plan.h; tied weights stored once). Each unit's parameters live in FlatParameters sharded across ranks; the
// engine all-gathers a unit just before it runs (prefetching one unit ahead), frees it after
// (FULL_SHARD/HYBRID), gathers it again for backward, and reduce-scatters its gradient into fp32
// gradient shards that accumulate across micro-steps.
//
// Gradient scaling (explicit): the engine sums per-rank gradients and never divides, so the
// trainer must differentiate sum(token losses on this rank) / (label tokens over all ranks and all
// micro-steps of the optimizer step); the accumulated gradient shard is then exactly the gradient
// of the global mean loss, for any split into world x micro-batch x accumulation.
//
// Model contract: the model calls every decoder layer through a hook (`run_layer`), and uses its
// root parameters only before the first and after the last decoder layer (with a split root: the
// embedding's only before the first, the others only after the last). Every trainable parameter
// gets a gradient in every backward (or none on any rank).
#pragma once

#include <ATen/ATen.h>          // defines: at::Tensor
#include <torch/nn/module.h>    // defines: torch::nn::Module

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "alpaca/fsdp/flat_param.h"
#include "alpaca/fsdp/policy.h"
#include "alpaca/fsdp/unit_plan.h"
#include "alpaca/optim/adamw.h"

namespace alpaca::dist {
class Communicator;
}

namespace alpaca::model {
struct Quant4Tensor;
}

namespace alpaca::fsdp {

// Per-rank model-state bytes (printed at start, queried by tests).
struct MemoryAccount {
  int64_t param_bytes = 0;       // fp32 master shards of the trainable parameters
  int64_t frozen_bytes = 0;      // frozen shards (LoRA base weights), stored in param_dtype (or 4-bit)
  int64_t quant4_params = 0;     // --load_in_4bit: frozen values held 4-bit (all ranks' shards together)
  int64_t grad_bytes = 0;        // fp32 gradient shards
  int64_t optimizer_bytes = 0;   // optimizer moments (when an optimizer is passed)
  int64_t unsharded_bytes = 0;   // full buffers allocated now (params in param_dtype + grads in reduce_dtype)
  int64_t peak_unsharded_bytes = 0;
  int num_unsharded_units = 0;   // units whose full parameters are allocated now
  int peak_unsharded_units = 0;  // maximum since construction / reset_peaks()
  int64_t persistent_bytes() const { return param_bytes + frozen_bytes + grad_bytes + optimizer_bytes; }
  std::string to_string() const;
};

// Reads elements [begin, end) of the flattened HF parameter `name` (whose model shape is `shape`;
// the reader must fail naming the tensor if its source differs) into `out` (1-D, end - begin
// elements, fp32, CPU). Backed by a safetensors byte-range reader, so each rank reads only its shard.
using ParamRangeReader = std::function<void(const std::string& name, const std::vector<int64_t>& shape,
                                            int64_t begin, int64_t end, at::Tensor out)>;
// A frozen parameter a checkpoint stores already 4-bit (bitsandbytes' pre-quantized layout): fills
// `out` with its packed bytes and quant_state and returns true; false when `name` is stored as plain
// values (it is then read through the ParamRangeReader and quantized). Must fail naming the tensor
// when what is stored disagrees with the model's `shape`. Tensors may be zero-copy views of a
// mapping: the engine copies only this rank's bytes out of them.
using Quant4Reader = std::function<bool(const std::string& name, const std::vector<int64_t>& shape,
                                        model::Quant4Tensor& out)>;
// Receives one full parameter (fp32, CPU, its original shape) under its primary HF name.
using NamedTensorSink = std::function<void(const std::string& name, const at::Tensor& value)>;
// Receives one optimizer state tensor: (parameter name, state key "exp_avg"/"exp_avg_sq", value).
using OptimStateSink =
    std::function<void(const std::string& name, const std::string& key, const at::Tensor& value)>;
// Returns the full optimizer state tensor for (name, key) (fp32, CPU, parameter shape).
using OptimStateSource = std::function<at::Tensor(const std::string& name, const std::string& key)>;

// One parameter's elements in this rank's shard: what a sharded checkpoint writes and reads on
// this rank. `values` views the shard (fp32; a frozen shard may be in param_dtype).
struct LocalParamShard {
  std::string name;
  std::vector<int64_t> shape;
  int64_t param_begin = 0, param_end = 0;  // of the flattened parameter
  bool trainable = false;
  size_t optim_index = 0;    // trainable: its shard in optim_shards() / ShardedAdamW
  int64_t shard_offset = 0;  // where the elements start inside that shard
  at::Tensor values;
};

class FsdpEngine {
 public:
  // Collective over comm (and the sub-communicators it creates for HYBRID_SHARD).
  FsdpEngine(const FsdpModelParts& parts, std::shared_ptr<dist::Communicator> comm, FsdpPolicy policy);
  ~FsdpEngine();
  FsdpEngine(const FsdpEngine&) = delete;
  FsdpEngine& operator=(const FsdpEngine&) = delete;

  // Runs the whole model's forward `fn` (which calls run_layer for each decoder layer).
  at::Tensor forward(const std::function<at::Tensor()>& fn);
  // Runs decoder layer `idx` on `hidden_btd`: unshard/prefetch, optional activation checkpointing,
  // reshard. `layer_fn` must be callable again in backward when checkpointing (capture by value).
  at::Tensor run_layer(int64_t idx, const at::Tensor& hidden_btd,
                       std::function<at::Tensor(const at::Tensor&)> layer_fn);

  // Zeroes the fp32 gradient shards (call after each optimizer step).
  void zero_grad();
  // The optimizer's view of this rank's trainable shards (segments carry HF's weight-decay mask).
  // per_parameter: one segment per parameter part with its extent, its parameter (every parameter
  // of the flat buffer listed, name and shape) and whether it is an nn.Embedding weight
  // (bitsandbytes' 8-bit AdamW, Adafactor); else adjacent parts with the same decay merge.
  std::vector<optim::OptimShard> optim_shards(bool per_parameter = false) const;
  // An all-reduce MAX over the shard group (8-bit AdamW's blocks cut by shard boundaries).
  optim::BlockMaxReducer block_max_reducer() const;
  // An all-reduce SUM over the shard group (Adafactor's statistics).
  optim::ShardReducer sum_reducer() const;
  std::vector<at::Tensor> grad_shards() const;
  // The communicator whose ranks hold disjoint gradient shards (nullptr: this rank holds all),
  // for global-norm clipping and overflow checks.
  dist::Communicator* norm_comm() const;
  dist::Communicator& comm() const { return *comm_; }

  // Loads parameter values; each rank reads only its own shard's ranges unless rank0_only
  // (sync_module_states / cpu_ram_efficient_loading), where rank 0 reads one unit at a time and
  // broadcasts it. Collective.
  // `include` (empty = every parameter) picks the parameters to read; the others keep their values
  // (LoRA: the base checkpoint has no adapter tensors; an adapter file has only those).
  // Under --load_in_4bit, `quant` (optional, present on every rank) gives the layers' frozen
  // linears as stored 4-bit bytes: each rank copies its own shard's bytes, nothing is dequantized.
  void load_parameters(const ParamRangeReader& reader, bool rank0_only,
                       const std::function<bool(const std::string&)>& include = {}, const Quant4Reader& quant = {});
  // Gathers every parameter one unit at a time (fp32) and hands it to `sink` on rank 0 only (all
  // ranks when all_ranks). Collective; no rank ever holds more than one unit in full.
  void export_full_state(const NamedTensorSink& sink, bool all_ranks = false);
  // The same for the trainable parameters only (a LoRA adapter and its modules_to_save): the
  // frozen base is never gathered. Collective.
  void export_trainable_state(const NamedTensorSink& sink, bool all_ranks = false);
  // Rows [row_begin, row_end) of the 2-D parameter `name` (fp32, CPU, (rows, cols)) on every rank,
  // assembled from the shards that hold them (an all-reduce of rows x cols elements, never the
  // whole tensor). Collective. Throws naming the parameter when it is unknown or not 2-D.
  at::Tensor gather_rows(const std::string& name, int64_t row_begin, int64_t row_end);
  // Optimizer moments per parameter name (resume on another world size). Collective.
  void gather_optimizer_state_by_name(optim::ShardedAdamW& opt, const OptimStateSink& sink,
                                      bool all_ranks = false);
  void load_optimizer_state_by_name(optim::ShardedAdamW& opt, const OptimStateSource& source);

  // Every parameter part in this rank's shards, in unit order (no padding). Local.
  std::vector<LocalParamShard> local_param_shards() const;
  // (index, count) of the ranks holding this rank's shards (NO_SHARD, HYBRID_SHARD replicas; (0, 1)
  // otherwise), so a checkpoint writer can split a replicated shard between them.
  std::pair<int, int> shard_replica() const;

  // Memory probe (auto_find_batch_size): while on, every gather and reduce-scatter allocates
  // exactly the buffers it would, but nothing is communicated and no gradient reaches the shards,
  // so one rank can run a forward/backward alone to learn whether it fits. Values computed in a
  // probe are meaningless. Local; call zero_grad() after a probe.
  void set_memory_probe(bool on);
  bool memory_probe() const;
  // After an exception (e.g. out of memory) in forward or backward: reshards every unit and drops
  // the full gradients and the reduction in flight, so the next forward starts clean. Local.
  void abandon_step();

  MemoryAccount memory_account(const optim::ShardedAdamW* opt = nullptr) const;
  void reset_peaks();
  void log_memory_account(const optim::ShardedAdamW* opt = nullptr) const;

  const FsdpPolicy& policy() const { return policy_; }
  int num_units() const;
  // The layout the engine was built from (fsdp::plan_units).
  const UnitPlan& unit_plan() const;
  // Introspection for tests: the trainable / frozen FlatParameter of unit u (nullptr if none);
  // units after the decoder layers are the root's (unit_plan().embed_unit, head_unit).
  const FlatParameter* trainable_flat(int u) const;
  const FlatParameter* frozen_flat(int u) const;
  // Bytes this rank stores for unit u's frozen base: its param_dtype shard, or under --load_in_4bit
  // a decoder layer's 4-bit blob shard (fsdp/quant_layout.h).
  int64_t frozen_shard_bytes(int u) const;

  struct Impl;  // public so the autograd glue in the .cpp can reach it

 private:
  std::unique_ptr<Impl> impl_;
  std::shared_ptr<dist::Communicator> comm_;
  FsdpPolicy policy_;
};

// HF's weight-decay exclusion (Trainer.get_decay_parameter_names): biases and norm weights.
bool hf_no_weight_decay(const std::string& param_name);

}  // namespace alpaca::fsdp
