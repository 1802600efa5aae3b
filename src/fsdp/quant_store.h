// QuantStore: one FSDP unit's frozen base held 4-bit (QLoRA, --load_in_4bit). Private to fsdp/.
//
// The unit's frozen FlatParameter keeps its full buffer in param_dtype and the parameter views
// into it, but no shard of its own. Instead the unit's frozen tensors are laid out, one after the
// other, in a byte blob: each linear weight (a name ending in "proj.weight") as bitsandbytes'
// packed 4-bit bytes, then its absmax values (fp32, or 8-bit codes + one fp32 a 256 with nested
// quantization), every other frozen tensor (the norms) as its raw param_dtype bytes. Each fp32
// region starts on a 4-byte boundary. The blob is padded to a multiple of 4 x shard_world bytes and
// rank r keeps bytes [r*S, (r+1)*S): it is all-gathered as bytes (viewed as fp32 for the
// communicator, a bitwise copy) and unpacked (dequantized) into the full buffer when the unit is
// unsharded, in forward and again in backward; the dequantized weights go when the unit reshards.
// The nested offsets (one float a tensor) are metadata every rank computes alike at load.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "alpaca/fsdp/flat_param.h"
#include "alpaca/model/quant4.h"

namespace alpaca::fsdp {

class QuantStore {
 public:
  // `frozen` was built with store_shard = false; the blob shard lives on `master_device`.
  QuantStore(const FlatParameter& frozen, const model::Quant4Options& options, int shard_world, int shard_rank,
             at::Device master_device);

  // Whether a frozen tensor of this name and rank is held 4-bit (bitsandbytes replaces every
  // nn.Linear but lm_head; embeddings and norms stay).
  static bool quantizes(const std::string& name, int64_t dim);

  const at::Tensor& shard() const { return shard_; }  // (shard_bytes,) uint8
  int64_t padded_bytes() const { return padded_; }
  int64_t quantized_numel() const { return quantized_numel_; }
  const model::Quant4Options& options() const { return options_; }

  // Loading: the full values of frozen entry `e` (any dtype/device): cast to param_dtype,
  // quantized (or kept raw), and this rank's bytes of the result stored. Local.
  void load_entry(size_t e, const at::Tensor& values);
  // The full blob (padded_bytes,) uint8 on the compute device -> frozen.full() (allocated).
  void unpack(const at::Tensor& full_blob, FlatParameter& frozen) const;
  bool entry_quantized(size_t e) const { return segs_.at(e).quantized; }

 private:
  struct Segment {
    bool quantized = false;
    int64_t numel = 0, blocks = 0, nested_blocks = 0;
    int64_t packed = 0, absmax = 0, nested = 0;  // byte offsets in the blob (quantized)
    int64_t raw = 0;                             // byte offset of the raw param_dtype values
    std::vector<int64_t> shape;
  };
  void write(int64_t begin, const at::Tensor& bytes);  // keeps the part inside this rank's shard
  at::Tensor absmax_of(const Segment& s, size_t e, const at::Tensor& blob) const;  // fp32 (blocks,)

  model::Quant4Options options_;
  at::ScalarType param_dtype_;
  std::vector<Segment> segs_;
  std::vector<float> offsets_;  // nested quantization's offset per entry
  int64_t padded_ = 0, shard_begin_ = 0, quantized_numel_ = 0;
  at::Tensor shard_;
};

}  // namespace alpaca::fsdp
