#include "alpaca/model/kv_cache.h"

#include "alpaca/util/error.h"

namespace alpaca::model {

KvCache::KvCache(const LlamaConfig& cfg, int64_t batch, int64_t capacity, const at::TensorOptions& options)
    : batch_(batch), capacity_(capacity) {
  ALPACA_CHECK(batch > 0 && capacity > 0, "KvCache needs a positive batch and capacity, got " << batch << " x " << capacity);
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    k_.push_back(at::empty({batch, cfg.num_key_value_heads, capacity, cfg.head_dim}, options));
    v_.push_back(at::empty({batch, cfg.num_key_value_heads, capacity, cfg.head_dim}, options));
  }
}

std::pair<at::Tensor, at::Tensor> KvCache::update(int64_t layer, const at::Tensor& k_bhtd, const at::Tensor& v_bhtd) {
  ALPACA_CHECK(layer >= 0 && layer < num_layers(), "KvCache has " << num_layers() << " layers, asked for " << layer);
  const int64_t t = k_bhtd.size(2);
  ALPACA_CHECK(length_ + t <= capacity_, "KvCache is full: " << length_ << " + " << t << " positions exceed its capacity "
                                                              << capacity_);
  ALPACA_CHECK(k_bhtd.size(0) == batch_, "KvCache holds " << batch_ << " rows, got keys for " << k_bhtd.size(0));
  at::Tensor& k = k_[layer];
  at::Tensor& v = v_[layer];
  k.narrow(2, length_, t).copy_(k_bhtd);
  v.narrow(2, length_, t).copy_(v_bhtd);
  return {k.narrow(2, 0, length_ + t), v.narrow(2, 0, length_ + t)};
}

void KvCache::advance(int64_t num_positions) {
  ALPACA_CHECK(num_positions >= 0 && length_ + num_positions <= capacity_,
               "KvCache: cannot advance " << length_ << " by " << num_positions << " (capacity " << capacity_ << ")");
  length_ += num_positions;
}

void KvCache::select_rows(const at::Tensor& rows) {
  at::Tensor idx = rows.to(k_.empty() ? rows.device() : k_[0].device(), at::kLong);
  for (auto* buffers : {&k_, &v_})
    for (at::Tensor& t : *buffers) t = t.index_select(0, idx);
  batch_ = idx.numel();
}

}  // namespace alpaca::model
