// 4-bit NF4 / FP4 block quantization, byte-exact with bitsandbytes 0.50 on the CPU
// (`bitsandbytes.functional.quantize_4bit` / `dequantize_4bit`, nested = compress_statistics):
//   - a tensor is flattened; each block of `blocksize` values (the last one may be partial) gets
//     absmax = max |x| in fp32; values are scaled by 1/absmax (a partial last block: divided by
//     its absmax, clamped >= 1e-38, as backends/default/ops.py does), clamped to [-1, 1] and mapped
//     to the code whose bucket holds them (bucketize on the midpoints of the sorted code book: a
//     value on a midpoint takes the lower code);
//   - two codes a byte, the FIRST element in the HIGH nibble; an odd count is padded with the code
//     of 0.0;
//   - nested ("double") quantization of the absmax values: offset = mean(absmax),
//     absmax - offset quantized in blocks of 256 to the signed 8-bit dynamic map with one fp32
//     absmax a block, exactly as bitsandbytes' native CPU kernel does it (a 65,536-entry table);
//   - dequantization: code[q] * absmax[block] in fp32, rounded once to the output dtype.
// The model's linears are the only tensors it is meant for, but nothing here depends on them.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace alpaca::model {

enum class Quant4Type { kNf4, kFp4 };

// "nf4" / "fp4" (bitsandbytes' names); parse throws alpaca::Error naming the value otherwise.
std::string quant4_type_name(Quant4Type type);
Quant4Type parse_quant4_type(const std::string& name);

constexpr int64_t kQuant4DefaultBlocksize = 64;
constexpr int64_t kQuant4NestedBlocksize = 256;  // absmax values per nested (8-bit) block

struct Quant4Options {
  Quant4Type type = Quant4Type::kNf4;
  int64_t blocksize = kQuant4DefaultBlocksize;  // 32, 64, ..., 4096 (bitsandbytes' valid sizes)
  bool nested = false;                          // bnb_4bit_use_double_quant
  bool operator==(const Quant4Options&) const = default;
};

// bitsandbytes' QuantState of one tensor (what `Linear4bit` saves beside the packed weight).
struct Quant4State {
  Quant4Type type = Quant4Type::kNf4;
  int64_t blocksize = kQuant4DefaultBlocksize;
  std::vector<int64_t> shape;                   // the original tensor's shape
  at::Tensor absmax;                            // (num_blocks,) fp32; uint8 codes when nested
  bool nested = false;
  float offset = 0.0f;                          // nested: mean of the fp32 absmax values
  at::Tensor nested_absmax;                     // nested: (ceil(num_blocks / 256),) fp32
  int64_t numel() const;
  int64_t num_blocks() const;
};

struct Quant4Tensor {
  at::Tensor packed;  // (ceil(numel / 2), 1) uint8, bitsandbytes' layout
  Quant4State state;
};

// Quantizes a fp32 / bf16 / fp16 tensor (any shape, any device: it is read on the CPU).
Quant4Tensor quantize_4bit(const at::Tensor& x, const Quant4Options& options);

// The fp32 absmax values of a state (nested: code8[q] * nested_absmax[i / 256] + offset).
at::Tensor dequantize_absmax(const Quant4State& state);

// The tensor in `dtype` (fp32 / bf16 / fp16), shaped like the original, on the CPU.
at::Tensor dequantize_4bit(const at::Tensor& packed, const Quant4State& state, at::ScalarType dtype);

// The kernel under dequantize_4bit: `numel` values from `packed` (block b scaled by absmax[b]) into
// out_flat, a contiguous CPU fp32 / bf16 / fp16 tensor of at least numel elements. Used by the FSDP
// engine to dequantize a gathered unit straight into its full parameter buffer.
void dequantize_4bit_into(const uint8_t* packed, const float* absmax, int64_t numel, int64_t blocksize,
                          Quant4Type type, at::Tensor& out_flat);

// The same values from ATen ops, for `packed` (uint8) and `absmax` (fp32 (blocks,)) on any device
// (the FSDP engine's GPU path): code[q] * absmax[block] in fp32, rounded once into out_flat's
// dtype; `chunk` values at a time (a multiple of blocksize and of 2), so the temporaries (the
// codes as int64, the repeated scales, the fp32 product) stay about 17 bytes x chunk.
constexpr int64_t kQuant4DequantChunk = int64_t{1} << 20;
void dequantize_4bit_aten(const at::Tensor& packed, const at::Tensor& absmax, int64_t numel, int64_t blocksize,
                          Quant4Type type, at::Tensor out_flat, int64_t chunk = kQuant4DequantChunk);

// bitsandbytes' 8-bit blockwise quantization on the CPU (quantize_blockwise with the signed
// dynamic map) and its inverse, for fp32 input: (codes uint8 like x, absmax (ceil(n / blocksize),)).
std::pair<at::Tensor, at::Tensor> quantize_blockwise_8bit(const at::Tensor& x, int64_t blocksize);
at::Tensor dequantize_blockwise_8bit(const at::Tensor& codes, const at::Tensor& absmax, int64_t blocksize);

// The code books: the 16 4-bit values indexed by code; the 256-value signed dynamic map
// (create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8)), sorted.
const std::array<float, 16>& quant4_code(Quant4Type type);
const std::array<float, 256>& dynamic_map_8bit();

// Bytes a tensor of `numel` values takes quantized (packed bytes + absmax storage + nested
// absmax + offset): the memory counters' and the planner's formula.
int64_t quant4_bytes(int64_t numel, const Quant4Options& options);

}  // namespace alpaca::model
