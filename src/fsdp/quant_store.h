// QuantStore: one FSDP unit's frozen base held 4-bit (QLoRA, --load_in_4bit). Private to fsdp/.
//
// The unit's frozen FlatParameter keeps its full buffer in param_dtype and the parameter views
// into it, but no shard of its own. Instead the unit's frozen tensors are laid out in a byte blob
// (include/alpaca/fsdp/quant_layout.h, the layout the memory planner counts too) and rank r keeps
// bytes [r*S, (r+1)*S): it is all-gathered as bytes (viewed as fp32 for the communicator, a
// bitwise copy) and unpacked (dequantized) into the full buffer when the unit is unsharded, in
// forward and again in backward; the dequantized weights go when the unit reshards. The nested
// offsets (one float a tensor) are metadata every rank computes alike at load.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "alpaca/fsdp/flat_param.h"
#include "alpaca/fsdp/quant_layout.h"
#include "alpaca/model/quant4.h"

namespace alpaca::fsdp {

class QuantStore {
 public:
  // `frozen` was built with store_shard = false; the blob shard lives on `master_device`.
  QuantStore(const FlatParameter& frozen, const model::Quant4Options& options, int shard_world, int shard_rank,
             at::Device master_device);

  const at::Tensor& shard() const { return shard_; }  // (shard_bytes,) uint8
  int64_t padded_bytes() const { return layout_.padded_bytes; }
  int64_t quantized_numel() const { return layout_.quantized_numel; }
  const model::Quant4Options& options() const { return options_; }

  // Loading: the full values of frozen entry `e` (any dtype/device): cast to param_dtype,
  // quantized (or kept raw), and this rank's bytes of the result stored. Local.
  void load_entry(size_t e, const at::Tensor& values);
  // Loading a pre-quantized tensor (bitsandbytes' bytes and state, e.g. zero-copy views of a
  // checkpoint): only this rank's bytes are copied. Its quantization, shape and sizes must be this
  // store's (throws naming them otherwise; nothing is written then).
  void load_quantized(size_t e, const model::Quant4Tensor& q);
  // The full blob (padded_bytes,) uint8 on the compute device -> frozen.full() (allocated).
  void unpack(const at::Tensor& full_blob, FlatParameter& frozen) const;
  bool entry_quantized(size_t e) const { return layout_.segments.at(e).quantized; }

 private:
  using Segment = QuantSegment;
  void write(int64_t begin, const at::Tensor& bytes);  // keeps the part inside this rank's shard
  at::Tensor absmax_of(const Segment& s, size_t e, const at::Tensor& blob) const;  // fp32 (blocks,)

  model::Quant4Options options_;
  at::ScalarType param_dtype_;
  QuantLayout layout_;
  std::vector<float> offsets_;  // nested quantization's offset per entry
  int64_t shard_begin_ = 0;
  at::Tensor shard_;
};

}  // namespace alpaca::fsdp
