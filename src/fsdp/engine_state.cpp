// FsdpEngine state movement: loading parameters into shards, exporting full parameters one unit
// at a time, and optimizer state by parameter name (resume on another world size).
#include "alpaca/dist/communicator.h"
#include "alpaca/fsdp/engine.h"
#include "alpaca/util/error.h"
#include "engine_impl.h"

namespace alpaca::fsdp {
namespace {

using Impl = FsdpEngine::Impl;

std::vector<FlatParameter*> flats_of(Impl::Unit& unit) {
  std::vector<FlatParameter*> out;
  if (unit.train) out.push_back(unit.train.get());
  if (unit.frozen) out.push_back(unit.frozen.get());
  return out;
}

// The full fp32 flat buffer of `shard` (padded,) on the compute device: the shard itself when
// nothing is sharded, else an all-gather over the shard communicator. Collective.
at::Tensor gather_fp32(Impl& impl, const at::Tensor& shard, int64_t padded_numel) {
  at::Tensor src = shard.to(impl.device, at::kFloat);
  if (impl.shard_world == 1) return src;
  at::Tensor full = at::empty({padded_numel}, src.options());
  impl.shard_comm->all_gather_into(full, src.contiguous())->wait();
  return full;
}

}  // namespace

void FsdpEngine::load_parameters(const ParamRangeReader& reader, bool rank0_only) {
  Impl& impl = *impl_;
  ALPACA_CHECK(!impl.backward_started, "FsdpEngine::load_parameters during backward");
  for (auto& unit : impl.units) {
    for (FlatParameter* flat : flats_of(unit)) {
      const ShardInfo& si = flat->shard_info();
      if (!rank0_only) {
        for (const auto& e : flat->entries()) {
          auto slice = param_shard_slice(e.offset, e.numel, si);
          if (!slice) continue;
          at::Tensor dst = flat->shard().narrow(0, slice->shard_offset, slice->numel());
          if (dst.device().is_cpu()) {
            reader(e.name, e.shape, slice->param_begin, slice->param_end, dst);  // straight into the shard
          } else {
            at::Tensor buf = at::empty({slice->numel()}, at::kFloat);
            reader(e.name, e.shape, slice->param_begin, slice->param_end, buf);
            dst.copy_(buf);
          }
        }
        continue;
      }
      // rank 0 reads this unit, everybody receives it: one unit in full at a time.
      at::Tensor full = at::zeros({si.padded_numel}, at::TensorOptions().dtype(at::kFloat).device(impl.device));
      if (impl.comm->rank() == 0) {
        at::Tensor host = at::zeros({si.padded_numel}, at::kFloat);
        for (const auto& e : flat->entries()) reader(e.name, e.shape, 0, e.numel, host.narrow(0, e.offset, e.numel));
        full.copy_(host);
      }
      if (impl.comm->world_size() > 1) impl.comm->broadcast(full, 0)->wait();
      flat->shard().copy_(full.narrow(0, si.shard_begin, si.shard_numel));
    }
    impl.reshard(unit.index);  // values changed: a resident full buffer would be stale
  }
}

void FsdpEngine::export_full_state(const NamedTensorSink& sink, bool all_ranks) {
  Impl& impl = *impl_;
  const bool receive = all_ranks || impl.comm->rank() == 0;
  // Root first so the HF order (embeddings, layers, norm, head) is roughly kept.
  std::vector<int> order{impl.num_layers};
  for (int u = 0; u < impl.num_layers; ++u) order.push_back(u);
  for (int u : order) {
    for (FlatParameter* flat : flats_of(impl.units[u])) {
      at::Tensor full = gather_fp32(impl, flat->shard(), flat->shard_info().padded_numel);
      if (!receive) continue;
      for (const auto& e : flat->entries())
        sink(e.name, full.narrow(0, e.offset, e.numel).view(e.shape).to(at::kCPU, at::kFloat, false, /*copy=*/true));
    }
  }
}

void FsdpEngine::gather_optimizer_state_by_name(const optim::ShardedAdamW& opt, const OptimStateSink& sink,
                                                bool all_ranks) {
  Impl& impl = *impl_;
  const bool receive = all_ranks || impl.comm->rank() == 0;
  size_t k = 0;
  for (auto& unit : impl.units) {
    if (!unit.train) continue;
    ALPACA_CHECK(k < opt.num_shards(), "gather_optimizer_state_by_name: optimizer was not built from this engine");
    const FlatParameter& flat = *unit.train;
    for (const char* key : {"exp_avg", "exp_avg_sq"}) {
      const at::Tensor& state = std::string(key) == "exp_avg" ? opt.exp_avg(k) : opt.exp_avg_sq(k);
      at::Tensor full = gather_fp32(impl, state, flat.shard_info().padded_numel);
      if (!receive) continue;
      for (const auto& e : flat.entries())
        sink(e.name, key, full.narrow(0, e.offset, e.numel).view(e.shape).to(at::kCPU, at::kFloat, false, true));
    }
    ++k;
  }
}

void FsdpEngine::load_optimizer_state_by_name(optim::ShardedAdamW& opt, const OptimStateSource& source) {
  Impl& impl = *impl_;
  size_t k = 0;
  for (auto& unit : impl.units) {
    if (!unit.train) continue;
    ALPACA_CHECK(k < opt.num_shards(), "load_optimizer_state_by_name: optimizer was not built from this engine");
    const FlatParameter& flat = *unit.train;
    for (const char* key : {"exp_avg", "exp_avg_sq"}) {
      at::Tensor state = std::string(key) == "exp_avg" ? opt.exp_avg(k) : opt.exp_avg_sq(k);
      for (const auto& e : flat.entries()) {
        auto slice = param_shard_slice(e.offset, e.numel, flat.shard_info());
        if (!slice) continue;
        at::Tensor src = source(e.name, key);
        ALPACA_CHECK(src.defined() && src.numel() == e.numel,
                     "optimizer state " << key << " of " << e.name << " has " << (src.defined() ? src.numel() : 0)
                     << " elements, the parameter has " << e.numel << "; the checkpoint does not match the model");
        state.narrow(0, slice->shard_offset, slice->numel())
            .copy_(src.reshape({-1}).narrow(0, slice->param_begin, slice->numel()));
      }
    }
    ++k;
  }
}

}  // namespace alpaca::fsdp
