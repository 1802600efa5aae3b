// What the Trainer is asked to do, as plain values. cli/ is the only module that knows the flags
// (TrainArgs); it validates them and builds these options once (cli::trainer_options), so train/
// never reads a flag, re-parses a word or reaches back up into cli/. Field names follow Hugging
// Face TrainingArguments; the comments say where a value differs from its flag.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "alpaca/fsdp/policy.h"
#include "alpaca/model/loss_options.h"
#include "alpaca/model/lora.h"
#include "alpaca/optim/adamw_options.h"
#include "alpaca/optim/lr_schedule.h"

namespace alpaca::train {

// HF IntervalStrategy (--logging_strategy, --eval_strategy, --save_strategy); kBest only for
// --save_strategy (HF's SaveStrategy.BEST: after an evaluation that improves the tracked metric).
enum class Interval { kNo, kSteps, kEpoch, kBest };


// Where training starts from (--resume_from_checkpoint).
struct ResumeFrom {
  // kLatest: the newest complete checkpoint in output_dir, an error when there is none (HF's
  // True); kLatestIfAny: that checkpoint when there is one, else a fresh start (auto).
  enum class Kind { kNone, kLatest, kLatestIfAny, kDirectory };
  Kind kind = Kind::kNone;
  std::filesystem::path directory;  // kDirectory: a checkpoint-<step> directory
};

struct TrainerOptions {
  // ---- Model and data.
  std::filesystem::path model_name_or_path;  // a local HF LLaMA directory
  bool use_fast_tokenizer = false;  // tokenizer.json over tokenizer.model when both exist
  std::string data_path;
  std::string eval_data_path;  // "" = none
  std::string dataset_format = "auto";  // data::parse_row_format, with dataset_text_field
  std::string dataset_text_field = "text";
  std::filesystem::path chat_template;  // "" = the model's (conversation rows)
  std::string eos_token, pad_token;     // TRL SFTConfig's overrides of the tokenizer's ("" = keep)
  bool assistant_only_loss = false;     // data::MaskOptions, TRL SFTConfig semantics
  std::optional<bool> completion_only_loss;
  int64_t model_max_length = 512;
  bool packing = false;
  std::optional<bool> eval_packing;  // unset = packing (TRL SFTConfig)
  std::string packing_strategy = "bfd";  // data::parse_packing_strategy (TRL SFTConfig)
  bool shuffle_dataset = false;  // TRL: datasets' Dataset.shuffle(seed) before packing and after
  int64_t pad_to_multiple_of = 1;  // TRL: every batch's length rounded up to a multiple (1 = the longest example)
  bool group_by_length = false;
  bool shuffle = true;  // false: --train_sampling_strategy sequential (every epoch in the data's order)
  bool batch_rebalance = false;  // --train_sampling_strategy batch_rebalance (data/sampler.h)
  bool dataloader_drop_last = false;
  std::optional<double> neftune_noise_alpha;  // unset = no NEFTune noise
  model::LossOptions loss;  // --label_smoothing_factor, --loss_type dft
  std::string include_num_input_tokens_seen = "no";  // "no", "all", "non_padding" (HF)
  int tokenize_threads = 0;                   // --dataset_num_proc; 0 = every core
  int64_t torch_empty_cache_steps = 0;       // HF: empty the CUDA cache in steps global_step % N == 0; 0 = never

  // ---- Batch and run length.
  int64_t per_device_train_batch_size = 8;
  int64_t per_device_eval_batch_size = 8;
  int64_t gradient_accumulation_steps = 1;
  int64_t max_steps = -1;  // > 0 wins over num_train_epochs
  double num_train_epochs = 3;
  // --auto_find_batch_size: probe and shrink the micro-batch before training (global batch kept).
  // on_batch_size_found (rank 0, when the split changed) records the choice: cli rewrites
  // training_args.json with it.
  bool auto_find_batch_size = false;
  std::function<void(int64_t per_device_train_batch_size, int64_t gradient_accumulation_steps)> on_batch_size_found;
  // on_ready (rank 0): set-up succeeded (data, model, checkpoint, batch size), training starts
  // next; cli writes training_args.json here, so a run refused during set-up leaves nothing.
  std::function<void()> on_ready;

  // ---- Optimizer and schedule.
  optim::AdamWOptions adamw;
  double max_grad_norm = 1.0;  // 0 = no clipping
  // type, base_lr and the --lr_scheduler_kwargs values; the trainer fills the step counts.
  optim::LrSchedule schedule;
  double warmup_steps = 0;  // >= 1 a step count, in (0, 1) a ratio of the total steps
  double warmup_ratio = 0;

  // ---- Precision and parallelism.
  bool fp16 = false;               // dynamic loss scaling (bf16 lives in fsdp_policy.param_dtype)
  std::optional<bool> tf32;        // unset = LibTorch's default
  fsdp::FsdpPolicy fsdp_policy;    // validated by fsdp::build_fsdp_policy at parse time
  int64_t ddp_timeout_seconds = 1800;
  bool use_cpu = false;  // HF's use_cpu: a CPU communicator and CPU kernels where a GPU is visible (run_training)
  bool full_determinism = false;  // HF's enable_full_determinism (train::run_training)

  // ---- Logging, evaluation, saving.
  std::filesystem::path output_dir;
  std::filesystem::path logging_dir;  // metrics.jsonl; defaults to output_dir
  std::string run_name;
  bool overwrite_output_dir = false;
  Interval logging_strategy = Interval::kSteps;
  Interval eval_strategy = Interval::kNo;
  bool eval_on_start = false;  // HF's: one evaluation before the first step
  double eval_delay = 0;       // HF's: no scheduled evaluation before this step (steps) or epoch (epoch)
  bool evaluates() const { return eval_strategy != Interval::kNo || eval_on_start; }
  Interval save_strategy = Interval::kSteps;
  // HF's best-model tracking: the evaluation log key (eval_loss, ...; unset = no tracking), its
  // direction, and whether the end of the run loads state.best_model_checkpoint's weights.
  std::optional<std::string> metric_for_best_model;
  bool greater_is_better = false;
  bool load_best_model_at_end = false;
  double logging_steps = 500;               // steps or a ratio of the total (resolve_interval_steps)
  double save_steps = 500;
  std::optional<double> eval_steps;         // unset = logging_steps
  bool logging_first_step = false;
  bool report_jsonl = false;                // --report_to jsonl/all
  // --report_to tensorboard/all: event files in tensorboard_dir (--logging_dir, else HF's
  // output_dir/runs/<date>_<host>, resolved once at parse time), with args_json (the effective
  // arguments, HF's args.to_json_string) as the text "args".
  bool report_tensorboard = false;
  std::filesystem::path tensorboard_dir;
  bool tensorboard_dir_given = false;       // --logging_dir named it (error messages name that flag)
  std::string args_json;
  bool disable_tqdm = false;
  int64_t save_max_shard_bytes = 0;         // 0 = 5 GB
  bool save_only_model = false;
  bool save_async = true;           // background checkpoint writes (trainer_sharded_ckpt.cpp)
  bool sharded_checkpoints = true;  // every rank writes its shards; false: rank 0 gathers (old layout)
  std::optional<int64_t> save_total_limit;  // unset = keep every checkpoint

  // ---- LoRA (--use_peft): set = train a peft adapter over the frozen base.
  std::optional<model::LoraOptions> lora;
  bool merge_adapter = false;  // also write output_dir/merged at the end (base + adapter)

  // ---- Reproducibility and resume.
  int64_t seed = 42;
  int64_t data_seed = 42;  // --data_seed, else --seed
  ResumeFrom resume;
  // HF's ignore_data_skip: a resume mid-epoch restarts that epoch's data from its first batch.
  bool ignore_data_skip = false;
};

// HF semantics of "steps" values that may be ratios: a value >= 1 is a step count; a value in
// (0, 1) is ceil(value * total_steps). 0 stays 0.
int64_t resolve_interval_steps(double value, int64_t total_steps);
// HF get_warmup_steps: warmup_steps when given (>= 1 or a ratio), else ceil(total * warmup_ratio).
int64_t warmup_steps_for(double warmup_steps, double warmup_ratio, int64_t total_steps);

}  // namespace alpaca::train
