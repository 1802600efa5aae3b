// A Hugging Face checkpoint directory, whatever its weight layout: model.safetensors, sharded
// safetensors (model.safetensors.index.json), pytorch_model.bin, or sharded .bin
// (pytorch_model.bin.index.json). Tensors are read one at a time, never the whole model at once.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>  // defines: at::Tensor

#include "alpaca/io/safetensors.h"

namespace alpaca::io {

class CheckpointReader {
 public:
  // Finds the weights in `dir`; throws naming the directory when none of the layouts is there.
  static CheckpointReader open(const std::string& dir);

  const std::string& dir() const;
  // "safetensors", "safetensors-sharded", "bin" or "bin-sharded".
  const std::string& format() const;
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const;
  // dtype, shape and file. Byte offsets are meaningful for safetensors only.
  TensorInfo info(const std::string& name) const;
  // The tensor on the CPU; converted to `dtype` when given (a copy), else as stored (for
  // safetensors a zero-copy view of the mapping).
  at::Tensor read(const std::string& name, std::optional<at::ScalarType> dtype = std::nullopt) const;
  // Elements [elem_begin, elem_begin + elem_count) of the flattened tensor (1-D): an FSDP rank
  // reads just its shard. Zero-copy for safetensors.
  at::Tensor read_range(const std::string& name, int64_t elem_begin, int64_t elem_count) const;
  // Done with `name`: drops its mapped pages from this process's resident memory.
  void release(const std::string& name) const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace alpaca::io
