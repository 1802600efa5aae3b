// safetensors read/write. The reader memory-maps the file, validates the whole header up front
// (length within the file, known dtypes, byte ranges that match the shapes, lie inside the data
// and do not overlap) and hands out zero-copy views; byte-range reads let an FSDP rank read only
// its shard of a tensor. The writer streams tensors to disk one at a time.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/ATen.h>  // defines: at::Tensor, at::ScalarType

#include "alpaca/io/safetensors_header.h"  // defines: TensorInfo, parse_safetensors_dtype

namespace alpaca::io {

class SafetensorsFile {
 public:
  // Maps and validates `path`; throws alpaca::Error naming the file (and tensor) on bad input.
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;  // in data order
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The tensor as stored: a zero-copy CPU view that keeps the mapping alive (a copy only when
  // its bytes are misaligned for the dtype). The mapping is private: writing to the view never
  // changes the file.
  at::Tensor tensor(const std::string& name) const;
  // Elements [elem_begin, elem_begin + elem_count) of the flattened tensor, as a 1-D view.
  at::Tensor tensor_range(const std::string& name, int64_t elem_begin, int64_t elem_count) const;
  // Tells the kernel this process is done with the tensor's pages, so a loader that copied it
  // into a parameter does not keep the mapped copy resident too. Views of this tensor taken
  // earlier must not be used afterwards for anything written: their pages revert to the file.
  void release(const std::string& name) const;

 private:
  struct Mapping;
  SafetensorsFile() = default;
  std::string path_;
  std::shared_ptr<Mapping> mapping_;
  int64_t data_offset_ = 0;  // 8 + header length
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Streams tensors into one safetensors file: data goes straight to disk after a reserved header
// region, so memory stays at one tensor. The file appears under `path` only after finish().
class SafetensorsWriter {
 public:
  explicit SafetensorsWriter(std::string path);
  ~SafetensorsWriter();  // removes the partial file if finish() was not reached
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  void add(const std::string& name, const at::Tensor& t);  // any device; written contiguous
  int64_t data_bytes() const { return data_bytes_; }
  size_t num_tensors() const { return entries_.size(); }
  void finish(const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

 private:
  struct Entry {
    std::string name;
    at::ScalarType dtype;
    std::vector<int64_t> shape;
    int64_t begin, end;
  };
  std::string path_, tmp_path_;
  int fd_ = -1;
  int64_t data_bytes_ = 0;
  std::vector<Entry> entries_;
  bool finished_ = false;
};

// Writes `tensors` in order to `path` with {"format": "pt"} metadata (plus `metadata`).
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

}  // namespace alpaca::io
