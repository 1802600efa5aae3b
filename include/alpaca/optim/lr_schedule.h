// Hugging Face learning-rate schedules as pure functions of the optimizer step, matching
// transformers.get_scheduler (LambdaLR multipliers) exactly. The trainer multiplies the base
// learning rate by lr_multiplier(schedule, step) before every optimizer step.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace alpaca::optim {

enum class ScheduleType {
  kLinear,
  kCosine,
  kCosineWithRestarts,
  kPolynomial,
  kConstant,
  kConstantWithWarmup,
  kInverseSqrt,
  kCosineWithMinLr,
};

struct LrSchedule {
  ScheduleType type = ScheduleType::kLinear;
  int64_t num_warmup_steps = 0;
  int64_t num_training_steps = 0;
  double base_lr = 5e-5;                 // the optimizer's initial lr (polynomial, min_lr need it)
  std::optional<double> num_cycles;      // cosine 0.5, cosine_with_restarts 1 (HF defaults)
  double lr_end = 1e-7;                  // polynomial
  double power = 1.0;                    // polynomial
  std::optional<int64_t> timescale;      // inverse_sqrt (default: warmup or 10000)
  std::optional<double> min_lr;          // cosine_with_min_lr: exactly one of min_lr, min_lr_rate
  std::optional<double> min_lr_rate;
};

// Parses HF's --lr_scheduler_type words (linear, cosine, ...). Throws alpaca::Error naming the
// supported words for anything else (reduce_lr_on_plateau and warmup_stable_decay are not supported).
ScheduleType parse_schedule_type(const std::string& word);

// Validates the schedule the way transformers does (polynomial lr_end < base_lr, min_lr xor
// min_lr_rate). Throws alpaca::Error.
void validate(const LrSchedule& schedule);

// LambdaLR's factor at `step` (0 = before the first optimizer step).
double lr_multiplier(const LrSchedule& schedule, int64_t step);

// base_lr * lr_multiplier(schedule, step).
double learning_rate(const LrSchedule& schedule, int64_t step);

}  // namespace alpaca::optim
