// Sharded AdamW; see include/alpaca/optim/adamw.h. The fused kernel updates a list of tensors
// with one weight decay, so each shard's segments are split into a decay list and a no-decay list
// of views into the flat buffers (views write through to the shard).
#include "alpaca/optim/adamw.h"

#include "alpaca/util/error.h"

namespace alpaca::optim {

ShardedAdamW::ShardedAdamW(std::vector<OptimShard> shards, AdamWOptions options)
    : shards_(std::move(shards)), options_(options) {
  for (size_t i = 0; i < shards_.size(); ++i) {
    const auto& s = shards_[i];
    ALPACA_CHECK(s.param.defined() && s.grad.defined(), "ShardedAdamW: shard " << i << " has no tensor");
    ALPACA_CHECK(s.param.scalar_type() == at::kFloat && s.grad.scalar_type() == at::kFloat,
                 "ShardedAdamW: shard " << i << " must be fp32 master values and fp32 gradients");
    ALPACA_CHECK(s.param.sizes() == s.grad.sizes() && s.param.device() == s.grad.device(),
                 "ShardedAdamW: shard " << i << " gradient does not match its parameter");
    for (const auto& seg : s.segments)
      ALPACA_CHECK(seg.offset >= 0 && seg.numel >= 0 && seg.offset + seg.numel <= s.param.numel(),
                   "ShardedAdamW: segment outside shard " << i);
    if (options_.bnb_bits == 8 || options_.adafactor) continue;  // per segment / per parameter (init_*)
    exp_avg_.push_back(at::zeros_like(s.param));
    if (has_exp_avg_sq()) exp_avg_sq_.push_back(at::zeros_like(s.param));
  }
  ALPACA_CHECK(!options_.lion || options_.bnb_bits, "ShardedAdamW: Lion is bitsandbytes' (bnb_bits 8 or 32)");
  ALPACA_CHECK(options_.bnb_bits == 0 || options_.bnb_bits == 8 || options_.bnb_bits == 32,
               "ShardedAdamW: bitsandbytes AdamW has 8- or 32-bit states, not " << options_.bnb_bits);
  ALPACA_CHECK(!(options_.adafactor && options_.bnb_bits), "ShardedAdamW: Adafactor has no bitsandbytes variant");
  if (options_.bnb_bits) init_bnb_states();
  if (options_.adafactor) init_adafactor();
}

// The moments (fp32 ones always; 8-bit ones dequantized, between begin/end_state_io) and the block
// scales (8-bit moments, between begin/end_state_io).
const at::Tensor& ShardedAdamW::io_tensor(const std::vector<at::Tensor>& v, size_t i, bool scales) const {
  ALPACA_CHECK(!options_.adafactor, "ShardedAdamW: Adafactor keeps no per-element moments (adafactor_state())");
  ALPACA_CHECK(scales ? quantized() && io_open_ : !quantized() || io_open_,
               "ShardedAdamW: " << (scales ? "block scales exist for 8-bit moments" : "8-bit moments are read and written")
                                << " between begin_state_io() and end_state_io()");
  return v.at(i);
}

at::Tensor ShardedAdamW::exp_avg(size_t i) const { return io_tensor(exp_avg_, i, false); }
at::Tensor ShardedAdamW::exp_avg_sq(size_t i) const {
  ALPACA_CHECK(has_exp_avg_sq(), "ShardedAdamW: Lion keeps no second moment");
  return io_tensor(exp_avg_sq_, i, false);
}
at::Tensor ShardedAdamW::exp_avg_absmax(size_t i) const { return io_tensor(absmax_io_[0], i, true); }
at::Tensor ShardedAdamW::exp_avg_sq_absmax(size_t i) const {
  ALPACA_CHECK(has_exp_avg_sq(), "ShardedAdamW: Lion keeps no second moment");
  return io_tensor(absmax_io_[1], i, true);
}

void ShardedAdamW::set_step_count(int64_t step) {
  ALPACA_CHECK(step >= 0, "ShardedAdamW: negative step count " << step);
  step_count_ = step;
}

void ShardedAdamW::step(double lr) {
  ++step_count_;
  if (options_.bnb_bits) {
    step_bnb(lr);
    return;
  }
  if (options_.adafactor) {
    step_adafactor(lr);
    return;
  }
  // Lists per (device, decay) group; the kernel needs every list on one device.
  struct Group {
    std::vector<at::Tensor> p, g, m, v, steps;
  };
  for (size_t i = 0; i < shards_.size(); ++i) {
    Group groups[2];  // [0] no decay, [1] decay
    const auto& s = shards_[i];
    for (const auto& seg : s.segments) {
      if (seg.numel == 0) continue;
      Group& gr = groups[seg.decay ? 1 : 0];
      gr.p.push_back(s.param.narrow(0, seg.offset, seg.numel));
      gr.g.push_back(s.grad.narrow(0, seg.offset, seg.numel));
      gr.m.push_back(exp_avg_[i].narrow(0, seg.offset, seg.numel));
      gr.v.push_back(exp_avg_sq_[i].narrow(0, seg.offset, seg.numel));
      // The kernel reads the step count (after increment, as torch.optim does) from a tensor.
      gr.steps.push_back(at::full({}, static_cast<double>(step_count_),
                                  at::TensorOptions().dtype(at::kFloat).device(s.param.device())));
    }
    for (int d = 0; d < 2; ++d) {
      Group& gr = groups[d];
      if (gr.p.empty()) continue;
      at::_fused_adamw_(gr.p, gr.g, gr.m, gr.v, /*max_exp_avg_sqs=*/{}, gr.steps, lr, options_.beta1,
                        options_.beta2, d == 1 ? options_.weight_decay : 0.0, options_.eps,
                        /*amsgrad=*/false, /*maximize=*/false);
    }
    // The fused kernel writes the parameters without moving their version counter; readers that
    // cache a converted copy (the FSDP engine's offload staging) rely on it moving.
    s.param.unsafeGetTensorImpl()->bump_version();
  }
}

int64_t ShardedAdamW::state_bytes() const {
  int64_t bytes = 0;
  if (options_.adafactor) return factor_state_.defined() ? static_cast<int64_t>(factor_state_.nbytes()) : 0;
  if (quantized()) {
    for (const auto& shard : seg_states_)
      for (const SegmentState& st : shard)
        for (const at::Tensor* t : {&st.m, &st.v, &st.q1, &st.q2, &st.absmax1, &st.absmax2})
          if (t->defined()) bytes += static_cast<int64_t>(t->nbytes());
    return bytes;
  }
  for (const auto* v : {&exp_avg_, &exp_avg_sq_})
    for (const at::Tensor& t : *v) bytes += static_cast<int64_t>(t.nbytes());
  return bytes;
}

}  // namespace alpaca::optim
