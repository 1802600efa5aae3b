// TrainArgs: the flags of `alpaca-train [train]` after parsing and validation, as plain fields
// with Hugging Face TrainingArguments names, types and defaults (one field per line of
// train_flags.inc), plus the values derived from them (the FSDP policy, resolved JSON configs).
// Only cli/ sees this struct; the trainer gets train::TrainerOptions (trainer_options below) and
// lower modules their own small options structs.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "alpaca/dist/launch.h"
#include "alpaca/fsdp/policy.h"
#include "alpaca/optim/lr_schedule.h"
#include "alpaca/train/options.h"

namespace alpaca::cli {

using OptBool = std::optional<bool>;
using OptInt = std::optional<int64_t>;
using OptDouble = std::optional<double>;

// The sections of --help, in the order they are printed.
enum class FlagGroup { kModelData, kOutput, kTraining, kOptimizer, kSchedule, kPrecision, kParallel, kLogging, kEval };

struct TrainArgs {
#define ALPACA_FLAG(group, type, name, default_value, help) type name = default_value;
#include "alpaca/cli/train_flags.inc"
#undef ALPACA_FLAG

  // ---- Derived by validate_train_args (not flags).
  // The words of --fsdp (or those mapped from --deepspeed) in canonical order (fsdp::fsdp_words),
  // e.g. "full_shard auto_wrap". Empty = no FSDP: every rank holds a full replica (NO_SHARD).
  std::string fsdp_words;
  // --fsdp_config as JSON object text (file content or the inline object); "{}" when none.
  std::string fsdp_config_json = "{}";
  // What the FSDP engine does: built once, by fsdp::build_fsdp_policy (the only parser of the FSDP
  // flags), from fsdp_words, fsdp_config_json, --fsdp_transformer_layer_cls_to_wrap, --bf16/--fp16,
  // --gradient_checkpointing and the launch's local world size. The trainer uses it as is.
  fsdp::FsdpPolicy fsdp_policy;
  // --lr_scheduler_kwargs as JSON object text; "{}" when none.
  std::string lr_scheduler_kwargs_json = "{}";
  // save_max_shard_size in bytes.
  int64_t save_max_shard_bytes = 0;
  // The ZeRO stage of the --deepspeed config that was mapped onto fsdp_words (0 = none).
  int deepspeed_zero_stage = 0;
  // The --deepspeed config's "scheduler" block as DeepSpeed's own class (ScheduleType::kDeepSpeed*,
  // its parameters; the step counts are resolved by the trainer). Unset: --lr_scheduler_type decides,
  // as in HF Trainer when the config has no scheduler block.
  std::optional<optim::LrSchedule> deepspeed_schedule;
  // Things the user should know about how their settings were mapped (e.g. DeepSpeed tuning keys
  // that have no equivalent in the FSDP engine); run_train logs them once at start.
  std::vector<std::string> notes;

  // ---- Provenance.
  std::set<std::string> explicit_flags;      // flag names given on the command line or in --config
  std::set<std::string> command_line_flags;  // those given on the command line
  std::string config_path;                   // the --config file, "" when none

  bool is_set(const std::string& flag) const { return explicit_flags.count(flag) > 0; }
  // `flag` came from --config only and the command line set `decider`, which makes it moot (a
  // training_args.json reused with --save_strategy no holds save_steps): ignored, as HF ignores it,
  // rather than an error telling the user to drop a flag they never typed.
  bool mooted_by_command_line(const std::string& flag, const std::string& decider) const {
    return !command_line_flags.count(flag) && command_line_flags.count(decider) > 0;
  }
};

// Parses `alpaca-train [train]` arguments (argv without program and subcommand): defaults, then
// the --config JSON file, then the command line; then validates. Throws cli::UsageError with a
// message naming the flag and saying what to change.
// `launch` is how this process was started (dist::discover_launch(); a single process by default):
// the local rank --local_rank must agree with, the world size a DeepSpeed train_batch_size is
// checked against, the node size a hybrid shard group defaults to.
TrainArgs parse_train_args(const std::vector<std::string>& argv, const dist::LaunchInfo& launch = {});

// Checks contradictions and unsupported values and fills the derived fields. Called by
// parse_train_args; public so tests and tools can validate an edited TrainArgs.
void validate_train_args(TrainArgs& args, const dist::LaunchInfo& launch = {});

// The inputs the flags name exist: --model_name_or_path is a directory with config.json and a
// tokenizer, --data_path / --eval_data_path are files. Called before anything is written to
// output_dir or any communicator starts; throws cli::UsageError naming the flag.
void check_input_paths(const TrainArgs& args);

// True when argv asks for help (-h / --help anywhere).
bool wants_help(const std::vector<std::string>& argv);
// The grouped help text listing every flag with its type, default and meaning.
std::string train_help();
// The effective arguments, one "name = value" line per flag, grouped; flags set on the command
// line or in the config file are marked.
std::string format_train_args(const TrainArgs& args);
// The effective arguments as a JSON object {flag: value} (HF None = null), pretty-printed.
std::string train_args_to_json(const TrainArgs& args);

// What the trainer is asked to do, from validated flags: the one place where flags become
// train::TrainerOptions (interval words, --report_to, --data_seed/--seed, the checkpoint to
// resume from, the LR schedule, the FSDP policy). Values that need the run length (warmup and
// interval ratios) are resolved by the trainer (train::resolve_interval_steps, warmup_steps_for).
train::TrainerOptions trainer_options(const TrainArgs& args);
// --lr_scheduler_type, --learning_rate and --lr_scheduler_kwargs as an optim::LrSchedule without
// its step counts; throws cli::UsageError for a kwarg the schedule does not use.
optim::LrSchedule schedule_from_flags(const TrainArgs& args);

}  // namespace alpaca::cli
