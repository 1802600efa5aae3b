// The safetensors header, parsed and validated from bytes in memory: u64 little-endian header
// length N, N bytes of JSON {"__metadata__": {...}, "<name>": {"dtype", "shape", "data_offsets"}}.
// Separate from the reader (safetensors.h) so the parse needs only c10's ScalarType, not ATen:
// the fuzz target links this file alone.
#pragma once

#include <c10/core/ScalarType.h>  // defines: at::ScalarType

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace alpaca::io {

// Where a tensor lives and what it is. Byte offsets are relative to the file's data section.
struct TensorInfo {
  std::string name;
  std::string file;  // path of the file that holds it
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  int64_t data_begin = 0;
  int64_t data_end = 0;
  int64_t numel() const;
  int64_t nbytes() const { return data_end - data_begin; }
};

// "F32" <-> at::kFloat etc. The parse throws naming `context` for an unknown dtype.
std::string safetensors_dtype_name(at::ScalarType dtype);
at::ScalarType parse_safetensors_dtype(const std::string& name, const std::string& context);

struct SafetensorsHeader {
  int64_t data_offset = 0;          // 8 + header length: where the data section starts
  std::vector<TensorInfo> tensors;  // sorted by data_begin
  std::map<std::string, std::string> metadata;
};

// Validates the whole header of a file whose first `file_size` bytes are at `base`: the length
// lies within the file, dtypes are known, every byte range matches its shape, lies inside the data
// section and overlaps no other. Throws alpaca::Error naming `path` (and the tensor) otherwise.
SafetensorsHeader parse_safetensors_header(const uint8_t* base, uint64_t file_size, const std::string& path);

}  // namespace alpaca::io
