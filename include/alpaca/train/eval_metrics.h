// The metrics of an evaluation's log entry (Trainer::Impl::evaluate_and_log: the loss, its
// perplexity, HF's speed_metrics("eval", ...) and TRL SFTTrainer's token metrics), which
// --metric_for_best_model may name. Header
// only: cli/ validates the flag with it without linking the trainer.
#pragma once

#include <string>
#include <vector>

namespace alpaca::train {

inline const std::vector<std::string>& eval_metric_names() {
  static const std::vector<std::string> names = {
      "eval_loss",    "eval_perplexity",          "eval_runtime",   "eval_samples_per_second", "eval_steps_per_second",
      "eval_entropy", "eval_mean_token_accuracy", "eval_num_tokens"};
  return names;
}

}  // namespace alpaca::train
