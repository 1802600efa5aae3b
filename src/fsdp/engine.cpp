// FsdpEngine: unit construction, the per-micro-step lifecycle, gradient reduction.
// See include/alpaca/fsdp/engine.h; state export/loading live in engine_state.cpp.
#include "alpaca/fsdp/engine.h"

#include <ATen/CPUGeneratorImpl.h>  // defines: at::detail::getDefaultCPUGenerator
#include <ATen/Context.h>           // defines: at::globalContext().defaultGenerator
#include <c10/core/impl/VirtualGuardImpl.h>  // defines: c10::impl::VirtualGuardImpl
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <regex>
#include <sstream>

#include "alpaca/dist/communicator.h"
#include "alpaca/fsdp/grad_add.h"
#include "alpaca/model/fused_ops.h"
#include "alpaca/util/error.h"
#include "alpaca/util/trace.h"
#include "alpaca/util/host_sync.h"
#include "alpaca/util/log.h"
#include "alpaca/util/pinned.h"
#include "engine_impl.h"

namespace alpaca::fsdp {

void add_gradient(at::Tensor& grad, const at::Tensor& src) {
  if (!(grad.is_cpu() && src.is_cpu() && grad.scalar_type() == at::kFloat && src.scalar_type() == at::kBFloat16 &&
        grad.is_contiguous() && src.is_contiguous() && grad.numel() == src.numel())) {
    grad.add_(src);
    return;
  }
  model::add_bf16_into_fp32(grad, src);
}

namespace {

// Runs after AccumulateGrad stored a parameter's gradient: moves it into the unit's flat gradient
// buffer and clears .grad, so unsharded gradients never outlive their unit's reduction.
class GradHook : public torch::autograd::PostAccumulateGradHook {
 public:
  GradHook(FsdpEngine::Impl* impl, int unit, int entry) : impl_(impl), unit_(unit), entry_(entry) {}
  void operator()(const torch::autograd::Variable& param) override {
    impl_->on_param_grad(unit_, entry_, param);
  }

 private:
  FsdpEngine::Impl* impl_;
  int unit_, entry_;
};

// The default generators a layer's forward may draw from (dropout, e.g. LoRA's): the CPU one and
// the one of the compute device. torch.utils.checkpoint's preserve_rng_state, so a recomputed
// forward draws the same masks as the original one.
struct RngState {
  at::Tensor cpu, device;
  at::Device device_type{at::kCPU};
};

RngState capture_rng(const at::Device& device) {
  RngState s;
  s.cpu = at::detail::getDefaultCPUGenerator().get_state();
  s.device_type = device;
  if (!device.is_cpu()) s.device = at::globalContext().defaultGenerator(device).get_state();
  return s;
}

void restore_rng(const RngState& s) {
  at::Generator cpu = at::detail::getDefaultCPUGenerator();  // a handle on the shared generator
  cpu.set_state(s.cpu);
  if (s.device.defined()) {
    at::Generator dev = at::globalContext().defaultGenerator(s.device_type);
    dev.set_state(s.device);
  }
}

// Autograd nodes are held by std::shared_ptr up to LibTorch 2.1x and by c10::intrusive_ptr since
// (Edge::function's type says which). The trainer builds against the pinned wheel; the GPU check
// builds against whatever torch the GPU machine has, so make a node the way this LibTorch holds it.
template <typename T, typename... Args>
auto make_autograd_node(Args&&... args) {
  using NodePtr = decltype(torch::autograd::Edge::function);
  if constexpr (std::is_same_v<NodePtr, std::shared_ptr<torch::autograd::Node>>) {
    return std::make_shared<T>(std::forward<Args>(args)...);
  } else {
    return c10::make_intrusive<T>(std::forward<Args>(args)...);
  }
}

// Activation checkpointing as a custom autograd node: the forward ran without saving activations;
// backward re-runs the layer with grad enabled on the (re-gathered) parameters and back-propagates
// through it, which also delivers the layer's parameter gradients to their hooks. The generators'
// state at the forward is replayed for the recomputation and restored afterwards.
class CheckpointBackward : public torch::autograd::Node {
 public:
  CheckpointBackward(FsdpEngine::Impl* impl, int unit, at::Tensor input,
                     std::function<at::Tensor(const at::Tensor&)> fn, bool input_requires_grad, RngState rng)
      : impl_(impl), unit_(unit), input_(std::move(input)), fn_(std::move(fn)),
        input_requires_grad_(input_requires_grad), rng_(std::move(rng)) {}

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    ALPACA_CHECK(fn_, "activation checkpointing: layer " << unit_ << " backward ran twice "
                      "(retain_graph is not supported with checkpointing)");
    if (unit_ >= 0) impl_->unshard(unit_, /*wait=*/true);
    at::Tensor x = input_.detach();
    if (input_requires_grad_) x.requires_grad_(true);
    at::Tensor y;
    {
      at::AutoGradMode grad_on(true);
      const RngState now = capture_rng(rng_.device_type);
      restore_rng(rng_);
      y = fn_(x);
      restore_rng(now);
    }
    if (grads[0].defined() && y.requires_grad()) torch::autograd::backward({y}, {grads[0]});
    at::Tensor gx = input_requires_grad_ ? x.grad() : at::Tensor();
    input_ = at::Tensor();
    fn_ = nullptr;
    return {gx};
  }
  std::string name() const override { return "FsdpCheckpointBackward"; }
  void release_variables() override {
    input_ = at::Tensor();
    fn_ = nullptr;
  }

 private:
  FsdpEngine::Impl* impl_;
  int unit_;
  at::Tensor input_;
  std::function<at::Tensor(const at::Tensor&)> fn_;
  bool input_requires_grad_;
  RngState rng_;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Construction

FsdpEngine::Impl::Impl(const FsdpModelParts& parts, std::shared_ptr<dist::Communicator> comm_in,
                       const FsdpPolicy& pol)
    : comm(std::move(comm_in)), policy(pol), device(comm->device()) {
  ALPACA_CHECK(parts.root != nullptr, "apply_fsdp: no root module");
  setup_comms();
  if (policy.sync_module_states && comm->world_size() > 1) {
    // HF: rank 0's values win (it may be the only rank that loaded the checkpoint).
    for (const auto& item : parts.root->named_parameters(/*recurse=*/true)) {
      if (item.value().is_meta()) continue;  // nothing to send: values arrive by load_parameters
      at::Tensor p = item.value().detach();
      at::Tensor t = p.to(device).contiguous();
      comm->broadcast(t, 0)->wait();
      p.copy_(t);
    }
  }
  build_units(parts);
}

// The units as plan_units() lays them out (the planner computes the same layout): each planned
// flat buffer becomes a FlatParameter over the module's own tensors.
void FsdpEngine::Impl::build_units(const FsdpModelParts& parts) {
  const ModelParams model = describe_parameters(parts);
  layout = plan_units(model.specs, static_cast<int>(parts.layers.size()), policy, shard_world, shard_rank);
  num_layers = layout.num_layers;
  embed_unit = layout.embed_unit;
  head_unit = layout.head_unit;
  FlatParamOptions opt;
  opt.param_dtype = policy.param_dtype;
  opt.compute_device = device;
  opt.master_device = policy.offload ? at::Device(at::kCPU) : device;
  opt.pin_memory = policy.offload && device.is_cuda();
  auto make_entries = [&](const PlannedFlat& planned) {
    std::vector<FlatParamEntry> entries;
    for (const auto& pe : planned.entries) {
      FlatParamEntry e;
      e.name = pe.name;
      e.aliases = pe.aliases;
      e.param = model.tensors[static_cast<size_t>(pe.spec)];
      entries.push_back(std::move(e));
    }
    return entries;
  };
  auto check_planned = [](const FlatParameter& flat, const PlannedFlat& planned) {
    ALPACA_CHECK(flat.shard_info().padded_numel == planned.shard.padded_numel,
                 "FSDP: a flat buffer of " << flat.numel() << " elements was planned with " << planned.shard.numel);
  };
  auto make_flat = [&](const PlannedFlat& planned) {
    auto flat = std::make_unique<FlatParameter>(make_entries(planned), shard_world, shard_rank, opt);
    check_planned(*flat, planned);
    return flat;
  };
  units.resize(layout.units.size());
  for (int u = 0; u < num_units(); ++u) {
    const PlannedUnit& planned = layout.units[u];
    Unit& unit = units[u];
    unit.index = u;
    unit.label = planned.label;
    if (planned.has_train) {
      opt.with_grad = true;
      opt.master_dtype = at::kFloat;
      unit.train = make_flat(planned.train);
      unit.got.assign(unit.train->entries().size(), 0);
      for (size_t e = 0; e < unit.train->entries().size(); ++e)
        torch::autograd::impl::set_post_acc_grad_hooks(
            unit.train->entries()[e].param, std::make_unique<GradHook>(this, u, static_cast<int>(e)));
    }
    if (planned.has_frozen) {
      // Frozen (e.g. LoRA base weights): no fp32 master, no gradient, no optimizer state; the shard
      // is stored and gathered in param_dtype only.
      opt.with_grad = false;
      opt.master_dtype = policy.param_dtype;
      // --load_in_4bit: a decoder layer's frozen base (units [0, num_layers) are the layers under
      // plan_units' order) is held 4-bit; embed_tokens / norm+lm_head / root stay in param_dtype.
      if (!policy.quant4_type.empty() && unit_holds_4bit(layout, u)) {
        build_quant(unit, make_entries(planned.frozen), opt);
        check_planned(*unit.frozen, planned.frozen);
      } else {
        unit.frozen = make_flat(planned.frozen);
      }
    }
  }
}

void FsdpEngine::Impl::setup_comms() {
  const int world = comm->world_size();
  const int rank = comm->rank();
  switch (policy.strategy) {
    case ShardingStrategy::kFullShard:
    case ShardingStrategy::kShardGradOp:
      shard_comm = comm;
      break;
    case ShardingStrategy::kNoShard:
      replicate_comm = comm;
      break;
    case ShardingStrategy::kHybridShard: {
      const int hs = policy.hybrid_shard_size > 0 ? policy.hybrid_shard_size : world;
      ALPACA_CHECK(world % hs == 0, "HYBRID_SHARD: shard group size " << hs << " does not divide world size "
                   << world << "; set fsdp_config hybrid_shard_size to the ranks per node");
      // Ranks [k*hs, (k+1)*hs) share a node: shard there, replicate across nodes.
      shard_comm = comm->split(rank / hs, rank);
      replicate_comm = comm->split(rank % hs, rank);
      break;
    }
  }
  shard_world = shard_comm ? shard_comm->world_size() : 1;
  shard_rank = shard_comm ? shard_comm->rank() : 0;
  if (replicate_comm && replicate_comm->world_size() == 1 && !policy.force_collectives) replicate_comm.reset();
}

// ---------------------------------------------------------------------------------------------
// Unshard / reshard

bool FsdpEngine::Impl::reshard_after_forward() const {
  return policy.strategy == ShardingStrategy::kFullShard || policy.strategy == ShardingStrategy::kHybridShard;
}

void FsdpEngine::Impl::gather_flat(Unit& unit, FlatParameter& flat) {
  ALPACA_TRACE("fsdp:gather");
  flat.alloc_full();
  at::Tensor lp = shard_on_device(unit, flat);
  if (!communicate_shards()) {
    flat.full().copy_(lp);
    return;
  }
  if (probe) {  // the same buffers, no communication: this rank's shard in every slot's place
    flat.full().zero_();
    flat.full().narrow(0, static_cast<int64_t>(shard_rank) * lp.numel(), lp.numel()).copy_(lp);
    unit.gather_inputs.push_back(lp);
    return;
  }
  unit.gather_work.push_back(shard_comm->all_gather_into(flat.full(), lp));
  unit.gather_inputs.push_back(lp);
}

void FsdpEngine::Impl::unshard(int u, bool wait) {
  Unit& unit = units.at(u);
  if (!unit.has_params()) return;
  if (!unit.unsharded) {
    if (unit.train) gather_flat(unit, *unit.train);
    if (unit.frozen) unit.quant ? gather_quant(unit) : gather_flat(unit, *unit.frozen);
    unit.unsharded = true;
    ++num_unsharded;
    peak_unsharded = std::max(peak_unsharded, num_unsharded);
    add_bytes(unit.full_bytes());
  }
  if (wait) wait_gather(unit);
}

void FsdpEngine::Impl::wait_gather(Unit& unit) {
  ALPACA_TRACE("fsdp:wait_gather");
  for (auto& w : unit.gather_work) w->wait();
  unit.gather_work.clear();
  unit.gather_inputs.clear();
  if (unit.quant_blob.defined()) {  // 4-bit base: dequantize the gathered bytes into param_dtype
    unit.quant->unpack(unit.quant_blob, *unit.frozen);
    unit.quant_blob = at::Tensor();
  }
}

void FsdpEngine::Impl::reshard(int u) {
  Unit& unit = units.at(u);
  if (!unit.unsharded) return;
  wait_gather(unit);  // never free a buffer a collective still writes
  if (unit.train) unit.train->free_full();
  if (unit.frozen) unit.frozen->free_full();
  unit.unsharded = false;
  --num_unsharded;
  add_bytes(-unit.full_bytes());
}

void FsdpEngine::Impl::prefetch(int u) {
  if (u < 0 || u >= num_units() || units[u].unsharded || !units[u].has_params()) return;
  // limit_all_gathers: a prefetch may not make a third unit resident; it then happens on demand.
  if (policy.limit_all_gathers && num_unsharded >= 2) return;
  unshard(u, /*wait=*/false);
}

at::Tensor FsdpEngine::Impl::shard_on_device(Unit& unit, FlatParameter& flat) {
  const at::Tensor& shard = flat.shard();
  if (shard.is_cpu() && device.is_cpu() && shard.scalar_type() != policy.param_dtype && &flat == unit.train.get())
    return cast_shard_cached(unit, shard);
  if (!shard.is_cpu() || device.is_cpu()) return shard.to(device, policy.param_dtype);
  // Offload to a device. A copy that also changed the dtype would convert on the CPU into a
  // pageable temporary, which makes it synchronous (and the prefetch serial): copies start from
  // pinned memory in param_dtype, non_blocking.
  if (shard.scalar_type() == policy.param_dtype || !shard.is_pinned() || &flat != unit.train.get()) {
    // Already in param_dtype (frozen shards, fp32 training), or unpinned: as stored, cast on the device.
    return shard.to(device, /*non_blocking=*/shard.is_pinned()).to(policy.param_dtype);
  }
  if (!unit.staging.defined() || unit.staged_version != shard._version()) {
    if (unit.copied && !unit.copied->query()) {  // never rewrite what a copy still reads
      util::count_host_sync();
      unit.copied->synchronize();
    }
    if (!unit.staging.defined())
      unit.staging = util::empty_pinned(shard.sizes(), policy.param_dtype);  // exactly sized (util/pinned.h)
    unit.staging.copy_(shard);  // the cast, once per optimizer step (or load), on the host
    unit.staged_version = shard._version();
  }
  at::Tensor out = unit.staging.to(device, /*non_blocking=*/true);
  if (!unit.copied) unit.copied.emplace(device.type());
  c10::impl::VirtualGuardImpl guard(device.type());
  unit.copied->record(guard.getStream(device));
  return out;
}

// CPU training in a 16-bit param_dtype: the fp32 master shard is cast once per change (the
// optimizer step or a load moves its version counter; load_parameters also clears the cache), not
// at every unshard of every micro-batch. The same cast, so the same bits. The cache is rewritten
// only here, at an unshard, which follows the unit's last reshard: no gather still reads it.
at::Tensor FsdpEngine::Impl::cast_shard_cached(Unit& unit, const at::Tensor& shard) {
  if (!unit.staging.defined() || unit.staged_version != shard._version()) {
    if (!unit.staging.defined()) unit.staging = at::empty(shard.sizes(), shard.options().dtype(policy.param_dtype));
    unit.staging.copy_(shard);
    unit.staged_version = shard._version();
  }
  return unit.staging;
}

void FsdpEngine::Impl::drain_host_grads(bool wait) {
  if (wait && !host_grads.empty()) util::count_host_sync();  // one wait: the copies are stream-ordered
  while (!host_grads.empty() && (wait || host_grads.front().copied.query())) {
    HostGrad& h = host_grads.front();
    if (wait) h.copied.synchronize();
    h.grad.add_(h.staging);
    host_grads.pop_front();
  }
}

void FsdpEngine::Impl::add_bytes(int64_t delta) {
  unsharded_bytes += delta;
  peak_bytes = std::max(peak_bytes, unsharded_bytes);
}

int64_t FsdpEngine::Impl::Unit::full_bytes() const {
  return (train ? train->full_bytes() : 0) + (frozen ? frozen->full_bytes() : 0);
}

// ---------------------------------------------------------------------------------------------
// Forward

at::Tensor FsdpEngine::Impl::forward(const std::function<at::Tensor()>& fn) {
  ALPACA_CHECK(!backward_started, "FsdpEngine::forward called while a backward is still running");
  // A forward whose output never saw backward (e.g. evaluation) may have left units resident.
  for (int u = 0; u < num_units(); ++u)
    if (u != embed_unit) reshard(u);
  unshard(embed_unit, /*wait=*/true);
  at::Tensor out = fn();
  if (out.requires_grad()) {
    out.register_hook([this](const at::Tensor&) { root_pre_backward(); });
  } else {
    for (int u = 0; u < num_units(); ++u) reshard(u);
  }
  return out;
}

at::Tensor FsdpEngine::Impl::run_layer(int64_t idx, const at::Tensor& hidden,
                                       std::function<at::Tensor(const at::Tensor&)> fn) {
  const bool grad = at::GradMode::is_enabled();
  const bool ckpt = policy.activation_checkpointing && grad;
  if (num_layers == 0) return ckpt ? checkpoint(-1, hidden, std::move(fn)) : fn(hidden);
  ALPACA_CHECK(idx >= 0 && idx < num_layers, "FsdpEngine: layer index " << idx << " outside [0, " << num_layers << ")");
  const int u = static_cast<int>(idx);
  // The embedding's parameters are done after the lookup; the head's (the same unit when the root
  // is not split) are needed after the last layer.
  if (u == 0 && reshard_after_forward()) reshard(embed_unit);
  unshard(u, /*wait=*/true);
  if (policy.forward_prefetch) prefetch(next_in_forward(u));
  at::Tensor y = ckpt ? checkpoint(u, hidden, std::move(fn)) : fn(hidden);
  if (y.requires_grad()) y.register_hook([this, u](const at::Tensor&) { pre_backward(u); });
  if (reshard_after_forward()) reshard(u);
  if (u == num_layers - 1) unshard(head_unit, /*wait=*/true);
  return y;
}

at::Tensor FsdpEngine::Impl::checkpoint(int u, const at::Tensor& hidden,
                                        std::function<at::Tensor(const at::Tensor&)> fn) {
  at::Tensor y;
  RngState rng = capture_rng(device);
  {
    // Without grad, but on the training routes, as the recompute in backward will be (model/fused_ops.h).
    model::TrainingForwardScope training;
    at::NoGradGuard no_grad;
    y = fn(hidden);
  }
  auto node = make_autograd_node<CheckpointBackward>(this, u, hidden.detach(), std::move(fn),
                                                    hidden.requires_grad(), std::move(rng));
  node->set_next_edges(torch::autograd::collect_next_edges(hidden));
  torch::autograd::create_gradient_edge(y, node);
  return y;
}

// ---------------------------------------------------------------------------------------------
// Backward

void FsdpEngine::Impl::root_pre_backward() {
  if (backward_started) return;
  backward_started = true;
  torch::autograd::Engine::get_default_engine().queue_callback([this] { finish_backward(); });
  unshard(head_unit, /*wait=*/true);
}

void FsdpEngine::Impl::pre_backward(int u) {
  // Units later in forward order are done once backward reaches u (the gradient of u's output is
  // complete, so nothing of theirs runs again): those with nothing to reduce, and those whose
  // frozen weights post_backward kept for the rest of their backward.
  for (int v = u + 1; v < num_layers; ++v)
    if (!units[v].train || units[v].reduced) reshard(v);
  if (u == num_layers - 1 && reshard_after_forward()) reshard(head_unit);
  unshard(u, /*wait=*/true);
  if (policy.backward_prefetch == BackwardPrefetch::kBackwardPre) prefetch(u - 1);
}

void FsdpEngine::Impl::on_param_grad(int u, int e, const at::Tensor& param) {
  ALPACA_TRACE("fsdp:grad_accumulate");
  Unit& unit = units.at(u);
  ALPACA_CHECK(!unit.reduced, "FSDP " << unit.label << ": gradient of " << unit.train->entries()[e].name
               << " arrived after the unit was reduced; each parameter must be used once per backward graph");
  at::Tensor g = param.grad();
  if (!g.defined()) return;
  if (!unit.flat_grad.defined()) {
    unit.flat_grad = at::zeros({unit.train->shard_info().padded_numel},
                               at::TensorOptions().dtype(policy.reduce_dtype).device(device));
    add_bytes(unit.flat_grad.nbytes());
  }
  const auto& entry = unit.train->entries()[e];
  at::Tensor slot = unit.flat_grad.narrow(0, entry.offset, entry.numel).view(entry.shape);
  add_gradient(slot, g);
  param.mutable_grad().reset();
  if (!unit.got[e]) {
    unit.got[e] = 1;
    ++unit.grads_in;
  }
  if (unit.grads_in == static_cast<int64_t>(unit.got.size())) post_backward(u);
}

void FsdpEngine::Impl::post_backward(int u) {
  issue_reduce(u);
  // Every node that uses a trainable weight has run once all their gradients arrived (a matmul's
  // weight gradient comes from the node that also uses the weight). A frozen weight (LoRA's base)
  // signals nothing, and may still be needed for the input gradient of another branch: such a
  // unit stays unsharded until backward reaches the unit before it (pre_backward) or ends.
  if (!units[u].frozen) reshard(u);
  if (policy.backward_prefetch == BackwardPrefetch::kBackwardPost && u < num_layers) prefetch(u - 1);
}

void FsdpEngine::Impl::issue_reduce(int u) {
  ALPACA_TRACE("fsdp:reduce_scatter");
  flush_reduce();  // one reduction in flight: bounds the memory of full gradients
  Unit& unit = units.at(u);
  unit.reduced = true;
  Pending p;
  p.unit = u;
  p.flat = unit.flat_grad;
  unit.flat_grad = at::Tensor();
  if (communicate_shards()) {
    p.out = at::empty({unit.train->shard_info().shard_numel}, p.flat.options());
    if (!probe) p.work = shard_comm->reduce_scatter(p.out, p.flat, dist::ReduceOp::kSum);
  } else {
    p.out = p.flat;
    // Replication only (no_shard): the all-reduce starts now and is waited for at the next unit's
    // reduction, as a reduce-scatter is, so a rank blocks only when its peers are a layer behind.
    if (replicate_comm && !probe) p.work = replicate_comm->all_reduce(p.out, dist::ReduceOp::kSum);
  }
  pending = std::move(p);
}

void FsdpEngine::Impl::flush_reduce() {
  ALPACA_TRACE("fsdp:reduce_wait_add");
  if (!pending) return;
  Pending p = std::move(*pending);
  pending.reset();
  if (p.work) p.work->wait();
  at::Tensor grad = units[p.unit].train->grad();
  if (probe) {
    at::Tensor staged = p.out.to(grad.device(), at::kFloat);  // the same copy, not accumulated
  } else {
    // Hybrid: across replicas, after the reduce-scatter (replication only started it in issue_reduce).
    if (replicate_comm && communicate_shards()) replicate_comm->all_reduce(p.out, dist::ReduceOp::kSum)->wait();
    if (grad.is_cpu() && !p.out.is_cpu()) {
      // Offload: cast on the device, copy into pinned memory without a host wait, add on the host
      // when the copy is known complete (drain_host_grads), in reduction order.
      drain_host_grads(/*wait=*/false);
      const at::Tensor g32 = p.out.to(at::kFloat);
      HostGrad h{c10::Event(device.type()), at::empty(g32.sizes(), grad.options().pinned_memory(true)), grad};
      h.staging.copy_(g32, /*non_blocking=*/true);
      c10::impl::VirtualGuardImpl guard(device.type());
      h.copied.record(guard.getStream(device));
      host_grads.push_back(std::move(h));
    } else if (p.out.device() == grad.device()) {
      add_gradient(grad, p.out);  // a bf16 gradient upcast inside the add: no full-size fp32 temporary, same bits
    } else {
      grad.add_(p.out.to(grad.device(), at::kFloat));
    }
  }
  add_bytes(-p.flat.nbytes());
}

void FsdpEngine::Impl::finish_backward() {
  // Units whose parameters did not all receive gradients: the missing ones count as zero.
  for (int u = num_units() - 1; u >= 0; --u)
    if (units[u].flat_grad.defined() && !units[u].reduced) post_backward(u);
  flush_reduce();
  // Offload: the host gradient shards are complete when backward returns (the CPU optimizer and
  // the clipping read them): one host synchronisation per backward, none per unit.
  drain_host_grads(/*wait=*/true);
  for (int u = 0; u < num_units(); ++u) {
    reshard(u);
    units[u].reduced = false;
    units[u].grads_in = 0;
    std::fill(units[u].got.begin(), units[u].got.end(), 0);
  }
  backward_started = false;
}

void FsdpEngine::Impl::abandon() {
  if (!host_grads.empty()) {  // copies in flight write into staging we hold: let them land, drop them
    host_grads.back().copied.synchronize();
    host_grads.clear();
  }
  if (pending) {
    if (pending->work) pending->work->wait();  // never free a buffer a collective still uses
    add_bytes(-pending->flat.nbytes());
    pending.reset();
  }
  for (int u = 0; u < num_units(); ++u) {
    Unit& unit = units[u];
    if (unit.flat_grad.defined()) {
      add_bytes(-unit.flat_grad.nbytes());
      unit.flat_grad = at::Tensor();
    }
    reshard(u);
    unit.reduced = false;
    unit.grads_in = 0;
    std::fill(unit.got.begin(), unit.got.end(), 0);
    if (unit.train)
      for (const auto& e : unit.train->entries()) e.param.mutable_grad().reset();
  }
  backward_started = false;
}

// ---------------------------------------------------------------------------------------------
// FsdpEngine forwarding

FsdpEngine::FsdpEngine(const FsdpModelParts& parts, std::shared_ptr<dist::Communicator> comm,
                       FsdpPolicy policy)
    : comm_(comm), policy_(policy) {
  ALPACA_CHECK(comm_ != nullptr, "apply_fsdp: no communicator");
  impl_ = std::make_unique<Impl>(parts, comm_, policy_);
  log_memory_account();
}

FsdpEngine::~FsdpEngine() = default;

at::Tensor FsdpEngine::forward(const std::function<at::Tensor()>& fn) { return impl_->forward(fn); }

at::Tensor FsdpEngine::run_layer(int64_t idx, const at::Tensor& hidden_btd,
                                 std::function<at::Tensor(const at::Tensor&)> layer_fn) {
  return impl_->run_layer(idx, hidden_btd, std::move(layer_fn));
}

void FsdpEngine::set_memory_probe(bool on) { impl_->probe = on; }
bool FsdpEngine::memory_probe() const { return impl_->probe; }
void FsdpEngine::abandon_step() { impl_->abandon(); }

void FsdpEngine::zero_grad() {
  for (auto& unit : impl_->units)
    if (unit.train) unit.train->grad().zero_();
}

std::vector<optim::OptimShard> FsdpEngine::optim_shards(bool per_parameter) const {
  std::vector<optim::OptimShard> out;
  for (const auto& unit : impl_->units) {
    if (!unit.train) continue;
    optim::OptimShard s;
    s.param = unit.train->shard();
    s.grad = unit.train->grad();
    s.shard_rank = unit.train->shard_info().rank;
    s.shard_world = unit.train->shard_info().world;
    for (const auto& e : unit.train->entries()) {
      if (per_parameter) s.params.push_back({e.name, e.shape});
      auto slice = param_shard_slice(e.offset, e.numel, unit.train->shard_info());
      if (!slice) continue;
      const bool decay = !hf_no_weight_decay(e.name);
      if (!per_parameter && !s.segments.empty() && s.segments.back().decay == decay &&
          s.segments.back().offset + s.segments.back().numel == slice->shard_offset) {
        s.segments.back().numel += slice->numel();
      } else if (per_parameter) {
        s.segments.push_back({slice->shard_offset, slice->numel(), decay, slice->param_begin, e.numel,
                              optim::bnb_embedding_weight(e.name, e.aliases),
                              static_cast<int64_t>(s.params.size()) - 1});
      } else {
        s.segments.push_back({slice->shard_offset, slice->numel(), decay});
      }
    }
    out.push_back(std::move(s));
  }
  return out;
}

namespace {
// An all-reduce of a small tensor over `comm` (the shard group) in place, through its device.
optim::ShardReducer reducer_over(dist::Communicator* comm, dist::ReduceOp op) {
  return [comm, op](at::Tensor& t) {
    if (!comm || comm->world_size() == 1) return;
    at::Tensor d = t.to(comm->device());
    comm->all_reduce(d, op)->wait();
    t.copy_(d.to(t.device()));
  };
}
}  // namespace

optim::BlockMaxReducer FsdpEngine::block_max_reducer() const {
  return reducer_over(impl_->shard_comm.get(), dist::ReduceOp::kMax);
}

optim::ShardReducer FsdpEngine::sum_reducer() const { return reducer_over(impl_->shard_comm.get(), dist::ReduceOp::kSum); }

std::vector<at::Tensor> FsdpEngine::grad_shards() const {
  std::vector<at::Tensor> out;
  for (const auto& unit : impl_->units)
    if (unit.train) out.push_back(unit.train->grad());
  return out;
}

dist::Communicator* FsdpEngine::norm_comm() const { return impl_->shard_comm.get(); }

int FsdpEngine::num_units() const { return static_cast<int>(impl_->units.size()); }

const UnitPlan& FsdpEngine::unit_plan() const { return impl_->layout; }

const FlatParameter* FsdpEngine::trainable_flat(int u) const { return impl_->units.at(u).train.get(); }

const FlatParameter* FsdpEngine::frozen_flat(int u) const { return impl_->units.at(u).frozen.get(); }

MemoryAccount FsdpEngine::memory_account(const optim::ShardedAdamW* opt) const {
  MemoryAccount m;
  for (const auto& unit : impl_->units) {
    if (unit.train) {
      m.param_bytes += unit.train->shard().nbytes();
      m.grad_bytes += unit.train->grad().nbytes();
    }
    if (unit.frozen) m.frozen_bytes += unit.frozen->shard().nbytes();
    if (unit.quant) {
      m.frozen_bytes += unit.quant->shard().nbytes();
      m.quant4_params += unit.quant->quantized_numel();
    }
  }
  if (opt) m.optimizer_bytes = opt->state_bytes();
  m.unsharded_bytes = impl_->unsharded_bytes;
  m.peak_unsharded_bytes = impl_->peak_bytes;
  m.num_unsharded_units = impl_->num_unsharded;
  m.peak_unsharded_units = impl_->peak_unsharded;
  return m;
}

void FsdpEngine::reset_peaks() {
  impl_->peak_unsharded = impl_->num_unsharded;
  impl_->peak_bytes = impl_->unsharded_bytes;
}

std::string MemoryAccount::to_string() const {
  std::ostringstream os;
  auto mib = [](int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); };
  os << "params " << mib(param_bytes) << " MiB, ";
  if (frozen_bytes > 0) os << "frozen params " << mib(frozen_bytes) << " MiB, ";
  if (quant4_params > 0) os << "of which " << quant4_params << " values 4-bit, ";
  os << "grads " << mib(grad_bytes) << " MiB, optimizer "
     << mib(optimizer_bytes) << " MiB, unsharded now " << mib(unsharded_bytes) << " MiB (peak "
     << mib(peak_unsharded_bytes) << " MiB, " << peak_unsharded_units << " units)";
  return os.str();
}

void FsdpEngine::log_memory_account(const optim::ShardedAdamW* opt) const {
  ALPACA_INFO("FSDP " << to_string(policy_.strategy) << " over " << comm_->world_size() << " ranks, "
              << num_units() << " units; per-rank model state: " << memory_account(opt).to_string());
}

bool hf_no_weight_decay(const std::string& param_name) {
  static const std::regex kPattern(R"(bias|layernorm|rmsnorm|(?:^|\.)norm(?:$|\.)|_norm(?:$|\.))");
  std::string lower = param_name;
  for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return std::regex_search(lower, kPattern);
}

}  // namespace alpaca::fsdp
