// The memory planner: per-rank device and host bytes of one training configuration, computed from
// the model's shape alone (config.json; no weights, no GPU), by replaying what the FSDP engine,
// the model and the fused loss allocate and when (src/fsdp/engine.cpp, src/model/layers.cpp,
// src/model/loss.cpp). The units and their shards are not re-derived: the planner builds the
// model training would build on the meta device (with apply_lora for --use_peft) and calls
// fsdp::plan_units on it, as the engine does. The peak is the largest of the moments where live
// memory is highest (the root is two units, the embedding and [norm, lm_head], unless tied):
//   forward at the loss   states + gathered head unit + saved activations of every layer + the
//                         fused loss's logits chunk and its gradient buffers
//   backward at the head  states + head unit + activations + lm_head gradient + head gradient buffer
//   backward in a layer   states + activations left + gathered layer(s) (with prefetch, at most
//                         two units under limit_all_gathers) + its and the previous unit's full
//                         gradients (one reduce-scatter in flight: the head's, in the last layer)
//                         + the layer's backward temporaries (+ one recomputed layer under
//                         checkpointing); one root unit keeps its gradient buffer here too
//   end of backward       states + embedding gradient + its reduce-scatter staging
// plus the allocator margin on a GPU. DeepSpeed's ZeRO-3 estimator (model states only) is computed
// beside it for comparison. Knows nothing of TrainArgs: cli builds MemoryPlanInputs.
#pragma once

#include <c10/core/ScalarType.h>  // defines: at::ScalarType

#include <cstdint>
#include <string>
#include <vector>

#include "alpaca/fsdp/policy.h"
#include "alpaca/model/config.h"

namespace alpaca::plan {

struct MemoryPlanInputs {
  model::LlamaConfig config;     // vocab_size already as trained (after any [PAD] row)
  int64_t micro_batch = 1;       // per_device_train_batch_size
  int64_t seq_len = 512;         // model_max_length: every sequence assumed full (the worst case)
  int num_ranks = 1;
  int ranks_per_node = 1;
  bool gpu = true;               // ranks are GPUs; false: CPU ranks (device memory = host memory)
  bool cpu_bf16_via_fp32 = false;  // CPU ranks whose bf16 GEMMs take the fp32 route (model/matmul.h)
  bool cpu_bf16_head_grad_in_gemm = false;  // CPU ranks summing the bf16 lm_head gradient in our GEMM (model/loss.h)
  fsdp::ShardingStrategy strategy = fsdp::ShardingStrategy::kFullShard;
  bool auto_wrap = true;
  at::ScalarType param_dtype = at::kFloat;
  at::ScalarType reduce_dtype = at::kFloat;
  bool offload = false;
  bool checkpointing = false;
  // --save_async with saves on (trainer_sharded_ckpt.cpp): every rank keeps a host staging buffer
  // for what it writes (fp32 trainable shards and both AdamW moments, this rank's part when
  // shards are replicated), resident from the start of the run to its end, beside every step.
  bool async_checkpoint = false;
  // --optim adamw_bnb_8bit / adamw_8bit / paged_adamw_8bit: bitsandbytes' 8-bit moments (codes and a
  // scale per 256 elements of each parameter; fp32 for embeddings and parameters under 4096).
  bool adamw_8bit = false;
  // --optim lion_*: bitsandbytes' Lion, one moment (8-bit with adamw_8bit's layout when that is set).
  bool lion = false;
  // --optim adafactor: transformers' Adafactor, whose statistics (a matrix's row and column means, a
  // vector's elements) every rank holds whole for every trainable parameter, instead of moments.
  bool adafactor = false;
  fsdp::BackwardPrefetch backward_prefetch = fsdp::BackwardPrefetch::kBackwardPre;  // FsdpPolicy's defaults
  bool forward_prefetch = true;
  bool limit_all_gathers = true;
  int hybrid_shard_size = 0;     // 0: ranks_per_node
  // LoRA (--use_peft): lora_rank > 0. The base stays frozen in param_dtype (no fp32 master,
  // gradient or moments); adapters (and modules_to_save) train with fp32 masters. Targets are leaf
  // names as peft matches them (empty: q_proj v_proj, peft's LLaMA default; "all-linear": every
  // linear but lm_head); modules_to_save may name embed_tokens and lm_head (trained in full).
  int64_t lora_rank = 0;
  double lora_dropout = 0.05;    // > 0: each adapted linear keeps a dropout mask and its own input copy
  // DoRA (--use_dora): each adapted linear's magnitude vector (out values) trains with the adapters.
  // Its transient (B A and W + s B A, out x in each, while the layer runs) is not modelled.
  bool lora_use_dora = false;
  std::vector<std::string> lora_target_modules;
  std::vector<std::string> lora_modules_to_save;
  // Rows train.py's rule added to the vocabulary ([PAD]): under LoRA each table not in
  // modules_to_save trains them as a peft trainable-token delta (k x D, in the root unit; a tied
  // table has one shared delta).
  int64_t lora_token_rows = 0;
  // QLoRA (--load_in_4bit, LoRA only): the decoder layers' frozen base held 4-bit exactly as the
  // engine holds it (fsdp/quant_layout.h: packed bytes + absmax (+ nested scales) + the norms in
  // param_dtype, per shard), gathered as bytes and dequantized into the same param_dtype buffers.
  // "" = off, "nf4" or "fp4"; quant4_nested = bnb_4bit_use_double_quant.
  std::string quant4_type;
  bool quant4_nested = false;
  int64_t device_memory_bytes = 0;  // 0: unknown (fits is then not judged for the device)
  int64_t host_memory_bytes = 0;    // per node; 0: unknown
};

struct MemoryItem {
  std::string name;
  int64_t device_bytes = 0;
  int64_t host_bytes = 0;
};

struct DeepSpeedEstimate {  // deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs
  int64_t total_params = 0;
  int64_t largest_layer_params = 0;
  int64_t gpu_bytes_per_gpu = 0;   // model states only, no activations
  int64_t cpu_bytes_per_node = 0;
};

// One FSDP unit on one rank, as fsdp::plan_units lays it out for the model training would build.
struct UnitBytes {
  std::string label;             // "layer 0", ..., "embed_tokens", "norm+lm_head" (or "root")
  int64_t train_shard_bytes = 0;   // fp32 master shard (its gradient shard is as large)
  int64_t frozen_shard_bytes = 0;  // frozen shard in param_dtype (a layer's 4-bit blob shard under QLoRA)
  int64_t full_bytes = 0;          // gathered buffers in param_dtype
  int64_t full_grad_bytes = 0;     // full gradient in reduce_dtype
};

struct MemoryPlan {
  // Per rank. device_allocated_bytes is what the allocator hands out at the peak (compare with
  // max_memory_allocated, or the counting CPU allocator's peak on CPU ranks); device_total_bytes
  // adds the allocator margin and the CUDA context (what must fit on the GPU).
  int64_t device_allocated_bytes = 0;
  int64_t device_total_bytes = 0;
  int64_t host_total_bytes = 0;  // per rank: offloaded states + process baseline (+ device on CPU)
  int64_t host_node_bytes = 0;   // host_total_bytes x ranks per node
  std::string peak_moment;       // which moment above is the peak
  std::vector<MemoryItem> breakdown;  // at the peak moment; sums to the totals
  std::vector<MemoryItem> moments;    // allocated device bytes of every moment (name, bytes)
  bool fits_device = true, fits_host = true;
  bool fits() const { return fits_device && fits_host; }
  DeepSpeedEstimate deepspeed;
  // Activations per layer and per micro-batch, for the table (bytes).
  int64_t activations_per_layer_bytes = 0;
  int64_t checkpointed_per_layer_bytes = 0;
  int64_t loss_chunk_bytes = 0;
  std::vector<UnitBytes> units;  // every FSDP unit, in the engine's order
};

// Throws alpaca::Error for a LoRA target or module to save the planner does not know.
MemoryPlan plan_memory(const MemoryPlanInputs& in);

// The largest micro-batch (per_device_train_batch_size) that fits, 0 if not even 1 does; capped
// at `limit`; -1 when no memory size is known (nothing to fit in).
int64_t largest_fitting_micro_batch(MemoryPlanInputs in, int64_t limit = 4096);

struct LadderRung {
  std::string name;
  MemoryPlanInputs inputs;
  MemoryPlan plan;
  int64_t max_micro_batch = 0;
};

// The OOM ladder from the given configuration: full_shard; + offload; + gradient_checkpointing;
// LoRA r=16; LoRA + offload; QLoRA r=16 (the LoRA rungs: peft's defaults, q_proj v_proj, dropout
// 0.05, with gradient checkpointing; the QLoRA rung the same on an nf4 base with nested
// quantization, QLoRA's recipe; the full rungs train every parameter, whatever the given
// --use_peft / --load_in_4bit).
std::vector<LadderRung> plan_ladder(const MemoryPlanInputs& base);

// A JSON object with device_total_bytes, host_total_bytes, fits, breakdown, ... for one plan.
std::string plan_to_json(const MemoryPlan& plan, const MemoryPlanInputs& in);
// The whole report: the given plan plus "rungs".
std::string report_to_json(const MemoryPlanInputs& in, const MemoryPlan& plan, const std::vector<LadderRung>& rungs);
// The readable tables.
std::string report_to_text(const MemoryPlanInputs& in, const MemoryPlan& plan, const std::vector<LadderRung>& rungs);

}  // namespace alpaca::plan
