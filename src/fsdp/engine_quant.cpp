// FsdpEngine with a 4-bit frozen base (--load_in_4bit): building a unit's QuantStore and gathering
// its bytes. See src/fsdp/quant_store.h for the layout; engine.cpp unpacks in wait_gather.
#include "alpaca/dist/communicator.h"
#include "alpaca/util/error.h"
#include "engine_impl.h"

namespace alpaca::fsdp {

void FsdpEngine::Impl::build_quant(Unit& unit, std::vector<FlatParamEntry> frozen, FlatParamOptions opt) {
  // A model built with values (not on the meta device) gives them to the store here: the frozen
  // FlatParameter keeps no shard and repoints the parameters into its (freed) full buffer.
  std::vector<at::Tensor> values(frozen.size());
  for (size_t e = 0; e < frozen.size(); ++e)
    if (!frozen[e].param.is_meta()) values[e] = frozen[e].param.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
  opt.store_shard = false;
  unit.frozen = std::make_unique<FlatParameter>(std::move(frozen), shard_world, shard_rank, opt);
  model::Quant4Options q;
  q.type = model::parse_quant4_type(policy.quant4_type);
  q.nested = policy.quant4_nested;
  unit.quant = std::make_unique<QuantStore>(*unit.frozen, q, shard_world, shard_rank, opt.master_device);
  for (size_t e = 0; e < values.size(); ++e)
    if (values[e].defined()) unit.quant->load_entry(e, values[e]);
}

void FsdpEngine::Impl::gather_quant(Unit& unit) {
  unit.frozen->alloc_full();
  const at::Tensor lp = unit.quant->shard().to(device);  // bytes: no dtype cast
  unit.quant_blob = at::empty({unit.quant->padded_bytes()}, lp.options());
  if (!communicate_shards()) {
    unit.quant_blob.copy_(lp);
    return;
  }
  if (probe) {  // the same buffers, no communication (set_memory_probe)
    unit.quant_blob.zero_();
    unit.quant_blob.narrow(0, static_cast<int64_t>(shard_rank) * lp.numel(), lp.numel()).copy_(lp);
    unit.gather_inputs.push_back(lp);
    return;
  }
  // The communicator moves floating-point buffers; an all-gather copies their bytes unchanged.
  unit.gather_work.push_back(shard_comm->all_gather_into(unit.quant_blob.view(at::kFloat), lp.view(at::kFloat)));
  unit.gather_inputs.push_back(lp);
}

int64_t FsdpEngine::frozen_shard_bytes(int u) const {
  const Impl::Unit& unit = impl_->units.at(u);
  if (unit.quant) return unit.quant->shard().nbytes();
  return unit.frozen ? unit.frozen->shard().nbytes() : 0;
}

}  // namespace alpaca::fsdp
