// The Trainer: Stanford Alpaca's fine-tune with Hugging Face Trainer's semantics, on our FSDP
// engine. One object per rank; every public method is collective over all ranks.
//
//   setup (constructor): TrainerOptions (built from the flags by cli::trainer_options) and the
//     caller's communicator -> tokenizer (+[PAD]), model
//     (+ embedding resize), data, sampler, FSDP engine, sharded AdamW, LR schedule; resume state.
//   train(): the step loop; returns the process exit code (0, or kExitPreempted / kExitInterrupted
//     after a signal made it save and stop).
//
// Loss of an optimizer step (DESIGN.md): sum of token losses over every micro-batch on every rank
// divided by the global label-token count (all-reduced once per step, before the forwards), so any
// split of the global batch into ranks x micro-batch x accumulation gives the same update.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>

#include "alpaca/train/options.h"

namespace alpaca::dist {
class Communicator;
}

namespace alpaca::train {

// What the loop needs to know about the schedule of the run (HF's _inner_training_loop numbers).
struct RunLength {
  int64_t steps_per_epoch = 0;   // optimizer steps in one epoch
  int64_t max_steps = 0;         // total optimizer steps of the run
  int64_t num_train_epochs = 0;  // ceil: what HF stores in TrainerState
  int64_t global_batch_size = 0;
};
// HF: max_steps > 0 wins (epochs = ceil(max_steps / steps_per_epoch)); else
// max_steps = ceil(num_train_epochs * steps_per_epoch).
RunLength compute_run_length(int64_t steps_per_epoch, int64_t global_batch, int64_t max_steps_flag,
                             double num_train_epochs);

// True when `dir` already holds model weights or a config (HF's save_pretrained output).
bool dir_holds_model(const std::filesystem::path& dir);

class Trainer {
 public:
  // `comm` spans every rank of the job (its device is where this rank trains); local_rank is this
  // rank's index on its node (HF's is_local_process_zero). The caller owns the process runtime
  // (train::run_training: dist::Runtime, then dist::make_communicator) and keeps it alive longer.
  Trainer(const TrainerOptions& options, std::shared_ptr<dist::Communicator> comm, int local_rank);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  int train();

  // Mean token loss over the eval set (every rank gets the same value). Collective.
  double evaluate_loss();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace alpaca::train
