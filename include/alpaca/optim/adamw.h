// AdamW over flat fp32 shards (DESIGN.md "FSDP"): each rank steps only the shard it owns, in place,
// with ATen's fused AdamW kernel (CPU and CUDA), the math of torch.optim.AdamW. Weight decay is
// chosen per element range so one flat buffer can mix decayed weights with biases/norm weights.
//
// With options.bnb_bits the update is bitsandbytes' AdamW instead (transformers' --optim
// adamw_bnb_8bit / adamw_8bit / paged_adamw_8bit / paged_adamw_32bit), operation for operation as its
// CPU kernels run it (bnb_adamw.cpp). At 8 bits each parameter of at least 4096 elements keeps its
// moments as uint8 codes of bitsandbytes' dynamic maps (signed for the first, unsigned for the
// second) scaled per block of 256 of the parameter's elements by the block's largest magnitude: 2
// bytes an element and 8 a block instead of 8 an element. Smaller parameters and nn.Embedding
// weights (transformers registers a 32-bit override for them) keep fp32 moments. A block the shard
// boundary cuts lives on two or more ranks; its scale is the maximum over all of them, which the
// `block_max_reducer` (an all-reduce MAX over the shard group) provides once per step, so the codes
// and scales are those of one process holding the whole parameter, at every world size.
//
// With options.lion (and bnb_bits) it is bitsandbytes' Lion, the same machinery with one state: the
// momentum (exp_avg), 8-bit with the signed map or fp32, and no second moment.
//
// With options.adafactor the update is transformers' Adafactor (adafactor.cpp): a matrix keeps the
// running means of its squared gradient per row and per column, a vector per element. Those
// statistics are small (rows + columns a matrix) and every rank of the shard group keeps all of
// them, for every parameter of its flat buffers: each step all-reduces (SUM) the rows', columns' and
// vector elements' partial sums of this rank's parts, so the replicas move together, and then each
// parameter's update norm (the clipping's RMS). Not per element, so not sharded: a checkpoint holds
// them by parameter name, as torch's Adafactor state names them.
#pragma once

#include <ATen/ATen.h>  // defines: at::Tensor

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "alpaca/optim/adamw_options.h"

namespace alpaca::optim {

// A contiguous element range of a shard and whether weight decay applies to it. Ranges not
// covered by any segment (padding) are never updated.
struct ParamSegment {
  int64_t offset = 0;
  int64_t numel = 0;
  bool decay = true;
  // bitsandbytes' AdamW needs one segment per parameter part: where it starts in its parameter,
  // the parameter's size, and whether it is an nn.Embedding weight (32-bit moments at 8 bits).
  int64_t param_begin = 0;
  int64_t param_numel = 0;  // 0: unknown (torch AdamW; bnb treats the segment as a whole parameter)
  bool embedding = false;
  int64_t param_index = -1;  // Adafactor: the parameter in OptimShard::params
};

// A parameter of a flat buffer (Adafactor factors a matrix's statistics by its shape; a checkpoint
// names them by the parameter).
struct ShardParam {
  std::string name;
  std::vector<int64_t> shape;
};

// One flat shard the optimizer steps: the fp32 master values and their fp32 gradient (same
// device, same size), plus the segments that hold real parameters.
struct OptimShard {
  at::Tensor param;  // (S,) fp32, updated in place
  at::Tensor grad;   // (S,) fp32
  std::vector<ParamSegment> segments;
  int shard_rank = 0;   // this shard is [rank * S, (rank + 1) * S) of a flat buffer cut in
  int shard_world = 1;  // shard_world equal shards (8-bit blocks cut by those boundaries)
  // Every parameter of the flat buffer, in order, whether or not this shard holds part of it
  // (per-parameter shards: Adafactor lays its statistics out by them on every rank alike).
  std::vector<ShardParam> params{};
};

// An all-reduce over the ranks of the shard group, in place, of a small fp32 tensor on the shards'
// device: MAX (8-bit blocks cut by shards) or SUM (Adafactor's statistics).
using ShardReducer = std::function<void(at::Tensor&)>;
using BlockMaxReducer = ShardReducer;

// bitsandbytes' dynamic quantization map (functional.create_dynamic_map): signed for the first
// moment, unsigned for the second; 256 sorted fp32 values in [-1, 1] / [0, 1].
at::Tensor bnb_quantization_map(bool is_signed);

// transformers' Trainer registers bitsandbytes' 32-bit override for nn.Embedding modules' weights:
// `name` or an alias (tied lm_head) is an embed_tokens weight (a modules_to_save copy too).
bool bnb_embedding_weight(const std::string& name, const std::vector<std::string>& aliases);
// Bytes ShardedAdamW keeps for one segment under 8-bit bitsandbytes AdamW (moments 2) or Lion
// (moments 1), the memory planner's count: codes and block scales, or fp32 moments (under 4096
// elements, an embedding).
int64_t bnb8_segment_state_bytes(const ParamSegment& seg, int moments = 2);

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
  // 8-bit blocks cut by shard boundaries need it (collective from then on: step and
  // end_state_io call it on every rank of the shard group). Without one the shards must be whole.
  void set_block_max_reducer(BlockMaxReducer reducer) { reducer_ = std::move(reducer); }
  // Adafactor over shards of more than one rank needs it (step is collective then).
  void set_sum_reducer(ShardReducer reducer) { sum_reducer_ = std::move(reducer); }
  bool adafactor() const { return options_.adafactor; }

  // Adafactor's statistics by parameter: "exp_avg_sq_row" (shape[:-1]) and "exp_avg_sq_col"
  // (shape[-1:]) of a matrix, "exp_avg_sq" (shape) of a vector, as torch's Adafactor.state names
  // them. Views into the state every rank holds whole: a checkpoint reads them and a resume writes
  // them (every rank, the same values).
  struct NamedState {
    std::string param, key;
    at::Tensor value;
  };
  std::vector<NamedState> adafactor_state() const;

  // AdamW's first and second moments of shard i (not Adafactor's), (S,) fp32 like the shard (padding stays zero). With
  // 8-bit moments they exist only between begin_state_io() and end_state_io(): dequantized there,
  // and quantized back when end_state_io(true) is told they were written (a resume).
  at::Tensor exp_avg(size_t i) const;
  at::Tensor exp_avg_sq(size_t i) const;
  // exp_avg_sq and its scales exist only when has_exp_avg_sq().
  // 8-bit moments: every element's block scale of each moment, (S,) fp32 (0 where the moment is
  // 32-bit), for checkpoints: with it the codes restore exactly (the code whose code x scale is the
  // dequantized moment; quantizing the moment again would not give it back, bitsandbytes' table
  // being coarser than its codes near zero); without (a checkpoint of fp32 moments),
  // end_state_io(true) quantizes as a step does. Between begin_state_io() and end_state_io() only.
  at::Tensor exp_avg_absmax(size_t i) const;
  at::Tensor exp_avg_sq_absmax(size_t i) const;
  bool quantized() const { return options_.bnb_bits == 8; }
  // AdamW keeps exp_avg and exp_avg_sq; Lion only exp_avg; Adafactor neither (adafactor_state()).
  bool has_exp_avg_sq() const { return !options_.lion && !options_.adafactor; }
  // No-ops for fp32 moments. end_state_io(written, have_absmax) is collective at 8 bits.
  void begin_state_io();
  void end_state_io(bool written = false, bool have_absmax = true);

  // Bytes of optimizer state held by this rank (moments, codes, block scales; Adafactor's statistics).
  int64_t state_bytes() const;

  // bitsandbytes' state of one 8-bit segment (for tests): codes and per-block scales, blocks
  // counted from the first block the segment touches. Undefined tensors for a 32-bit segment.
  struct QuantState {
    at::Tensor code1, code2;      // uint8 (numel)
    at::Tensor absmax1, absmax2;  // fp32 (blocks)
  };
  QuantState quant_state(size_t shard, size_t segment) const;

  // One segment's moments under bitsandbytes at 8 bits: codes and block scales, or fp32 moments
  // (a parameter under 4096 elements, an embedding). bnb_adamw.cpp.
  struct SegmentState {
    bool eight = false;
    at::Tensor m, v;              // fp32 (numel), 32-bit segments
    at::Tensor q1, q2;            // uint8 (numel), 8-bit segments
    at::Tensor absmax1, absmax2;  // fp32 (blocks touched), 8-bit segments
  };

 private:
  void init_bnb_states();  // bnb_adamw.cpp
  void init_adafactor();   // adafactor.cpp
  void step_adafactor(double lr);
  const at::Tensor& io_tensor(const std::vector<at::Tensor>& v, size_t i, bool scales) const;
  void step_bnb(double lr);
  bool cuts_blocks() const;  // some 8-bit block spans shards: the reducer is called (collective)
  // fn(shard, segment, the shard's first reduction slot) for every non-empty segment; returns the
  // number of reduction slots (world - 1 per shard). The bitsandbytes and Adafactor steps both walk it.
  int64_t visit_segments(const std::function<void(size_t, size_t, int64_t)>& fn) const;
  std::vector<OptimShard> shards_;
  AdamWOptions options_;
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_, absmax_io_[2];
  std::vector<std::vector<SegmentState>> seg_states_;  // bnb: [shard][segment]
  BlockMaxReducer reducer_;
  // Adafactor: each parameter's statistics in factor_state_ ([shard][param]), one fp32 vector.
  struct FactorParam {
    int64_t offset = 0;  // in factor_state_
    int64_t rows = 1, cols = 1;  // a matrix's shape; a vector: rows 1, cols its numel
    bool factored = false;
  };
  std::vector<std::vector<FactorParam>> factor_params_;
  at::Tensor factor_state_, factor_divisor_;  // the statistics; per entry, the count its mean divides by
  ShardReducer sum_reducer_;
  bool io_open_ = false;
  int64_t step_count_ = 0;
};

}  // namespace alpaca::optim
