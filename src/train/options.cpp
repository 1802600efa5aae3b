// Resolution of step values against the run length; see include/alpaca/train/options.h.
#include "alpaca/train/options.h"

#include <cmath>

namespace alpaca::train {

int64_t resolve_interval_steps(double value, int64_t total_steps) {
  if (value <= 0) return 0;
  if (value < 1) return static_cast<int64_t>(std::ceil(value * static_cast<double>(total_steps)));
  return static_cast<int64_t>(value);
}

int64_t warmup_steps_for(double warmup_steps, double warmup_ratio, int64_t total_steps) {
  if (warmup_steps > 0) return resolve_interval_steps(warmup_steps, total_steps);
  return static_cast<int64_t>(std::ceil(static_cast<double>(total_steps) * warmup_ratio));
}

}  // namespace alpaca::train
