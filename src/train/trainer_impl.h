// Private state of the Trainer, shared by its setup, step loop, evaluation and checkpoint files.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "alpaca/ckpt/checkpoint_dir.h"
#include "alpaca/ckpt/resume_state.h"
#include "alpaca/ckpt/trainer_state.h"
#include "alpaca/cli/train_args.h"
#include "alpaca/data/alpaca_example.h"
#include "alpaca/data/sampler.h"
#include "alpaca/data/tokenizer.h"
#include "alpaca/dist/communicator.h"
#include "alpaca/fsdp/engine.h"
#include "alpaca/model/llama.h"
#include "alpaca/optim/adamw.h"
#include "alpaca/optim/loss_scaler.h"
#include "alpaca/optim/lr_schedule.h"
#include "alpaca/train/metrics.h"
#include "alpaca/train/progress.h"
#include "alpaca/train/trainer.h"

namespace alpaca::train {

enum class Interval { kNo, kSteps, kEpoch };
Interval parse_interval(const std::string& word, const std::string& flag);

struct Trainer::Impl {
  cli::TrainArgs args;
  std::shared_ptr<dist::Communicator> comm;
  int rank = 0;
  int world = 1;
  at::Device device = at::kCPU;

  std::optional<data::Tokenizer> tokenizer;  // set in setup (no empty Tokenizer exists)
  model::LlamaForCausalLM model{nullptr};
  // Where the weights come from and how: the model is built on the meta device and each rank
  // reads only its own shards after apply_fsdp (setup_engine), unless weights_loaded.
  std::filesystem::path weights_dir;
  bool grow_vocab = false;
  bool weights_loaded = false;
  std::unique_ptr<fsdp::FsdpEngine> engine;
  std::unique_ptr<optim::ShardedAdamW> optimizer;
  std::optional<optim::DynamicLossScaler> scaler;  // fp16 only
  optim::LrSchedule schedule;

  std::vector<data::Example> train_examples;
  std::vector<data::Example> eval_examples;
  std::unique_ptr<data::DistributedBatchSampler> sampler;
  RunLength length;

  Interval log_interval = Interval::kSteps, eval_interval = Interval::kNo, save_interval = Interval::kSteps;
  int64_t logging_steps = 0, eval_steps = 0, save_steps = 0;
  bool jsonl = false;
  std::filesystem::path output_dir;

  // Position and bookkeeping (what a checkpoint stores).
  ckpt::TrainerState state;
  int64_t epoch = 0;            // epoch in progress
  int64_t step_in_epoch = 0;    // optimizer steps done in that epoch
  int64_t scheduler_step = 0;   // optimizer steps not skipped by the fp16 scaler
  int64_t initial_step = 0;     // global_step at the start of this session (after resume)
  LossAccumulator losses;
  std::optional<std::filesystem::path> resume_dir;
  ckpt::Fingerprint model_fingerprint, tokenizer_fingerprint;

  MetricsJsonl metrics;
  std::unique_ptr<ProgressReporter> progress;
  double flops_per_token = 0;
  std::optional<double> peak_flops;

  // setup (trainer_setup.cpp)
  explicit Impl(const cli::TrainArgs& a);
  void setup_tokenizer_and_model();
  void setup_data();
  void setup_engine();
  void setup_schedule();

  // loop (trainer_loop.cpp)
  int train();
  double evaluate_loss();
  void log_entry(LogEntry entry, bool to_history = true);

  // checkpoints (trainer_checkpoint.cpp)
  void save_checkpoint();
  void save_checkpoint_into(ckpt::CheckpointWriter& writer);  // save_checkpoint without the cleanup
  void load_checkpoint(const std::filesystem::path& dir);
  void export_model(const std::filesystem::path& dir, bool write_tokenizer);
  void save_final();
  void barrier();
};

}  // namespace alpaca::train
