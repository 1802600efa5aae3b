// AdamW over flat fp32 shards (DESIGN.md "FSDP"): each rank steps only the shard it owns, in place,
// with ATen's fused AdamW kernel (CPU and CUDA), the math of torch.optim.AdamW. Weight decay is
// chosen per element range so one flat buffer can mix decayed weights with biases/norm weights.
#pragma once

#include <ATen/ATen.h>  // defines: at::Tensor

#include <cstdint>
#include <vector>

#include "alpaca/optim/adamw_options.h"

namespace alpaca::optim {

// A contiguous element range of a shard and whether weight decay applies to it. Ranges not
// covered by any segment (padding) are never updated.
struct ParamSegment {
  int64_t offset = 0;
  int64_t numel = 0;
  bool decay = true;
};

// One flat shard the optimizer steps: the fp32 master values and their fp32 gradient (same
// device, same size), plus the segments that hold real parameters.
struct OptimShard {
  at::Tensor param;  // (S,) fp32, updated in place
  at::Tensor grad;   // (S,) fp32
  std::vector<ParamSegment> segments;
};

class ShardedAdamW {
 public:
  ShardedAdamW(std::vector<OptimShard> shards, AdamWOptions options);

  // One AdamW update of every shard with learning rate `lr`. Not collective.
  // Updates every shard in place and moves each shard's version counter (at::Tensor::_version),
  // which the fused kernel alone does not.
  void step(double lr);

  int64_t step_count() const { return step_count_; }
  void set_step_count(int64_t step);  // for resume
  const AdamWOptions& options() const { return options_; }
  size_t num_shards() const { return shards_.size(); }
  const OptimShard& shard(size_t i) const { return shards_.at(i); }
  // First and second moments of shard i, (S,) fp32 like the shard (padding stays zero).
  at::Tensor exp_avg(size_t i) const { return exp_avg_.at(i); }
  at::Tensor exp_avg_sq(size_t i) const { return exp_avg_sq_.at(i); }
  // Bytes of optimizer state held by this rank (moments and step counters).
  int64_t state_bytes() const;

 private:
  std::vector<OptimShard> shards_;
  AdamWOptions options_;
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_;
  int64_t step_count_ = 0;
};

}  // namespace alpaca::optim
