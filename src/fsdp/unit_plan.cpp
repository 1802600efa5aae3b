// The FSDP unit layout; see include/alpaca/fsdp/unit_plan.h.
#include "alpaca/fsdp/unit_plan.h"

#include <unordered_map>

#include <c10/util/accumulate.h>  // defines: c10::multiply_integers

#include "alpaca/util/error.h"

namespace alpaca::fsdp {
namespace {

int64_t element_bytes(at::ScalarType t) { return static_cast<int64_t>(c10::elementSize(t)); }

// Offsets in list order, then this rank's shard of the whole buffer (FlatParameter's layout).
PlannedFlat flatten(std::vector<PlannedEntry> entries, int shard_world, int shard_rank) {
  PlannedFlat f;
  int64_t offset = 0;
  for (auto& e : entries) {
    e.offset = offset;
    offset += e.numel;
  }
  f.entries = std::move(entries);
  f.shard = shard_info(offset, shard_world, shard_rank);
  return f;
}

// The root splits in two when the embedding module has parameters of its own and none of them is
// also reached from elsewhere (tied); without decoder-layer units there is nothing between the two.
bool splits_root(const std::vector<ParamSpec>& params, int num_layers) {
  if (num_layers == 0) return false;
  bool any = false;
  for (const auto& p : params) {
    if (p.layer >= 0 || !p.in_embedding) continue;
    if (p.outside_embedding) return false;  // shared with the head: one unit
    any = true;
  }
  return any;
}

}  // namespace

int64_t ParamSpec::numel() const { return c10::multiply_integers(shape); }

int64_t PlannedUnit::frozen_shard_bytes(at::ScalarType param_dtype) const {
  return frozen.shard.shard_numel * element_bytes(param_dtype);
}

int64_t PlannedUnit::full_bytes(at::ScalarType param_dtype) const {
  return (train.shard.padded_numel + frozen.shard.padded_numel) * element_bytes(param_dtype);
}

int64_t PlannedUnit::full_grad_bytes(at::ScalarType reduce_dtype) const {
  return has_train ? train.shard.padded_numel * element_bytes(reduce_dtype) : 0;
}

std::vector<int> UnitPlan::export_order() const {
  std::vector<int> order;
  for (int u = num_layers; u < static_cast<int>(units.size()); ++u) order.push_back(u);
  for (int u = 0; u < num_layers; ++u) order.push_back(u);
  return order;
}

int shard_world_of(const FsdpPolicy& policy, int world, int local_world) {
  switch (policy.strategy) {
    case ShardingStrategy::kNoShard:
      return 1;
    case ShardingStrategy::kHybridShard:
      return policy.hybrid_shard_size > 0 ? policy.hybrid_shard_size : std::max(1, local_world);
    default:
      return world;
  }
}

UnitPlan plan_units(const std::vector<ParamSpec>& params, int num_layers, const FsdpPolicy& policy, int shard_world,
                    int shard_rank) {
  UnitPlan plan;
  plan.num_layers = policy.auto_wrap ? num_layers : 0;
  plan.shard_world = shard_world;
  const bool split = splits_root(params, plan.num_layers);
  plan.embed_unit = plan.num_layers;
  plan.head_unit = plan.num_layers + (split ? 1 : 0);
  const int n_units = plan.head_unit + 1;
  std::vector<std::vector<PlannedEntry>> train(n_units), frozen(n_units);
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamSpec& p = params[i];
    ALPACA_CHECK(p.layer < num_layers, "plan_units: parameter " << p.name << " is in decoder layer " << p.layer
                                       << " but the model has " << num_layers << " layers");
    int u = plan.head_unit;
    if (p.layer >= 0 && plan.num_layers > 0) u = p.layer;
    else if (split && p.in_embedding) u = plan.embed_unit;
    PlannedEntry e;
    e.spec = static_cast<int>(i);
    e.name = p.name;
    e.aliases = p.aliases;
    e.shape = p.shape;
    e.numel = p.numel();
    (p.trainable ? train : frozen)[u].push_back(std::move(e));
  }
  plan.units.resize(n_units);
  for (int u = 0; u < n_units; ++u) {
    PlannedUnit& unit = plan.units[u];
    unit.label = u < plan.num_layers ? "layer " + std::to_string(u)
                 : !split            ? std::string("root")
                 : u == plan.embed_unit ? std::string("embed_tokens") : std::string("norm+lm_head");
    unit.has_train = !train[u].empty();
    unit.has_frozen = !frozen[u].empty();
    unit.train = flatten(std::move(train[u]), shard_world, shard_rank);
    unit.frozen = flatten(std::move(frozen[u]), shard_world, shard_rank);
  }
  return plan;
}

ModelParams describe_parameters(const FsdpModelParts& parts) {
  ALPACA_CHECK(parts.root != nullptr, "apply_fsdp: no root module");
  std::unordered_map<c10::TensorImpl*, int> layer_of;
  for (size_t i = 0; i < parts.layers.size(); ++i)
    for (const auto& p : parts.layers[i]->parameters(/*recurse=*/true))
      layer_of[p.unsafeGetTensorImpl()] = static_cast<int>(i);
  std::unordered_map<c10::TensorImpl*, bool> in_embed;
  if (parts.embed)
    for (const auto& p : parts.embed->parameters(/*recurse=*/true)) in_embed[p.unsafeGetTensorImpl()] = true;
  std::unordered_map<c10::TensorImpl*, int> index;
  ModelParams out;
  for (const auto& item : parts.root->named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    c10::TensorImpl* key = p.unsafeGetTensorImpl();
    auto it = index.find(key);
    if (it != index.end()) {
      ParamSpec& s = out.specs[static_cast<size_t>(it->second)];
      s.aliases.push_back(item.key());
      continue;
    }
    ParamSpec s;
    s.name = item.key();
    s.shape = p.sizes().vec();
    s.dtype = p.scalar_type();
    s.trainable = p.requires_grad();
    auto lit = layer_of.find(key);
    s.layer = lit != layer_of.end() ? lit->second : -1;
    s.in_embedding = in_embed.count(key) > 0;
    s.outside_embedding = !s.in_embedding;
    index[key] = static_cast<int>(out.specs.size());
    out.specs.push_back(std::move(s));
    out.tensors.push_back(p);
  }
  ALPACA_CHECK(layer_of.size() <= out.specs.size(),
               "apply_fsdp: some decoder-layer parameters are not reachable from the root module");
  // Tied: a tensor of the embedding reached under a second name lies outside it too.
  for (auto& s : out.specs)
    if (s.in_embedding && !s.aliases.empty()) s.outside_embedding = true;
  return out;
}

}  // namespace alpaca::fsdp
