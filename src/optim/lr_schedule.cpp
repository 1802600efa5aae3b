// HF schedules, transcribed from transformers/optimization.py (v5): the same float arithmetic
// in the same order so results agree to the last bits.
#include "alpaca/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "alpaca/util/error.h"

namespace alpaca::optim {
namespace {

constexpr double kPi = 3.14159265358979323846;

double warmup_factor(int64_t step, int64_t warmup) {
  return static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup));
}

double progress(const LrSchedule& s, int64_t step) {
  return static_cast<double>(step - s.num_warmup_steps) /
         static_cast<double>(std::max<int64_t>(1, s.num_training_steps - s.num_warmup_steps));
}

double min_lr_rate_of(const LrSchedule& s) {
  if (s.min_lr) return *s.min_lr / s.base_lr;
  return *s.min_lr_rate;
}

}  // namespace

ScheduleType parse_schedule_type(const std::string& word) {
  if (word == "linear") return ScheduleType::kLinear;
  if (word == "cosine") return ScheduleType::kCosine;
  if (word == "cosine_with_restarts") return ScheduleType::kCosineWithRestarts;
  if (word == "polynomial") return ScheduleType::kPolynomial;
  if (word == "constant") return ScheduleType::kConstant;
  if (word == "constant_with_warmup") return ScheduleType::kConstantWithWarmup;
  if (word == "inverse_sqrt") return ScheduleType::kInverseSqrt;
  if (word == "cosine_with_min_lr") return ScheduleType::kCosineWithMinLr;
  ALPACA_FAIL("--lr_scheduler_type '" << word
              << "' is not supported; use one of linear, cosine, cosine_with_restarts, polynomial, "
                 "constant, constant_with_warmup, inverse_sqrt, cosine_with_min_lr");
}

void validate(const LrSchedule& s) {
  ALPACA_CHECK(s.num_warmup_steps >= 0, "lr schedule: negative warmup steps " << s.num_warmup_steps);
  if (s.type == ScheduleType::kPolynomial)
    ALPACA_CHECK(s.base_lr > s.lr_end, "lr schedule polynomial: lr_end (" << s.lr_end
                 << ") must be smaller than initial lr (" << s.base_lr << ")");
  if (s.type == ScheduleType::kCosineWithMinLr) {
    ALPACA_CHECK(!(s.min_lr && s.min_lr_rate),
                 "lr schedule cosine_with_min_lr: only one of min_lr or min_lr_rate should be set");
    ALPACA_CHECK(s.min_lr || s.min_lr_rate,
                 "lr schedule cosine_with_min_lr: one of min_lr or min_lr_rate must be set "
                 "through --lr_scheduler_kwargs");
  }
}

double lr_multiplier(const LrSchedule& s, int64_t step) {
  const int64_t w = s.num_warmup_steps;
  const int64_t t = s.num_training_steps;
  switch (s.type) {
    case ScheduleType::kConstant:
      return 1.0;
    case ScheduleType::kConstantWithWarmup:
      if (step < w) return static_cast<double>(step) / std::max(1.0, static_cast<double>(w));
      return 1.0;
    case ScheduleType::kLinear:
      if (step < w) return warmup_factor(step, w);
      return std::max(0.0, static_cast<double>(t - step) /
                               static_cast<double>(std::max<int64_t>(1, t - w)));
    case ScheduleType::kCosine: {
      if (step < w) return warmup_factor(step, w);
      const double cycles = s.num_cycles.value_or(0.5);
      return std::max(0.0, 0.5 * (1.0 + std::cos(kPi * cycles * 2.0 * progress(s, step))));
    }
    case ScheduleType::kCosineWithRestarts: {
      if (step < w) return warmup_factor(step, w);
      const double p = progress(s, step);
      if (p >= 1.0) return 0.0;
      const double cycles = s.num_cycles.value_or(1.0);
      // Python's % on non-negative floats equals fmod.
      return std::max(0.0, 0.5 * (1.0 + std::cos(kPi * std::fmod(cycles * p, 1.0))));
    }
    case ScheduleType::kPolynomial: {
      if (step < w) return warmup_factor(step, w);
      if (step > t) return s.lr_end / s.base_lr;
      const double lr_range = s.base_lr - s.lr_end;
      const double decay_steps = static_cast<double>(t - w);
      const double pct_remaining = 1.0 - static_cast<double>(step - w) / decay_steps;
      const double decay = lr_range * std::pow(pct_remaining, s.power) + s.lr_end;
      return decay / s.base_lr;
    }
    case ScheduleType::kInverseSqrt: {
      const int64_t timescale = s.timescale.value_or(w != 0 ? w : 10000);
      if (step < w) return warmup_factor(step, w);
      const int64_t shift = timescale - w;
      return 1.0 / std::sqrt(static_cast<double>(step + shift) / static_cast<double>(timescale));
    }
    case ScheduleType::kCosineWithMinLr: {
      if (step < w) return warmup_factor(step, w);
      const double cycles = s.num_cycles.value_or(0.5);
      const double rate = min_lr_rate_of(s);
      double factor = 0.5 * (1.0 + std::cos(kPi * cycles * 2.0 * progress(s, step)));
      factor = factor * (1 - rate) + rate;
      return std::max(0.0, factor);
    }
  }
  ALPACA_FAIL("lr schedule: unknown type");
}

double learning_rate(const LrSchedule& s, int64_t step) { return s.base_lr * lr_multiplier(s, step); }

}  // namespace alpaca::optim
