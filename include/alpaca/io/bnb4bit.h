// bitsandbytes' pre-quantized 4-bit checkpoints (`*-bnb-4bit` directories, written by
// Linear4bit._save_to_state_dict): beside each packed uint8 weight W ([n/2, 1]) it stores
// W.absmax, W.quant_map, with nested quantization W.nested_absmax and W.nested_quant_map, and
// W.quant_state.bitsandbytes__<nf4|fp4>, a uint8 tensor holding the state as JSON (quant_type,
// blocksize, dtype, shape, nested_blocksize, nested_dtype, nested_offset); config.json carries
// quantization_config. Read into model::Quant4Tensor (model/quant4.h), checked on the way.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "alpaca/io/checkpoint.h"
#include "alpaca/model/quant4.h"

namespace alpaca::io {

// The key of `name`'s quant_state ("" when `name` is not stored 4-bit).
std::string bnb4bit_state_key(const CheckpointReader& ckpt, const std::string& name);

// Whether `name` is a side tensor of a 4-bit weight (absmax, quant_map, nested_*, quant_state).
bool is_bnb4bit_side_tensor(const std::string& name);

// The stored 4-bit tensor `name` (zero-copy views for safetensors). Throws naming the tensor when
// its quant_state's shape is not `shape` (unless `shape` is empty), when a stored tensor's dtype or
// size disagrees with the state, when its code books are not bitsandbytes', or when its blocksize
// is not 64 / its nested blocksize not 256.
model::Quant4Tensor read_bnb4bit(const CheckpointReader& ckpt, const std::string& name,
                                 const std::vector<int64_t>& shape);

// The dtype `name` was quantized from (its quant_state's "dtype": float32, bfloat16 or float16).
at::ScalarType bnb4bit_dtype(const CheckpointReader& ckpt, const std::string& name);

// config.json's quantization_config in `dir`, when it describes a bitsandbytes 4-bit checkpoint.
struct Bnb4bitConfig {
  std::string quant_type;  // bnb_4bit_quant_type ("fp4" when absent: BitsAndBytesConfig's default)
  bool nested = false;     // bnb_4bit_use_double_quant
  std::string storage;     // bnb_4bit_quant_storage ("uint8" when absent)
};
// Throws for an 8-bit (LLM.int8) bitsandbytes checkpoint, which nothing here reads.
std::optional<Bnb4bitConfig> read_bnb4bit_config(const std::string& dir);

}  // namespace alpaca::io
