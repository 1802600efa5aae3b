// FsdpEngine state movement: loading parameters into shards, exporting full parameters one unit
// at a time, and optimizer state by parameter name (resume on another world size).
#include <algorithm>
#include <functional>
#include <string>

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
  if (unit.frozen && !unit.quant) out.push_back(unit.frozen.get());  // a 4-bit base: see load_quant
  return out;
}

// A 4-bit frozen base (--load_in_4bit): each tensor of the unit is read whole (one at a time; the
// nested statistics need every block's absmax), quantized, and only this rank's bytes are kept.
// With rank0_only, rank 0 reads and broadcasts. Collective when rank0_only. A tensor `quant` gives
// already 4-bit (a pre-quantized checkpoint) is copied as bytes, each rank its own shard's.
void load_quant(Impl& impl, Impl::Unit& unit, const ParamRangeReader& reader, bool rank0_only,
                const std::function<bool(const std::string&)>& include, const Quant4Reader& quant) {
  const auto& entries = unit.frozen->entries();
  for (size_t e = 0; e < entries.size(); ++e) {
    const FlatParamEntry& entry = entries[e];
    if (include && !include(entry.name)) continue;
    model::Quant4Tensor stored;
    if (quant && unit.quant->entry_quantized(e) && quant(entry.name, entry.shape, stored)) {
      unit.quant->load_quantized(e, stored);
      continue;
    }
    at::Tensor full = at::empty({entry.numel}, at::kFloat);
    if (!rank0_only || impl.comm->rank() == 0) reader(entry.name, entry.shape, 0, entry.numel, full);
    if (rank0_only && impl.comm->world_size() > 1) {
      at::Tensor d = full.to(impl.device);
      impl.comm->broadcast(d, 0)->wait();
      full = d.to(at::kCPU);
    }
    unit.quant->load_entry(e, full);
  }
}

// The full fp32 flat buffer of `shard` (padded,) on the compute device: the shard itself when
// nothing is sharded, else an all-gather over the shard communicator. Collective.
at::Tensor gather_fp32(Impl& impl, const at::Tensor& shard, int64_t padded_numel) {
  at::Tensor src = shard.to(impl.device, at::kFloat);
  if (!impl.communicate_shards()) return src;
  at::Tensor full = at::empty({padded_numel}, src.options());
  impl.shard_comm->all_gather_into(full, src.contiguous())->wait();
  return full;
}

// `fn(flat, key, state)` for the AdamW moments ("exp_avg", "exp_avg_sq"; Lion: "exp_avg") of every trainable
// unit, in the order the optimizer holds its shards, and for 8-bit moments their block scales
// ("exp_avg_absmax", "exp_avg_sq_absmax", per element); `op` names the caller in the error for an
// optimizer that was built from another engine. Between the optimizer's begin/end_state_io.
void for_each_moment(Impl& impl, const optim::ShardedAdamW& opt, const char* op,
                     const std::function<void(const FlatParameter&, const char*, at::Tensor)>& fn) {
  size_t k = 0;
  for (auto& unit : impl.units) {
    if (!unit.train) continue;
    ALPACA_CHECK(k < opt.num_shards(), op << ": optimizer was not built from this engine");
    fn(*unit.train, "exp_avg", opt.exp_avg(k));
    if (opt.has_exp_avg_sq()) fn(*unit.train, "exp_avg_sq", opt.exp_avg_sq(k));
    if (opt.quantized()) {
      fn(*unit.train, "exp_avg_absmax", opt.exp_avg_absmax(k));
      if (opt.has_exp_avg_sq()) fn(*unit.train, "exp_avg_sq_absmax", opt.exp_avg_sq_absmax(k));
    }
    ++k;
  }
}

}  // namespace

std::vector<LocalParamShard> FsdpEngine::local_param_shards() const {
  Impl& impl = *impl_;
  std::vector<LocalParamShard> out;
  size_t k = 0;
  for (auto& unit : impl.units) {
    for (FlatParameter* flat : flats_of(unit)) {
      const bool trainable = flat == unit.train.get();
      for (const auto& e : flat->entries()) {
        auto slice = param_shard_slice(e.offset, e.numel, flat->shard_info());
        if (!slice) continue;
        out.push_back({e.name, e.shape, slice->param_begin, slice->param_end, trainable, trainable ? k : 0,
                       slice->shard_offset, flat->shard().narrow(0, slice->shard_offset, slice->numel())});
      }
    }
    if (unit.train) ++k;
  }
  return out;
}

std::pair<int, int> FsdpEngine::shard_replica() const {
  const auto& rc = impl_->replicate_comm;
  return rc ? std::make_pair(rc->rank(), rc->world_size()) : std::make_pair(0, 1);
}

void FsdpEngine::load_parameters(const ParamRangeReader& reader, bool rank0_only,
                                 const std::function<bool(const std::string&)>& include, const Quant4Reader& quant) {
  Impl& impl = *impl_;
  ALPACA_CHECK(!impl.backward_started, "FsdpEngine::load_parameters during backward");
  auto wanted = [&](const FlatParamEntry& e) { return !include || include(e.name); };
  for (auto& unit : impl.units) {
    if (unit.quant) load_quant(impl, unit, reader, rank0_only, include, quant);
    for (FlatParameter* flat : flats_of(unit)) {
      const ShardInfo& si = flat->shard_info();
      if (!rank0_only) {
        for (const auto& e : flat->entries()) {
          if (!wanted(e)) continue;
          auto slice = param_shard_slice(e.offset, e.numel, si);
          if (!slice) continue;
          at::Tensor dst = flat->shard().narrow(0, slice->shard_offset, slice->numel());
          if (dst.device().is_cpu() && dst.scalar_type() == at::kFloat) {
            reader(e.name, e.shape, slice->param_begin, slice->param_end, dst);  // straight into the shard
          } else {  // a device shard, or a frozen shard kept in param_dtype: the reader fills fp32
            at::Tensor buf = at::empty({slice->numel()}, at::kFloat);
            reader(e.name, e.shape, slice->param_begin, slice->param_end, buf);
            dst.copy_(buf);
          }
        }
        continue;
      }
      // rank 0 reads one parameter, everybody receives it and keeps its slice: no rank holds more
      // than one tensor in full.
      for (const auto& e : flat->entries()) {
        if (!wanted(e)) continue;
        at::Tensor full = at::empty({e.numel}, at::TensorOptions().dtype(at::kFloat).device(impl.device));
        if (impl.comm->rank() == 0) {
          at::Tensor host = at::empty({e.numel}, at::kFloat);
          reader(e.name, e.shape, 0, e.numel, host);
          full.copy_(host);
        }
        if (impl.comm->world_size() > 1) impl.comm->broadcast(full, 0)->wait();
        auto slice = param_shard_slice(e.offset, e.numel, si);
        if (slice)
          flat->shard().narrow(0, slice->shard_offset, slice->numel())
              .copy_(full.narrow(0, slice->param_begin, slice->numel()));
      }
    }
    impl.reshard(unit.index);  // values changed: a resident full buffer would be stale
    unit.staged_version = -1;  // and so would the param_dtype copy of the shard (a reader may write raw bytes)
  }
}

void FsdpEngine::export_full_state(const NamedTensorSink& sink, bool all_ranks) {
  Impl& impl = *impl_;
  const bool receive = all_ranks || impl.comm->rank() == 0;
  for (int u : impl.layout.export_order()) {
    Impl::Unit& unit = impl.units[u];
    if (unit.quant) {  // the 4-bit base dequantized into param_dtype, as training sees it
      impl.unshard(u, /*wait=*/true);
      if (receive)
        for (const auto& e : unit.frozen->entries())
          sink(e.name, unit.frozen->full().narrow(0, e.offset, e.numel).view(e.shape).to(at::kCPU, at::kFloat, false, true));
      impl.reshard(u);
    }
    for (FlatParameter* flat : flats_of(unit)) {
      at::Tensor full = gather_fp32(impl, flat->shard(), flat->shard_info().padded_numel);
      if (!receive) continue;
      for (const auto& e : flat->entries())
        sink(e.name, full.narrow(0, e.offset, e.numel).view(e.shape).to(at::kCPU, at::kFloat, false, /*copy=*/true));
    }
  }
}

void FsdpEngine::export_trainable_state(const NamedTensorSink& sink, bool all_ranks) {
  Impl& impl = *impl_;
  const bool receive = all_ranks || impl.comm->rank() == 0;
  for (int u : impl.layout.export_order()) {
    const FlatParameter* flat = impl.units[u].train.get();
    if (!flat) continue;
    at::Tensor full = gather_fp32(impl, flat->shard(), flat->shard_info().padded_numel);
    if (!receive) continue;
    for (const auto& e : flat->entries())
      sink(e.name, full.narrow(0, e.offset, e.numel).view(e.shape).to(at::kCPU, at::kFloat, false, /*copy=*/true));
  }
}

at::Tensor FsdpEngine::gather_rows(const std::string& name, int64_t row_begin, int64_t row_end) {
  Impl& impl = *impl_;
  for (auto& unit : impl.units) {
    for (FlatParameter* flat : flats_of(unit)) {
      for (const auto& e : flat->entries()) {
        if (e.name != name && std::find(e.aliases.begin(), e.aliases.end(), name) == e.aliases.end()) continue;
        ALPACA_CHECK(e.shape.size() == 2 && row_begin >= 0 && row_begin <= row_end && row_end <= e.shape[0],
                     "gather_rows: " << name << " has shape " << at::IntArrayRef(e.shape) << ", rows [" << row_begin
                                     << ", " << row_end << ") requested");
        const int64_t cols = e.shape[1];
        const int64_t begin = row_begin * cols, end = row_end * cols;  // in the parameter's elements
        at::Tensor out = at::zeros({end - begin}, at::TensorOptions().dtype(at::kFloat).device(impl.device));
        // This rank's part: the intersection of [begin, end) with its shard of the parameter.
        auto slice = param_shard_slice(e.offset, e.numel, flat->shard_info());
        if (slice) {
          const int64_t lo = std::max(begin, slice->param_begin), hi = std::min(end, slice->param_end);
          if (lo < hi)
            out.narrow(0, lo - begin, hi - lo)
                .copy_(flat->shard().narrow(0, slice->shard_offset + (lo - slice->param_begin), hi - lo));
        }
        if (impl.communicate_shards()) impl.shard_comm->all_reduce(out, dist::ReduceOp::kSum)->wait();
        return out.view({row_end - row_begin, cols}).to(at::kCPU);
      }
    }
  }
  ALPACA_FAIL("gather_rows: the model has no parameter " << name);
}

void FsdpEngine::gather_optimizer_state_by_name(optim::ShardedAdamW& opt, const OptimStateSink& sink,
                                                bool all_ranks) {
  Impl& impl = *impl_;
  const bool receive = all_ranks || impl.comm->rank() == 0;
  opt.begin_state_io();
  for_each_moment(impl, opt, "gather_optimizer_state_by_name",
                  [&](const FlatParameter& flat, const char* key, const at::Tensor& state) {
                    at::Tensor full = gather_fp32(impl, state, flat.shard_info().padded_numel);
                    if (!receive) return;
                    for (const auto& e : flat.entries())
                      sink(e.name, key,
                           full.narrow(0, e.offset, e.numel).view(e.shape).to(at::kCPU, at::kFloat, false, true));
                  });
  opt.end_state_io();
}

void FsdpEngine::load_optimizer_state_by_name(optim::ShardedAdamW& opt, const OptimStateSource& source) {
  // 8-bit moments: the checkpoint's block scales, when it has them (asked of the first trainable
  // parameter, the same answer on every rank); else its fp32 moments are quantized afresh.
  bool have_absmax = false;
  if (opt.quantized())
    for (auto& unit : impl_->units)
      if (unit.train && !unit.train->entries().empty()) {
        have_absmax = source(unit.train->entries().front().name, "exp_avg_absmax").defined();
        break;
      }
  opt.begin_state_io();
  for_each_moment(*impl_, opt, "load_optimizer_state_by_name",
                  [&](const FlatParameter& flat, const char* key, at::Tensor state) {
                    const bool scales = std::string(key).ends_with("_absmax");
                    for (const auto& e : flat.entries()) {
                      auto slice = param_shard_slice(e.offset, e.numel, flat.shard_info());
                      if (!slice) continue;
                      if (scales && !have_absmax) continue;
                      at::Tensor src = source(e.name, key);
                      ALPACA_CHECK(src.defined() && src.numel() == e.numel,
                                   "optimizer state " << key << " of " << e.name << " has "
                                                      << (src.defined() ? src.numel() : 0)
                                                      << " elements, the parameter has " << e.numel
                                                      << "; the checkpoint does not match the model");
                      state.narrow(0, slice->shard_offset, slice->numel())
                          .copy_(src.reshape({-1}).narrow(0, slice->param_begin, slice->numel()));
                    }
                  });
  opt.end_state_io(/*written=*/true, have_absmax);  // collective for 8-bit moments without scales
}

}  // namespace alpaca::fsdp
