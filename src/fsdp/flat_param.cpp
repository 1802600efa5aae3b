// FlatParameter; see include/alpaca/fsdp/flat_param.h.
#include "alpaca/fsdp/flat_param.h"

#include <c10/core/StorageImpl.h>

#include "alpaca/util/error.h"
#include "alpaca/util/pinned.h"

namespace alpaca::fsdp {

FlatParameter::FlatParameter(std::vector<FlatParamEntry> entries, int shard_world, int shard_rank,
                             const FlatParamOptions& options)
    : entries_(std::move(entries)), options_(options) {
  int64_t offset = 0;
  for (auto& e : entries_) {
    ALPACA_CHECK(e.param.defined(), "FlatParameter: parameter " << e.name << " is undefined");
    ALPACA_CHECK(e.param.is_floating_point(), "FlatParameter: parameter " << e.name << " is not floating point");
    ALPACA_CHECK(e.param.is_leaf(), "FlatParameter: parameter " << e.name << " is not a leaf tensor");
    e.shape = e.param.sizes().vec();
    e.numel = e.param.numel();
    e.offset = offset;
    offset += e.numel;
  }
  shard_ = fsdp::shard_info(offset, shard_world, shard_rank);

  const auto master = at::TensorOptions().dtype(options_.master_dtype).device(options_.master_device);
  // Padding stays zero forever: it is never a parameter, so its gradient is zero too.
  const int64_t stored = options_.store_shard ? shard_.shard_numel : 0;
  if (options_.pin_memory && options_.master_device.is_cpu()) {
    // Offload to a GPU: pinned, exactly sized (util/pinned.h: not the caching host allocator's powers of two).
    shard_fp32_ = util::empty_pinned({stored}, options_.master_dtype).zero_();
    if (options_.with_grad) grad_fp32_ = util::empty_pinned({shard_.shard_numel}, at::kFloat).zero_();
  } else {
    shard_fp32_ = at::zeros({stored}, master);
    if (options_.with_grad) grad_fp32_ = at::zeros({shard_.shard_numel}, master.dtype(at::kFloat));
  }
  for (const auto& e : entries_) {
    // No values yet (they come from FsdpEngine::load_parameters), or none kept here.
    if (e.param.is_meta() || !options_.store_shard) continue;
    auto slice = param_shard_slice(e.offset, e.numel, shard_);
    if (!slice) continue;
    at::Tensor src = e.param.detach().reshape({-1}).narrow(0, slice->param_begin, slice->numel());
    shard_fp32_.narrow(0, slice->shard_offset, slice->numel()).copy_(src);
  }

  full_ = at::empty({shard_.padded_numel},
                    at::TensorOptions().dtype(options_.param_dtype).device(options_.compute_device));
  for (auto& e : entries_) {
    // set_data keeps the tensor's identity (autograd meta, module references) and moves it onto
    // our storage; the old values are released here so no rank keeps a full copy of the model.
    // A meta-device parameter (a model built without storage) first becomes a dense tensor of the
    // compute device: set_data only moves between dense backends.
    if (e.param.is_meta()) e.param.unsafeGetTensorImpl()->_change_backend_component_keys(options_.compute_device);
    e.param.set_data(full_.narrow(0, e.offset, e.numel).view(e.shape));
  }
  free_full();
}

bool FlatParameter::full_allocated() const {
  return full_.storage().nbytes() > 0 || shard_.padded_numel == 0;
}

int64_t FlatParameter::full_bytes() const {
  return shard_.padded_numel * static_cast<int64_t>(c10::elementSize(options_.param_dtype));
}

void FlatParameter::alloc_full() {
  c10::StorageImpl* s = full_.storage().unsafeGetStorageImpl();
  if (s->nbytes() > 0) return;
  const size_t nbytes = static_cast<size_t>(full_bytes());
  s->set_data_ptr_noswap(s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}

void FlatParameter::free_full() {
  c10::StorageImpl* s = full_.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, full_.device()));
  s->set_nbytes(0);
}

}  // namespace alpaca::fsdp
