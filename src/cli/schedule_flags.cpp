// --lr_scheduler_type / --learning_rate / --lr_scheduler_kwargs -> optim::LrSchedule. A file of its
// own because validate_train_args() calls it too: validation (and fuzz_train_config, which links
// only parser sources) must not pull in what trainer_options() needs (LoRA, metrics, TensorBoard).
#include <nlohmann/json.hpp>  // defines: nlohmann::json

#include <cmath>
#include <set>
#include <string>

#include "alpaca/cli/train_args.h"
#include "alpaca/cli/usage_error.h"
#include "alpaca/util/error.h"

namespace alpaca::cli {

optim::LrSchedule schedule_from_flags(const TrainArgs& a) {
  if (a.deepspeed_schedule) {  // the --deepspeed config's scheduler block (deepspeed_config.cpp checked it)
    optim::LrSchedule s = *a.deepspeed_schedule;
    s.base_lr = a.learning_rate;
    return s;
  }
  optim::LrSchedule s;
  try {
    s.type = optim::parse_schedule_type(a.lr_scheduler_type);
  } catch (const Error& e) {
    ALPACA_USAGE_FAIL(e.message());
  }
  s.base_lr = a.learning_rate;
  const auto kw = nlohmann::json::parse(a.lr_scheduler_kwargs_json.empty() ? "{}" : a.lr_scheduler_kwargs_json);
  // The keyword arguments of each transformers.optimization schedule function; another key is a
  // TypeError there ("unexpected keyword argument"), and an error here rather than ignored.
  using T = optim::ScheduleType;
  const std::set<std::string> accepted =
      s.type == T::kCosine || s.type == T::kCosineWithRestarts ? std::set<std::string>{"num_cycles"}
      : s.type == T::kPolynomial                               ? std::set<std::string>{"lr_end", "power"}
      : s.type == T::kInverseSqrt                              ? std::set<std::string>{"timescale"}
      : s.type == T::kCosineWithMinLr ? std::set<std::string>{"num_cycles", "min_lr", "min_lr_rate"}
      : s.type == T::kCosineWarmupWithMinLr
          ? std::set<std::string>{"num_cycles", "min_lr", "min_lr_rate", "warmup_lr_rate"}
      : s.type == T::kWarmupStableDecay
          ? std::set<std::string>{"num_decay_steps", "num_stable_steps", "warmup_type", "decay_type", "min_lr_ratio",
                                  "num_cycles"}
      : s.type == T::kReduceOnPlateau  // torch's ReduceLROnPlateau arguments
          ? std::set<std::string>{"mode", "factor", "patience", "threshold", "threshold_mode", "cooldown", "min_lr", "eps"}
          : std::set<std::string>{};
  for (const auto& [k, v] : kw.items()) {
    if (!accepted.count(k)) {
      std::string list;
      for (const auto& name : accepted) list += (list.empty() ? "" : ", ") + name;
      ALPACA_USAGE_FAIL("--lr_scheduler_kwargs key '" << k << "' is not an argument of the " << a.lr_scheduler_type
                        << " schedule (transformers would raise TypeError); "
                        << (list.empty() ? std::string("it takes none") : "it takes " + list));
    }
    if (k == "warmup_type" || k == "decay_type" || k == "mode" || k == "threshold_mode") {  // words
      ALPACA_USAGE_CHECK(v.is_string(), "--lr_scheduler_kwargs " << k << " must be a string, got " << v.dump());
      (k == "warmup_type" ? s.warmup_type
       : k == "decay_type" ? s.decay_type
       : k == "mode"       ? s.plateau.mode
                           : s.plateau.threshold_mode) = v.get<std::string>();
      continue;
    }
    const bool number = v.is_number();
    ALPACA_USAGE_CHECK(number, "--lr_scheduler_kwargs " << k << " must be a number, got " << v.dump());
    if (s.type == T::kReduceOnPlateau) {
      const double x = v.get<double>();
      if (k == "patience" || k == "cooldown") {
        ALPACA_USAGE_CHECK(x == std::floor(x), "--lr_scheduler_kwargs " << k << " is a count of evaluations, got " << v.dump());
        (k == "patience" ? s.plateau.patience : s.plateau.cooldown) = static_cast<int64_t>(x);
      } else {
        (k == "factor" ? s.plateau.factor : k == "threshold" ? s.plateau.threshold : k == "min_lr" ? s.plateau.min_lr
                                                                                                     : s.plateau.eps) = x;
      }
      continue;
    }
    if (k == "num_decay_steps" || k == "num_stable_steps") {
      ALPACA_USAGE_CHECK(v.get<double>() == std::floor(v.get<double>()),
                         "--lr_scheduler_kwargs " << k << " is a step count, got " << v.dump());
      (k == "num_decay_steps" ? s.num_decay_steps : s.num_stable_steps) = static_cast<int64_t>(v.get<double>());
    } else if (k == "num_cycles") s.num_cycles = v.get<double>();
    else if (k == "lr_end") s.lr_end = v.get<double>();
    else if (k == "power") s.power = v.get<double>();
    else if (k == "timescale") s.timescale = v.get<int64_t>();
    else if (k == "min_lr") s.min_lr = v.get<double>();
    else if (k == "min_lr_rate") s.min_lr_rate = v.get<double>();
    else if (k == "warmup_lr_rate") s.warmup_lr_rate = v.get<double>();
    else if (k == "min_lr_ratio") s.min_lr_ratio = v.get<double>();
    else ALPACA_USAGE_FAIL("--lr_scheduler_kwargs key '" << k << "' is not used by " << a.lr_scheduler_type
                           << "; accepted: num_cycles, lr_end, power, timescale, min_lr, min_lr_rate, warmup_lr_rate, "
                              "num_decay_steps, num_stable_steps, warmup_type, decay_type, min_lr_ratio");
  }
  try {
    optim::validate(s);
  } catch (const Error& e) {
    ALPACA_USAGE_FAIL(e.message());
  }
  return s;
}

}  // namespace alpaca::cli
