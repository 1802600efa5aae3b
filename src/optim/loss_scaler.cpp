// Dynamic loss scaler; see include/alpaca/optim/loss_scaler.h.
#include "alpaca/optim/loss_scaler.h"

#include "alpaca/optim/grad_clip.h"
#include "alpaca/util/error.h"

namespace alpaca::optim {

DynamicLossScaler::DynamicLossScaler(LossScalerOptions options)
    : options_(options), scale_(options.init_scale) {
  ALPACA_CHECK(options_.init_scale > 0 && options_.growth_factor > 1.0 && options_.backoff_factor > 0 &&
                   options_.backoff_factor < 1.0 && options_.growth_interval > 0,
               "loss scaler: invalid options (scale > 0, growth > 1, 0 < backoff < 1, interval > 0)");
}

bool DynamicLossScaler::unscale_or_skip(const std::vector<at::Tensor>& grad_shards,
                                        dist::Communicator* comm) {
  if (any_non_finite(grad_shards, comm)) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
    ++num_skipped_;
    return false;
  }
  const double inv = 1.0 / scale_;
  for (const auto& g : grad_shards)
    if (g.defined()) g.mul_(inv);
  if (++growth_tracker_ == options_.growth_interval) {
    scale_ *= options_.growth_factor;
    growth_tracker_ = 0;
  }
  return true;
}

void DynamicLossScaler::set_state(double scale, int64_t growth_tracker) {
  ALPACA_CHECK(scale > 0, "loss scaler: scale must be positive, got " << scale);
  scale_ = scale;
  growth_tracker_ = growth_tracker;
}

}  // namespace alpaca::optim
