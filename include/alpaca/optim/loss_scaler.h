// Dynamic loss scaling for fp16 training (torch.amp.GradScaler's policy): the trainer multiplies
// the loss by scale() before backward; after backward, unscale_or_skip() checks every rank's
// gradients for inf/NaN (one all-reduce), and either unscales them (step proceeds) or skips the
// step and backs the scale off.
#pragma once

#include <ATen/ATen.h>  // defines: at::Tensor

#include <cstdint>
#include <vector>

namespace alpaca::dist {
class Communicator;
}

namespace alpaca::optim {

struct LossScalerOptions {
  double init_scale = 65536.0;  // 2^16, torch.amp.GradScaler defaults
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

class DynamicLossScaler {
 public:
  explicit DynamicLossScaler(LossScalerOptions options = {});

  double scale() const { return scale_; }
  // Returns true when the optimizer step should run (gradients were divided by the scale), false
  // when some rank overflowed (gradients untouched; caller zeroes them and skips the step).
  // Collective over comm (nullptr = single process).
  bool unscale_or_skip(const std::vector<at::Tensor>& grad_shards, dist::Communicator* comm);

  int64_t num_skipped() const { return num_skipped_; }
  void set_state(double scale, int64_t growth_tracker);  // for resume
  int64_t growth_tracker() const { return growth_tracker_; }

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int64_t num_skipped_ = 0;
};

}  // namespace alpaca::optim
