// safetensors header parse (include/alpaca/io/safetensors_header.h).
#include "alpaca/io/safetensors_header.h"

#include <algorithm>
#include <cstdint>

#include <c10/util/accumulate.h>  // defines: c10::multiply_integers
#include <nlohmann/json.hpp>  // defines: nlohmann::json

#include "alpaca/util/error.h"

namespace alpaca::io {
namespace {

using nlohmann::json;

// safetensors' own limit on the header; a larger value is a corrupt or hostile file.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

const std::vector<std::pair<std::string, at::ScalarType>>& dtype_table() {
  static const std::vector<std::pair<std::string, at::ScalarType>> table = {
      {"F64", at::kDouble}, {"F32", at::kFloat},  {"F16", at::kHalf},  {"BF16", at::kBFloat16},
      {"I64", at::kLong},   {"I32", at::kInt},    {"I16", at::kShort}, {"I8", at::kChar},
      {"U8", at::kByte},    {"BOOL", at::kBool},  {"F8_E4M3", at::kFloat8_e4m3fn},
      {"F8_E5M2", at::kFloat8_e5m2}};
  return table;
}

}  // namespace

int64_t TensorInfo::numel() const { return c10::multiply_integers(shape); }

std::string safetensors_dtype_name(at::ScalarType dtype) {
  for (const auto& [name, t] : dtype_table())
    if (t == dtype) return name;
  ALPACA_FAIL("dtype " << dtype << " cannot be stored in safetensors");
}

at::ScalarType parse_safetensors_dtype(const std::string& name, const std::string& context) {
  for (const auto& [n, t] : dtype_table())
    if (n == name) return t;
  ALPACA_FAIL(context << ": unknown dtype \"" << name
                      << "\" (known: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL F8_E4M3 F8_E5M2)");
}

namespace {

// The header's JSON object; sets h.data_offset (8 + the header length) after bounding it.
json read_header_json(const uint8_t* base, uint64_t file_size, const std::string& path, SafetensorsHeader& h) {
  ALPACA_CHECK(file_size >= 8, path << ": truncated safetensors file (" << file_size
                                     << " bytes, shorter than the 8-byte header length); re-download or re-save it");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | base[i];
  ALPACA_CHECK(header_len <= file_size - 8,
               path << ": header length " << header_len << " runs past the end of the file (" << file_size
                    << " bytes); the file is truncated or not safetensors");
  ALPACA_CHECK(header_len <= kMaxHeaderBytes, path << ": header length " << header_len << " exceeds the 100 MB limit");
  h.data_offset = static_cast<int64_t>(8 + header_len);
  json header;
  try {
    header = json::parse(reinterpret_cast<const char*>(base + 8), reinterpret_cast<const char*>(base + 8 + header_len));
  } catch (const json::exception& e) {
    ALPACA_FAIL(path << ": header is not valid JSON (" << e.what() << ")");
  }
  ALPACA_CHECK(header.is_object(), path << ": header must be a JSON object");
  return header;
}

void read_metadata(const json& e, const std::string& path, SafetensorsHeader& h) {
  ALPACA_CHECK(e.is_object(), path << ": __metadata__ must be an object of strings");
  for (auto m = e.begin(); m != e.end(); ++m) {
    ALPACA_CHECK(m.value().is_string(), path << ": __metadata__ value \"" << m.key() << "\" must be a string");
    h.metadata[m.key()] = m.value().get<std::string>();
  }
}

// The shape; its element count in *numel, checked against int64 overflow.
std::vector<int64_t> read_shape(const json& shape, const std::string& where, int64_t* numel) {
  ALPACA_CHECK(shape.is_array(), where << ": shape must be a list of integers");
  std::vector<int64_t> out;
  *numel = 1;
  for (const json& d : shape) {
    ALPACA_CHECK(d.is_number_unsigned(), where << ": shape must hold non-negative integers, got " << shape.dump());
    const uint64_t dim = d.get<uint64_t>();
    // A product over int64 (or a dimension above it) is no real tensor: reject it before
    // numel() or the byte count can overflow.
    ALPACA_CHECK(dim <= static_cast<uint64_t>(INT64_MAX) && !__builtin_mul_overflow(*numel, static_cast<int64_t>(dim), numel),
                 where << ": shape " << shape.dump() << " has more elements than a file can hold; the header is corrupt");
    out.push_back(static_cast<int64_t>(dim));
  }
  return out;
}

// Sets ti.data_begin/data_end from data_offsets, within the data section of data_size bytes.
void read_offsets(const json& off, const std::string& where, int64_t data_size, TensorInfo& ti) {
  ALPACA_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(),
               where << ": data_offsets must be [begin, end] non-negative integers, got " << off.dump());
  // Offsets past the data section are rejected below; first keep them from wrapping negative.
  ALPACA_CHECK(off[0].get<uint64_t>() <= static_cast<uint64_t>(data_size) && off[1].get<uint64_t>() <= static_cast<uint64_t>(data_size),
               where << ": data_offsets " << off.dump() << " are out of range: the data section has only "
                     << data_size << " bytes (file truncated or header corrupt)");
  ti.data_begin = off[0].get<int64_t>();
  ti.data_end = off[1].get<int64_t>();
  ALPACA_CHECK(ti.data_begin <= ti.data_end, where << ": data_offsets " << off.dump() << " end before they begin");
  ALPACA_CHECK(ti.data_end <= data_size,
               where << ": data_offsets " << off.dump() << " are out of range: the data section has only "
                     << data_size << " bytes (file truncated or header corrupt)");
}

TensorInfo read_tensor_entry(const std::string& name, const json& e, const std::string& path, int64_t data_size) {
  const std::string where = path + ": tensor \"" + name + "\"";
  ALPACA_CHECK(e.is_object() && e.contains("dtype") && e.contains("shape") && e.contains("data_offsets"),
               where << " must have dtype, shape and data_offsets");
  ALPACA_CHECK(e["dtype"].is_string(), where << ": dtype must be a string");
  TensorInfo ti;
  ti.name = name;
  ti.file = path;
  ti.dtype = parse_safetensors_dtype(e["dtype"].get<std::string>(), where);
  int64_t numel = 1;
  ti.shape = read_shape(e["shape"], where, &numel);
  const json& off = e["data_offsets"];
  read_offsets(off, where, data_size, ti);
  int64_t expect = 0;
  ALPACA_CHECK(!__builtin_mul_overflow(numel, static_cast<int64_t>(c10::elementSize(ti.dtype)), &expect),
               where << ": shape " << e["shape"].dump() << " needs more bytes than a file can hold; the header is corrupt");
  ALPACA_CHECK(ti.nbytes() == expect, where << ": data_offsets " << off.dump() << " hold " << ti.nbytes()
                                            << " bytes but dtype " << e["dtype"].get<std::string>() << " x shape "
                                            << e["shape"].dump() << " needs " << expect);
  return ti;
}

// Sorts the tensors by offset and rejects overlaps (empty tensors may share an offset).
void sort_and_check_overlaps(std::vector<TensorInfo>& tensors, const std::string& path) {
  std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.data_begin != b.data_begin ? a.data_begin < b.data_begin : a.data_end < b.data_end;
  });
  for (size_t i = 1; i < tensors.size(); ++i) {
    if (tensors[i].nbytes() == 0) continue;
    // Compare against the last non-empty tensor: empty tensors may share an offset.
    for (size_t j = i; j-- > 0;) {
      if (tensors[j].nbytes() == 0) continue;
      ALPACA_CHECK(tensors[i].data_begin >= tensors[j].data_end,
                   path << ": tensors \"" << tensors[j].name << "\" and \"" << tensors[i].name
                        << "\" overlap in the data section; the file is corrupt");
      break;
    }
  }
}

}  // namespace

SafetensorsHeader parse_safetensors_header(const uint8_t* base, uint64_t file_size, const std::string& path) {
  SafetensorsHeader h;
  const json header = read_header_json(base, file_size, path, h);
  const int64_t data_size = static_cast<int64_t>(file_size) - h.data_offset;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      read_metadata(it.value(), path, h);
      continue;
    }
    h.tensors.push_back(read_tensor_entry(it.key(), it.value(), path, data_size));
  }
  sort_and_check_overlaps(h.tensors, path);
  return h;
}

}  // namespace alpaca::io
