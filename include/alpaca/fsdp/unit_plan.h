// The FSDP unit layout in one pure place: which parameters form which unit, in which order they
// are flattened, and where each rank's shard starts. The engine builds its FlatParameters from
// plan_units(); the memory planner (plan/memory_plan.cpp) calls the same function on the same
// meta-device model the trainer builds, so the two cannot drift apart.
//
// Units, in index order: one per decoder layer (auto_wrap), then the root. The root is two units,
// `embed_tokens` (the input embedding module's parameters) and `norm+lm_head` (every other
// parameter outside the decoder layers), so the embedding's full gradient is allocated only at the
// end of backward and the head's is reduced right after the head's backward (torchtitan shards
// tok_embeddings and [norm, output] the same way). Tied embeddings (the table is also the head)
// and a model without auto_wrap keep one root unit.
#pragma once

#include <ATen/core/Tensor.h>      // defines: at::Tensor
#include <c10/core/ScalarType.h>  // defines: at::ScalarType
#include <torch/nn/module.h>      // defines: torch::nn::Module

#include <cstdint>
#include <string>
#include <vector>

#include "alpaca/fsdp/policy.h"
#include "alpaca/fsdp/shard_info.h"

namespace alpaca::fsdp {

struct FsdpModelParts {
  torch::nn::Module* root = nullptr;            // named_parameters() gives HF names
  std::vector<torch::nn::Module*> layers;       // decoder layers, in forward order
  // The input embedding module when its parameters may form their own unit (untied); null: the
  // root is one unit.
  torch::nn::Module* embed = nullptr;
};

// One distinct parameter tensor of the model, as plan_units sees it.
struct ParamSpec {
  std::string name;                  // primary fully qualified (HF) name: first in named_parameters order
  std::vector<std::string> aliases;  // other names of the same tensor (tied weights)
  std::vector<int64_t> shape;
  at::ScalarType dtype = at::kFloat;
  bool trainable = true;             // requires_grad (false: LoRA base weights, frozen tables)
  int layer = -1;                    // decoder layer holding it; -1: outside every decoder layer
  bool in_embedding = false;         // some name lies inside FsdpModelParts::embed
  bool outside_embedding = true;     // some name lies outside it
  int64_t numel() const;
};

struct PlannedEntry {
  int spec = 0;                      // index into the ParamSpec list
  std::string name;
  std::vector<std::string> aliases;
  std::vector<int64_t> shape;
  int64_t offset = 0;                // first element in the flat buffer
  int64_t numel = 0;
};

// One FlatParameter: its entries in flat order and this rank's shard.
struct PlannedFlat {
  std::vector<PlannedEntry> entries;
  ShardInfo shard;
};

struct PlannedUnit {
  std::string label;                 // "layer i", "embed_tokens", "norm+lm_head" or "root"
  bool has_train = false, has_frozen = false;
  PlannedFlat train, frozen;
  // Bytes on this rank: trainable shard (fp32 master; its gradient has the same size), frozen shard
  // (param_dtype), the full buffers while gathered (param_dtype) and the full gradient (reduce_dtype).
  int64_t train_shard_bytes() const { return 4 * train.shard.shard_numel; }
  int64_t frozen_shard_bytes(at::ScalarType param_dtype) const;
  int64_t full_bytes(at::ScalarType param_dtype) const;
  int64_t full_grad_bytes(at::ScalarType reduce_dtype) const;
  int64_t numel() const { return train.shard.numel + frozen.shard.numel; }
};

struct UnitPlan {
  std::vector<PlannedUnit> units;
  int num_layers = 0;   // units [0, num_layers) are decoder layers
  int embed_unit = 0;   // the unit gathered before the embedding (== head_unit: one root unit)
  int head_unit = 0;    // the unit gathered after the last layer
  int shard_world = 1;
  bool split_root() const { return embed_unit != head_unit; }
  // Root units first, then the layers: the HF order (embeddings, layers, norm, head) roughly kept.
  std::vector<int> export_order() const;
};

// The ranks a unit's flat buffer is sharded over, for `world` ranks under `policy` (HYBRID_SHARD
// with hybrid_shard_size 0 shards over `local_world`, the ranks of a node).
int shard_world_of(const FsdpPolicy& policy, int world, int local_world);

// The units of a model with `num_layers` decoder layers (0 when !policy.auto_wrap: one root unit)
// over `shard_world` ranks, seen from `shard_rank`. Trainable and frozen parameters of a unit go to
// two flat buffers, each in `params` order. Throws when a layer index is out of range.
UnitPlan plan_units(const std::vector<ParamSpec>& params, int num_layers, const FsdpPolicy& policy, int shard_world,
                    int shard_rank);

// The distinct parameter tensors of a model, in named_parameters order (tied weights once, under
// their first name), with their specs: the input of plan_units, for the engine and the planner.
struct ModelParams {
  std::vector<ParamSpec> specs;
  std::vector<at::Tensor> tensors;  // tensors[i] is specs[i]'s parameter
};
ModelParams describe_parameters(const FsdpModelParts& parts);

}  // namespace alpaca::fsdp
