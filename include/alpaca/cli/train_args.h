// TrainArgs: the flags of `alpaca-train [train]` after parsing and validation, as plain fields
// with Hugging Face TrainingArguments names, types and defaults (one field per line of
// train_flags.inc), plus the values derived from them (FSDP options, resolved JSON configs).
// Only cli/ and train/ see this struct; lower modules get small options structs built from it.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace alpaca::cli {

using OptBool = std::optional<bool>;
using OptInt = std::optional<int64_t>;
using OptDouble = std::optional<double>;

// The sections of --help, in the order they are printed.
enum class FlagGroup { kModelData, kOutput, kTraining, kOptimizer, kSchedule, kPrecision, kParallel, kLogging, kEval };

// HF's FSDPOption words for --fsdp.
enum class FsdpOption { kFullShard, kShardGradOp, kNoShard, kHybridShard, kHybridShardZero2, kOffload, kAutoWrap };

// The sharding strategies the FSDP engine implements. hybrid_shard_zero2 parses but is refused
// (not in this list); extend the list when the engine grows one.
inline constexpr FsdpOption kSupportedFsdpStrategies[] = {FsdpOption::kFullShard, FsdpOption::kShardGradOp,
                                                          FsdpOption::kNoShard, FsdpOption::kHybridShard};

struct TrainArgs {
#define ALPACA_FLAG(group, type, name, default_value, help) type name = default_value;
#include "alpaca/cli/train_flags.inc"
#undef ALPACA_FLAG

  // ---- Derived by validate_train_args (not flags).
  // The words of --fsdp (or those mapped from --deepspeed), e.g. {kFullShard, kAutoWrap}.
  // Empty = no FSDP: every rank holds a full replica (the engine then runs NO_SHARD).
  std::set<FsdpOption> fsdp_options;
  // --fsdp_config as JSON object text (file content or the inline object), with
  // --fsdp_transformer_layer_cls_to_wrap merged in as "transformer_layer_cls_to_wrap"; "{}" when none.
  std::string fsdp_config_json = "{}";
  // --lr_scheduler_kwargs as JSON object text; "{}" when none.
  std::string lr_scheduler_kwargs_json = "{}";
  // save_max_shard_size in bytes.
  int64_t save_max_shard_bytes = 0;
  // The ZeRO stage of the --deepspeed config that was mapped onto fsdp_options (0 = none).
  int deepspeed_zero_stage = 0;
  // Things the user should know about how their settings were mapped (e.g. DeepSpeed tuning keys
  // that have no equivalent in the FSDP engine); run_train logs them once at start.
  std::vector<std::string> notes;

  // ---- Provenance.
  std::set<std::string> explicit_flags;  // flag names given on the command line or in --config
  std::string config_path;               // the --config file, "" when none

  bool is_set(const std::string& flag) const { return explicit_flags.count(flag) > 0; }
  bool has_fsdp(FsdpOption o) const { return fsdp_options.count(o) > 0; }
};

// Parses `alpaca-train [train]` arguments (argv without program and subcommand): defaults, then
// the --config JSON file, then the command line; then validates. Throws cli::UsageError with a
// message naming the flag and saying what to change.
TrainArgs parse_train_args(const std::vector<std::string>& argv);

// Checks contradictions and unsupported values and fills the derived fields. Called by
// parse_train_args; public so tests and tools can validate an edited TrainArgs.
void validate_train_args(TrainArgs& args);

// True when argv asks for help (-h / --help anywhere).
bool wants_help(const std::vector<std::string>& argv);
// The grouped help text listing every flag with its type, default and meaning.
std::string train_help();
// The effective arguments, one "name = value" line per flag, grouped; flags set on the command
// line or in the config file are marked.
std::string format_train_args(const TrainArgs& args);
// The effective arguments as a JSON object {flag: value} (HF None = null), pretty-printed.
std::string train_args_to_json(const TrainArgs& args);

// HF semantics of "steps" flags that may be ratios: a value >= 1 is a step count; a value in
// (0,1) is ceil(value * total_steps). 0 stays 0.
int64_t resolve_interval_steps(double value, int64_t total_steps);
// HF get_warmup_steps: warmup_steps when given (>= 1 or a ratio), else ceil(total * warmup_ratio).
int64_t warmup_steps_for(const TrainArgs& args, int64_t total_steps);
// The data seed the sampler uses: data_seed, else seed.
int64_t effective_data_seed(const TrainArgs& args);
// "true" when resume_from_checkpoint asks for the newest checkpoint in output_dir (True/true/1).
bool resume_from_latest(const TrainArgs& args);
// "auto": the newest complete checkpoint in output_dir when there is one, else a fresh start
// (what a requeued batch job wants: the same command line for the first run and every restart).
bool resume_if_checkpoint(const TrainArgs& args);

std::string fsdp_option_name(FsdpOption o);

}  // namespace alpaca::cli
