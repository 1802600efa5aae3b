// Learning-rate schedules as pure functions of the optimizer step: Hugging Face's, matching
// transformers.get_scheduler (LambdaLR multipliers) exactly, and DeepSpeed's own classes
// (WarmupLR, WarmupDecayLR, WarmupCosineLR of deepspeed/runtime/lr_schedules.py), which HF Trainer
// runs instead when a --deepspeed config has a "scheduler" block. The trainer asks for
// learning_rate(schedule, step) before every optimizer step.
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
  kCosineWarmupWithMinLr,  // get_cosine_with_min_lr_schedule_with_warmup_lr_rate
  kWarmupStableDecay,      // get_wsd_schedule
  // torch's ReduceLROnPlateau (get_reduce_on_plateau_schedule): the rate changes only when an
  // evaluation's metric stops improving (plateau_step), not with the steps; no warmup.
  kReduceOnPlateau,
  // DeepSpeed's classes, stepped as DeepSpeedEngine steps them: constructed before the first
  // optimizer step (which therefore runs at the value for iteration -1) and stepped after each one,
  // so step k runs at the class's value for iteration k - 1.
  kDeepSpeedWarmupLR,
  kDeepSpeedWarmupDecayLR,
  kDeepSpeedWarmupCosineLR,
};

// The parameters of DeepSpeed's schedule classes, with DeepSpeed's defaults. num_warmup_steps and
// num_training_steps of LrSchedule are the classes' warmup_num_steps (before DeepSpeed's floor of 2)
// and total_num_steps.
struct DeepSpeedScheduleParams {
  double warmup_min_lr = 0.0;            // WarmupLR, WarmupDecayLR
  std::optional<double> warmup_max_lr;   // unset: WarmupLR the optimizer's lr, WarmupDecayLR 0.001
  bool log_warmup = true;                // warmup_type "log" (DeepSpeed's default) or "linear"
  double warmup_min_ratio = 0.0;         // WarmupCosineLR
  double cos_min_ratio = 0.0001;         // WarmupCosineLR
  // total_num_steps given as a number (not "auto"): the run's optimizer step count must equal it, as
  // HF's mismatch check demands.
  std::optional<int64_t> total_num_steps;
};

// torch.optim.lr_scheduler.ReduceLROnPlateau's arguments (--lr_scheduler_kwargs), torch's defaults.
struct PlateauParams {
  std::string mode = "min";            // min: lower is better; max
  double factor = 0.1;                 // new lr = lr * factor (< 1)
  int64_t patience = 10;               // evaluations without improvement tolerated
  double threshold = 1e-4;
  std::string threshold_mode = "rel";  // rel or abs
  int64_t cooldown = 0;                // evaluations to wait after a reduction
  double min_lr = 0.0;
  double eps = 1e-8;                   // a reduction smaller than this is not made
};

// ReduceLROnPlateau's state (its state_dict: best, num_bad_epochs, cooldown_counter, last_epoch,
// the current lr), which checkpoints carry.
struct PlateauState {
  std::optional<double> lr;    // unset: base_lr
  std::optional<double> best;  // unset: no evaluation yet (torch's +-inf)
  int64_t num_bad_epochs = 0;
  int64_t cooldown_counter = 0;
  int64_t last_epoch = 0;
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
  std::optional<double> min_lr;          // cosine_(warmup_)with_min_lr: exactly one of min_lr, min_lr_rate
  std::optional<double> min_lr_rate;
  std::optional<double> warmup_lr_rate;  // cosine_warmup_with_min_lr: the first warmup step's factor
  // warmup_stable_decay: num_decay_steps (required), num_stable_steps (default: the rest of the
  // run), the shapes of warmup and decay (linear, cosine, 1-sqrt) and the floor as a ratio.
  std::optional<int64_t> num_decay_steps, num_stable_steps;
  std::string warmup_type = "linear", decay_type = "cosine";
  double min_lr_ratio = 0.0;
  DeepSpeedScheduleParams deepspeed;     // the kDeepSpeed* types only
  PlateauParams plateau;                 // kReduceOnPlateau only
  PlateauState plateau_state;            // kReduceOnPlateau: where it stands (plateau_step moves it)
};

// ReduceLROnPlateau.step(metric) on schedule.plateau_state (kReduceOnPlateau; HF steps it after
// each scheduled evaluation with the metric_for_best_model value). Returns whether it reduced the lr.
bool plateau_step(LrSchedule& schedule, double metric);

bool is_deepspeed(ScheduleType type);

// Parses HF's --lr_scheduler_type words (linear, cosine, ...). Throws alpaca::Error naming the
// supported words for anything else (greedy is not supported).
ScheduleType parse_schedule_type(const std::string& word);

// Validates the schedule the way transformers does (polynomial lr_end < base_lr, min_lr xor
// min_lr_rate). Throws alpaca::Error.
void validate(const LrSchedule& schedule);

// LambdaLR's factor at `step` (0 = before the first optimizer step).
double lr_multiplier(const LrSchedule& schedule, int64_t step);

// The learning rate of the optimizer step that follows `step` applied steps: base_lr *
// lr_multiplier(schedule, step) for HF's schedules, the class's value at iteration step - 1 for
// DeepSpeed's.
double learning_rate(const LrSchedule& schedule, int64_t step);

// The learning rate HF Trainer logs for the optimizer step that made `applied` applied steps
// (counting it when it was applied): HF reads its own schedules before scheduler.step(), the rate
// the step used; DeepSpeedEngine steps DeepSpeed's classes inside backward, before HF reads
// get_last_lr(), so the log shows the rate of the next step.
double logged_learning_rate(const LrSchedule& schedule, int64_t applied, bool step_applied);

}  // namespace alpaca::optim
