// KvCache: the keys and values of every decoder layer for incremental decoding (generation).
// Preallocated to a fixed capacity so a decode step writes in place instead of concatenating;
// every batch row shares one length (padding is expressed by the attention mask, as transformers'
// DynamicCache does). Single device: the buffers live where `options` says.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include <ATen/ATen.h>  // defines: at::Tensor

#include "alpaca/model/config.h"

namespace alpaca::model {

class KvCache {
 public:
  // Buffers (batch, num_key_value_heads, capacity, head_dim) per layer in `options` (the model's
  // compute dtype and device).
  KvCache(const LlamaConfig& cfg, int64_t batch, int64_t capacity, const at::TensorOptions& options);

  int64_t length() const { return length_; }  // positions already stored (every row)
  int64_t capacity() const { return capacity_; }
  int64_t batch() const { return batch_; }
  int64_t num_layers() const { return static_cast<int64_t>(k_.size()); }

  // Writes k/v (B, Hkv, T, Dh) of `layer` at positions [length, length + T) and returns that
  // layer's keys and values over [0, length + T) as views. The length itself moves only with
  // advance(), after every layer has written its T positions.
  std::pair<at::Tensor, at::Tensor> update(int64_t layer, const at::Tensor& k_bhtd, const at::Tensor& v_bhtd);
  void advance(int64_t num_positions);

  // Layer `layer`'s whole key / value buffer (B, Hkv, capacity, Dh), contiguous, for kernels that
  // write position length() themselves (CpuDecoder, through mutable_data_ptr) before advance().
  // The tensors themselves are not replaceable from outside.
  const at::Tensor& key_buffer(int64_t layer) const { return k_.at(static_cast<size_t>(layer)); }
  const at::Tensor& value_buffer(int64_t layer) const { return v_.at(static_cast<size_t>(layer)); }

  // Keeps only batch rows `rows` (int64 indices, in that order), e.g. to drop finished sequences.
  void select_rows(const at::Tensor& rows);

 private:
  std::vector<at::Tensor> k_, v_;  // per layer (B, Hkv, capacity, Dh)
  int64_t batch_, capacity_, length_ = 0;
};

}  // namespace alpaca::model
