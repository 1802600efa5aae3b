// Private state of FsdpEngine, shared by engine.cpp (lifecycle) and engine_state.cpp (loading,
// export). Units 0..num_layers-1 are decoder layers; the root follows (layout.embed_unit, the unit
// gathered for the embedding, and layout.head_unit, gathered after the last layer; the same unit
// when the root is not split).
#pragma once

#include <c10/core/Event.h>  // defines: c10::Event

#include <deque>
#include <optional>

#include "alpaca/dist/communicator.h"
#include "alpaca/fsdp/engine.h"
#include "quant_store.h"

namespace alpaca::fsdp {

struct FsdpEngine::Impl {
  struct Unit {
    int index = 0;
    std::string label;
    std::unique_ptr<FlatParameter> train;   // trainable parameters (with fp32 grad shard)
    std::unique_ptr<FlatParameter> frozen;  // requires_grad=false parameters: no grad, no optimizer state
    // --load_in_4bit: the frozen values, 4-bit, instead of frozen's shard; the gathered blob waits
    // in quant_blob until wait_gather unpacks it into frozen's full buffer.
    std::unique_ptr<QuantStore> quant;
    at::Tensor quant_blob;
    bool unsharded = false;                 // full buffers allocated (a gather may still be in flight)
    std::vector<dist::WorkHandle> gather_work;
    std::vector<at::Tensor> gather_inputs;  // kept alive until the gather completes
    at::Tensor flat_grad;                   // (padded,) reduce_dtype; while gradients arrive
    std::vector<char> got;                  // per trainable entry: gradient arrived this backward
    int64_t grads_in = 0;
    bool reduced = false;
    // A 16-bit param_dtype with fp32 master shards: the trainable shard cast once per change (its
    // version counter moves when the optimizer or a load writes it). Offload to a GPU: in pinned
    // memory, the source of every copy to the device; `copied` orders rewriting it after the last
    // copy. CPU training: the all-gather's input (cast_shard_cached).
    at::Tensor staging;
    int64_t staged_version = -1;
    std::optional<c10::Event> copied;
    bool has_params() const { return train || frozen; }
    int64_t full_bytes() const;
  };
  struct Pending {
    int unit = 0;
    at::Tensor flat, out;
    dist::WorkHandle work;
  };
  // A reduced gradient on its way to an offloaded (host) fp32 gradient shard: cast to fp32 on the
  // device, copied asynchronously into pinned staging; added on the host once `copied` completed.
  struct HostGrad {
    c10::Event copied;
    at::Tensor staging, grad;
  };

  Impl(const FsdpModelParts& parts, std::shared_ptr<dist::Communicator> comm, const FsdpPolicy& policy);

  void setup_comms();
  void build_units(const FsdpModelParts& parts);
  bool reshard_after_forward() const;
  // Gathers and reduce-scatters go through shard_comm: it shards (world > 1), or the policy forces
  // the collective path at world 1 (force_collectives).
  bool communicate_shards() const { return shard_comm && (shard_world > 1 || policy.force_collectives); }
  void gather_flat(Unit& unit, FlatParameter& flat);
  void gather_quant(Unit& unit);
  void build_quant(Unit& unit, std::vector<FlatParamEntry> frozen, FlatParamOptions opt);
  void unshard(int u, bool wait);
  void wait_gather(Unit& unit);
  void reshard(int u);
  void prefetch(int u);
  void add_bytes(int64_t delta);
  // The shard of `flat` in param_dtype on the compute device (see gather_flat).
  at::Tensor shard_on_device(Unit& unit, FlatParameter& flat);
  at::Tensor cast_shard_cached(Unit& unit, const at::Tensor& shard);
  // Adds the gradients whose copy to the host completed (all of them, waiting, when `wait`), in
  // the order they were reduced, so the sums are those of a synchronous copy. Local.
  void drain_host_grads(bool wait);

  at::Tensor forward(const std::function<at::Tensor()>& fn);
  at::Tensor run_layer(int64_t idx, const at::Tensor& hidden, std::function<at::Tensor(const at::Tensor&)> fn);
  at::Tensor checkpoint(int u, const at::Tensor& hidden, std::function<at::Tensor(const at::Tensor&)> fn);
  void root_pre_backward();
  void pre_backward(int u);
  void on_param_grad(int u, int e, const at::Tensor& param);
  void post_backward(int u);
  void issue_reduce(int u);
  void flush_reduce();
  void finish_backward();
  void abandon();

  std::shared_ptr<dist::Communicator> comm;
  std::shared_ptr<dist::Communicator> shard_comm;      // gathers / reduce-scatters (null: no sharding)
  std::shared_ptr<dist::Communicator> replicate_comm;  // all-reduce across replicas (null: none)
  int shard_world = 1, shard_rank = 0;
  FsdpPolicy policy;
  at::Device device;
  int num_layers = 0;
  UnitPlan layout;  // plan_units(): what `units` were built from
  int embed_unit = 0, head_unit = 0;
  std::vector<Unit> units;
  int num_units() const { return static_cast<int>(units.size()); }
  // The unit forward runs after u (prefetch order): the next layer, the head after the last.
  int next_in_forward(int u) const { return u + 1 < num_layers ? u + 1 : head_unit; }

  bool backward_started = false;
  bool probe = false;  // memory probe: allocate as usual, communicate nothing (set_memory_probe)
  std::optional<Pending> pending;
  std::deque<HostGrad> host_grads;

  int num_unsharded = 0, peak_unsharded = 0;
  int64_t unsharded_bytes = 0, peak_bytes = 0;
};

}  // namespace alpaca::fsdp
