// HF schedules, transcribed from transformers/optimization.py (v5), and DeepSpeed's, from
// deepspeed/runtime/lr_schedules.py (0.19.8): the same float arithmetic in the same order so
// results agree to the last bits.
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

// DeepSpeed's WarmupLR._get_gamma / WarmupCosineLR's warmup ratio during warmup (iteration < W,
// W = max(2, warmup_num_steps)).
double deepspeed_warmup_gamma(const LrSchedule& s, int64_t iteration, int64_t floor_warmup) {
  if (s.deepspeed.log_warmup) {
    const double inverse_log_warm_up = 1.0 / std::log(static_cast<double>(floor_warmup));
    return inverse_log_warm_up * std::log(static_cast<double>(iteration + 1));
  }
  return static_cast<double>(iteration) / static_cast<double>(floor_warmup);
}

// The value of DeepSpeed's class after `iteration` scheduler steps have been counted
// (last_batch_iteration; -1 = as constructed).
double deepspeed_lr(const LrSchedule& s, int64_t iteration) {
  const int64_t w = std::max<int64_t>(2, s.num_warmup_steps);
  const int64_t t = s.num_training_steps;
  const DeepSpeedScheduleParams& p = s.deepspeed;
  if (s.type == ScheduleType::kDeepSpeedWarmupCosineLR) {
    double ratio = 0.0;  // get_lr_ratio before the scheduler has started
    if (iteration >= 0 && iteration < w) {
      ratio = p.warmup_min_ratio + deepspeed_warmup_gamma(s, iteration, w) * (1.0 - p.warmup_min_ratio);
    } else if (iteration >= w) {
      const double real_last_step = static_cast<double>(iteration - w + 1);
      const double real_total_steps = static_cast<double>(std::max<int64_t>(1, t - w));
      const double cosine_progress = std::min(1.0, real_last_step / real_total_steps);
      ratio = (1.0 + std::cos(kPi * cosine_progress)) / 2.0;
      ratio = std::max(0.0, p.cos_min_ratio + (1.0 - p.cos_min_ratio) * ratio);
    }
    return s.base_lr * ratio;
  }
  const double min_lr = p.warmup_min_lr;
  const double max_lr =
      p.warmup_max_lr.value_or(s.type == ScheduleType::kDeepSpeedWarmupDecayLR ? 0.001 : s.base_lr);
  const double delta_lr = max_lr - min_lr;
  if (iteration < 0) return min_lr;  // get_lr before the scheduler has started: the min lrs
  double gamma = 1.0;
  if (iteration < w) {
    gamma = deepspeed_warmup_gamma(s, iteration, w);
  } else if (s.type == ScheduleType::kDeepSpeedWarmupDecayLR) {
    gamma = std::max(0.0, static_cast<double>(t - iteration) / std::max(1.0, static_cast<double>(t - w)));
  }
  return min_lr + (delta_lr * gamma);
}

}  // namespace

bool is_deepspeed(ScheduleType type) {
  return type == ScheduleType::kDeepSpeedWarmupLR || type == ScheduleType::kDeepSpeedWarmupDecayLR ||
         type == ScheduleType::kDeepSpeedWarmupCosineLR;
}

ScheduleType parse_schedule_type(const std::string& word) {
  if (word == "linear") return ScheduleType::kLinear;
  if (word == "cosine") return ScheduleType::kCosine;
  if (word == "cosine_with_restarts") return ScheduleType::kCosineWithRestarts;
  if (word == "polynomial") return ScheduleType::kPolynomial;
  if (word == "constant") return ScheduleType::kConstant;
  if (word == "constant_with_warmup") return ScheduleType::kConstantWithWarmup;
  if (word == "inverse_sqrt") return ScheduleType::kInverseSqrt;
  if (word == "cosine_with_min_lr") return ScheduleType::kCosineWithMinLr;
  if (word == "cosine_warmup_with_min_lr") return ScheduleType::kCosineWarmupWithMinLr;
  if (word == "warmup_stable_decay") return ScheduleType::kWarmupStableDecay;
  if (word == "reduce_lr_on_plateau") return ScheduleType::kReduceOnPlateau;
  ALPACA_FAIL("--lr_scheduler_type '" << word
              << "' is not supported; use one of linear, cosine, cosine_with_restarts, polynomial, "
                 "constant, constant_with_warmup, inverse_sqrt, cosine_with_min_lr, cosine_warmup_with_min_lr, "
                 "warmup_stable_decay, reduce_lr_on_plateau");
}

void validate(const LrSchedule& s) {
  ALPACA_CHECK(s.num_warmup_steps >= 0, "lr schedule: negative warmup steps " << s.num_warmup_steps);
  if (is_deepspeed(s.type))
    ALPACA_CHECK(s.num_warmup_steps > 0, "DeepSpeed scheduler: warmup_num_steps must be a positive integer, got "
                 << s.num_warmup_steps);
  if (s.type == ScheduleType::kPolynomial)
    ALPACA_CHECK(s.base_lr > s.lr_end, "lr schedule polynomial: lr_end (" << s.lr_end
                 << ") must be smaller than initial lr (" << s.base_lr << ")");
  if (s.type == ScheduleType::kCosineWithMinLr || s.type == ScheduleType::kCosineWarmupWithMinLr) {
    const char* name = s.type == ScheduleType::kCosineWithMinLr ? "cosine_with_min_lr" : "cosine_warmup_with_min_lr";
    ALPACA_CHECK(!(s.min_lr && s.min_lr_rate),
                 "lr schedule " << name << ": only one of min_lr or min_lr_rate should be set");
    ALPACA_CHECK(s.min_lr || s.min_lr_rate,
                 "lr schedule " << name << ": one of min_lr or min_lr_rate must be set through --lr_scheduler_kwargs");
  }
  if (s.type == ScheduleType::kReduceOnPlateau) {  // torch's constructor checks
    const PlateauParams& p = s.plateau;
    ALPACA_CHECK(p.factor < 1.0, "lr schedule reduce_lr_on_plateau: factor should be < 1.0, got " << p.factor);
    ALPACA_CHECK(p.mode == "min" || p.mode == "max", "lr schedule reduce_lr_on_plateau: mode " << p.mode << " is unknown (min or max)");
    ALPACA_CHECK(p.threshold_mode == "rel" || p.threshold_mode == "abs",
                 "lr schedule reduce_lr_on_plateau: threshold mode " << p.threshold_mode << " is unknown (rel or abs)");
    ALPACA_CHECK(p.patience >= 0 && p.cooldown >= 0, "lr schedule reduce_lr_on_plateau: patience and cooldown must be >= 0");
  }
  if (s.type == ScheduleType::kWarmupStableDecay) {
    ALPACA_CHECK(s.num_decay_steps, "lr schedule warmup_stable_decay needs num_decay_steps in --lr_scheduler_kwargs "
                                    "(transformers' get_wsd_schedule requires it), e.g. '{\"num_decay_steps\": 100}'");
    ALPACA_CHECK(*s.num_decay_steps >= 0, "lr schedule warmup_stable_decay: num_decay_steps must be >= 0, got "
                                              << *s.num_decay_steps);
    ALPACA_CHECK(!s.num_stable_steps || *s.num_stable_steps >= 0,
                 "lr schedule warmup_stable_decay: num_stable_steps must be >= 0, got " << *s.num_stable_steps);
    for (const std::string* t : {&s.warmup_type, &s.decay_type})
      ALPACA_CHECK(*t == "linear" || *t == "cosine" || *t == "1-sqrt",
                   "lr schedule warmup_stable_decay: unknown " << (t == &s.warmup_type ? "warmup" : "decay") << " type '"
                                                               << *t << "', expected 'linear', 'cosine' or '1-sqrt'");
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
    case ScheduleType::kDeepSpeedWarmupLR:
    case ScheduleType::kDeepSpeedWarmupDecayLR:
    case ScheduleType::kDeepSpeedWarmupCosineLR:
      return s.base_lr != 0 ? deepspeed_lr(s, step - 1) / s.base_lr : 0.0;
    case ScheduleType::kCosineWithMinLr: {
      if (step < w) return warmup_factor(step, w);
      const double cycles = s.num_cycles.value_or(0.5);
      const double rate = min_lr_rate_of(s);
      double factor = 0.5 * (1.0 + std::cos(kPi * cycles * 2.0 * progress(s, step)));
      factor = factor * (1 - rate) + rate;
      return std::max(0.0, factor);
    }
    case ScheduleType::kCosineWarmupWithMinLr: {
      // _get_cosine_with_min_lr_schedule_with_warmup_lr_rate_lambda: the warmup reaches 1 at its
      // last step, and the cosine counts from the step after it.
      const double cur = static_cast<double>(step), wd = static_cast<double>(w);
      if (cur < wd) {
        if (!s.warmup_lr_rate) return (cur + 1.0) / std::max(1.0, wd);
        return *s.warmup_lr_rate + (1.0 - *s.warmup_lr_rate) * cur / static_cast<double>(std::max<int64_t>(1, w - 1));
      }
      const double p = (cur - wd + 1.0) / std::max(1.0, static_cast<double>(t) - wd);
      const double rate = min_lr_rate_of(s);
      double factor = 0.5 * (1.0 + std::cos(kPi * s.num_cycles.value_or(0.5) * 2.0 * p));
      factor = factor * (1 - rate) + rate;
      return std::max(0.0, factor);
    }
    case ScheduleType::kReduceOnPlateau:
      return s.base_lr != 0 ? s.plateau_state.lr.value_or(s.base_lr) / s.base_lr : 1.0;
    case ScheduleType::kWarmupStableDecay: {  // _get_wsd_scheduler_lambda
      const int64_t decay = s.num_decay_steps.value_or(0);
      const int64_t stable = s.num_stable_steps.value_or(t - w - decay);
      auto shaped = [&](const std::string& type, double p, bool rising) {
        if (type == "linear") return rising ? p : 1.0 - p;
        if (type == "cosine")
          return rising ? 0.5 * (1.0 - std::cos(kPi * p)) : 0.5 * (1.0 + std::cos(kPi * s.num_cycles.value_or(0.5) * 2.0 * p));
        return rising ? 1.0 - std::sqrt(1.0 - p) : 1.0 - std::sqrt(p);  // 1-sqrt
      };
      if (step < w) {
        const double p = static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, w));
        return std::max(0.0, shaped(s.warmup_type, p, true) * (1.0 - s.min_lr_ratio) + s.min_lr_ratio);
      }
      if (step < w + stable) return 1.0;
      if (step < w + stable + decay) {
        const double p = static_cast<double>(step - w - stable) / static_cast<double>(std::max<int64_t>(1, decay));
        return std::max(0.0, shaped(s.decay_type, p, false) * (1.0 - s.min_lr_ratio) + s.min_lr_ratio);
      }
      return s.min_lr_ratio;
    }
  }
  ALPACA_FAIL("lr schedule: unknown type");
}

bool plateau_step(LrSchedule& s, double metric) {
  ALPACA_CHECK(s.type == ScheduleType::kReduceOnPlateau, "plateau_step on a schedule that is not reduce_lr_on_plateau");
  const PlateauParams& p = s.plateau;
  PlateauState& st = s.plateau_state;
  ++st.last_epoch;
  // ReduceLROnPlateau.is_better against best (+inf for min, -inf for max before the first).
  const bool min = p.mode == "min", rel = p.threshold_mode == "rel";
  const double best = st.best.value_or(min ? INFINITY : -INFINITY);
  const bool better = min ? (rel ? metric < best * (1.0 - p.threshold) : metric < best - p.threshold)
                          : (rel ? metric > best * (p.threshold + 1.0) : metric > best + p.threshold);
  if (better) {
    st.best = metric;
    st.num_bad_epochs = 0;
  } else {
    ++st.num_bad_epochs;
  }
  if (st.cooldown_counter > 0) {  // in_cooldown
    --st.cooldown_counter;
    st.num_bad_epochs = 0;
  }
  if (st.num_bad_epochs <= p.patience) return false;
  st.cooldown_counter = p.cooldown;
  st.num_bad_epochs = 0;
  const double old_lr = st.lr.value_or(s.base_lr);
  const double new_lr = std::max(old_lr * p.factor, p.min_lr);
  if (old_lr - new_lr <= p.eps) return false;
  st.lr = new_lr;
  return true;
}

double learning_rate(const LrSchedule& s, int64_t step) {
  if (is_deepspeed(s.type)) return deepspeed_lr(s, step - 1);
  if (s.type == ScheduleType::kReduceOnPlateau) return s.plateau_state.lr.value_or(s.base_lr);
  return s.base_lr * lr_multiplier(s, step);
}

double logged_learning_rate(const LrSchedule& s, int64_t applied, bool step_applied) {
  if (is_deepspeed(s.type)) return learning_rate(s, applied);
  return learning_rate(s, step_applied ? applied - 1 : applied);
}

}  // namespace alpaca::optim
