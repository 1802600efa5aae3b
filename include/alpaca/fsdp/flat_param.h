// FlatParameter: the parameters of one FSDP unit flattened, in a fixed order, into one buffer
// padded to a multiple of the shard world; this rank keeps only its shard (the master copy: fp32
// for trainable buffers; frozen buffers, e.g. LoRA base weights, keep it in param_dtype only).
// While the unit is unsharded, a full buffer in param_dtype holds every rank's shard and each
// original parameter tensor of the module *is* a view into it (its storage is shared); resharding
// frees the bytes behind that storage without touching the tensors, so autograd's saved views see
// the re-gathered values when the buffer is allocated again in backward.
#pragma once

#include <ATen/ATen.h>  // defines: at::Tensor, at::Device, at::ScalarType

#include <string>
#include <vector>

#include "alpaca/fsdp/shard_info.h"

namespace alpaca::fsdp {

struct FlatParamEntry {
  std::string name;               // primary fully qualified (HF) name
  std::vector<std::string> aliases;  // other names of the same tensor (tied weights)
  at::Tensor param;               // the module's parameter tensor, repointed into full()
  std::vector<int64_t> shape;
  int64_t offset = 0;             // first element in the flat buffer
  int64_t numel = 0;
};

struct FlatParamOptions {
  at::ScalarType param_dtype = at::kFloat;
  at::Device compute_device{at::kCPU};  // where the full buffer lives (the communicator's device)
  at::Device master_device{at::kCPU};   // where the fp32 shard (and its grad) live (host if offload)
  bool pin_memory = false;              // pin host shards (offload with CUDA)
  bool with_grad = true;                // allocate an fp32 gradient shard (trainable buffers)
  at::ScalarType master_dtype = at::kFloat;  // dtype of the shard (frozen buffers: param_dtype)
  // false: no shard of its own (an empty one); the values live elsewhere and are written into
  // full() when unsharded (a 4-bit frozen base, src/fsdp/quant_store.h).
  bool store_shard = true;
};

class FlatParameter {
 public:
  // Takes the current values of `entries[i].param` (any dtype/device) into this rank's fp32 shard,
  // then repoints every parameter into the (freed) full buffer. Entries must be in flat order with
  // name/param set; offsets/numels/shapes are filled here.
  FlatParameter(std::vector<FlatParamEntry> entries, int shard_world, int shard_rank,
                const FlatParamOptions& options);
  FlatParameter(const FlatParameter&) = delete;
  FlatParameter& operator=(const FlatParameter&) = delete;

  const ShardInfo& shard_info() const { return shard_; }
  const std::vector<FlatParamEntry>& entries() const { return entries_; }
  const FlatParamOptions& options() const { return options_; }
  int64_t numel() const { return shard_.numel; }

  at::Tensor shard() const { return shard_fp32_; }   // (shard_numel,) master values in master_dtype
  at::Tensor grad() const { return grad_fp32_; }     // (shard_numel,) fp32; undefined if !with_grad
  at::Tensor full() const { return full_; }          // (padded_numel,) param_dtype; may be freed

  bool full_allocated() const;
  int64_t full_bytes() const;  // bytes of the full buffer when allocated
  void alloc_full();           // gives the full buffer's storage its bytes (values undefined)
  void free_full();            // releases them; parameter tensors keep their metadata

 private:
  std::vector<FlatParamEntry> entries_;
  FlatParamOptions options_;
  ShardInfo shard_;
  at::Tensor shard_fp32_, grad_fp32_, full_;
};

}  // namespace alpaca::fsdp
