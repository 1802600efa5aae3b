// Validation of TrainArgs after parsing: contradictions and unsupported values become usage
// errors that say what to change (HF's __post_init__ messages as the guide), and the derived
// fields (FSDP options, resolved JSON configs, defaults that depend on other flags) are filled.
#include <nlohmann/json.hpp>  // defines: nlohmann::json

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "alpaca/cli/deepspeed_config.h"
#include "alpaca/cli/flag_table.h"
#include "alpaca/cli/train_args.h"
#include "alpaca/cli/usage_error.h"
#include "alpaca/data/conversation.h"
#include "alpaca/fsdp/policy.h"
#include "alpaca/model/config.h"
#include "alpaca/train/eval_metrics.h"
#include "alpaca/util/error.h"
#include "alpaca/util/log.h"
#include "alpaca/util/text.h"

namespace alpaca::cli {
namespace {

using nlohmann::json;

std::vector<std::string> split_words(const std::string& text) {
  std::vector<std::string> words;
  std::string w;
  for (char c : text) {
    if (c == ' ' || c == ',' || c == '\t') {
      if (!w.empty()) words.push_back(w), w.clear();
    } else {
      w += c;
    }
  }
  if (!w.empty()) words.push_back(w);
  return words;
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

bool one_of(const std::string& v, const std::vector<std::string>& choices) {
  for (const auto& c : choices) {
    if (v == c) return true;
  }
  return false;
}

void check_choice(const std::string& flag, const std::string& value, const std::vector<std::string>& choices) {
  if (one_of(value, choices)) return;
  std::string guess = closest_name(value, choices);
  ALPACA_USAGE_FAIL("--" << flag << " '" << value << "' is not one of: " << join(choices, ", ")
                         << (guess.empty() ? "" : "; did you mean '" + guess + "'?"));
}

// Reads a flag that holds JSON: inline text starting with '{', else a path to a JSON file.
// `origin` (optional) receives how messages should name it ("--flag" or "--flag file X").
json read_json_flag(const std::string& flag, const std::string& value, std::string* origin = nullptr) {
  std::string text = value;
  std::string where = "--" + flag;
  if (value.find_first_not_of(" \t\n") != std::string::npos && value[value.find_first_not_of(" \t\n")] != '{') {
    text = read_flag_file(flag, value, "a JSON file or an inline JSON object");
    where += " file " + value;
  }
  json j;
  try {
    j = json::parse(text, nullptr, true, /*ignore_comments=*/true);
  } catch (const json::exception& e) {
    ALPACA_USAGE_FAIL(where << " is not valid JSON: " << e.what());
  }
  ALPACA_USAGE_CHECK(j.is_object(), where << " must be a JSON object {...}");
  if (origin) *origin = where;
  return j;
}

// HF: an interval given as a ratio must be in (0,1); above 1 it must be a whole number of steps.
void check_interval(const std::string& flag, double v) {
  ALPACA_USAGE_CHECK(v > 0, "--" << flag << " must be > 0 (a step count, or a ratio in (0,1) of the total steps), got " << v);
  ALPACA_USAGE_CHECK(v < 1 || v == std::floor(v), "--" << flag << " must be an integer if bigger than 1, got " << v);
}

int64_t parse_byte_size(const std::string& text) {
  const text::ByteSize size = text::parse_byte_size(text);
  ALPACA_USAGE_CHECK(size.error.empty(), "--save_max_shard_size '" << text << "' " << size.error);
  return size.bytes;
}

void validate_required(TrainArgs& a) {
  ALPACA_USAGE_CHECK(!a.model_name_or_path.empty(),
                     "--model_name_or_path is required: a local Hugging Face LLaMA directory "
                     "(create a small one with `alpaca-train init-model`)");
  ALPACA_USAGE_CHECK(!a.data_path.empty(), "--data_path is required: an Alpaca JSON file of {instruction, input, output} records");
  try {
    (void)data::parse_row_format(a.dataset_format, a.dataset_text_field);  // its errors name the flags
  } catch (const Error& e) {
    ALPACA_USAGE_FAIL(e.message());
  }
  ALPACA_USAGE_CHECK(!a.output_dir.empty(), "--output_dir must not be empty");
}

void validate_sizes(TrainArgs& a) {
  ALPACA_USAGE_CHECK(a.per_device_train_batch_size >= 1, "--per_device_train_batch_size must be >= 1, got " << a.per_device_train_batch_size);
  ALPACA_USAGE_CHECK(a.per_device_eval_batch_size >= 1, "--per_device_eval_batch_size must be >= 1, got " << a.per_device_eval_batch_size);
  ALPACA_USAGE_CHECK(a.gradient_accumulation_steps >= 1, "--gradient_accumulation_steps must be >= 1, got " << a.gradient_accumulation_steps);
  ALPACA_USAGE_CHECK(a.model_max_length >= 2, "--model_max_length must be >= 2 tokens, got " << a.model_max_length);
  ALPACA_USAGE_CHECK(a.max_steps == -1 || a.max_steps > 0,
                     "--max_steps must be a positive number of optimizer steps, or -1 to train for --num_train_epochs; got " << a.max_steps);
  ALPACA_USAGE_CHECK(a.max_steps > 0 || a.num_train_epochs > 0,
                     "--num_train_epochs must be > 0 (or give --max_steps), got " << a.num_train_epochs);
  ALPACA_USAGE_CHECK(a.ddp_timeout > 0, "--ddp_timeout must be a positive number of seconds, got " << a.ddp_timeout);
  ALPACA_USAGE_CHECK(!a.save_total_limit || *a.save_total_limit >= 1,
                     "--save_total_limit must be >= 1 (or None to keep every checkpoint), got " << *a.save_total_limit);
  ALPACA_USAGE_CHECK(a.dataloader_num_workers == 0, "--dataloader_num_workers " << a.dataloader_num_workers
                     << " is not supported: alpaca-train tokenizes the data in-process before training; drop the flag");
  a.save_max_shard_bytes = parse_byte_size(a.save_max_shard_size);
  ALPACA_USAGE_CHECK(a.save_safetensors, "--save_safetensors False is not supported: alpaca-train writes model.safetensors "
                                         "only (transformers and peft load it); drop the flag");
}

void validate_optimizer(TrainArgs& a) {
  check_choice("optim", a.optim,
               {"adamw_torch", "adamw_torch_fused", "adamw_bnb_8bit", "adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit",
                "lion_8bit", "lion_32bit", "paged_lion_8bit", "paged_lion_32bit", "adafactor"});
  const TrainArgs d;
  if (a.optim == "adafactor" &&
      (a.adam_beta1 != d.adam_beta1 || a.adam_beta2 != d.adam_beta2 || a.adam_epsilon != d.adam_epsilon))
    a.notes.push_back("--optim adafactor: --adam_beta1, --adam_beta2 and --adam_epsilon are not used (transformers builds "
                      "Adafactor without them: no first moment, decay_rate -0.8, eps (1e-30, 1e-3))");
  const bool lion = a.optim.find("lion") != std::string::npos;
  if (lion && a.adam_epsilon != d.adam_epsilon)
    a.notes.push_back("--optim " + a.optim + ": --adam_epsilon is not used (Lion takes the sign of its update; transformers "
                      "passes it only --adam_beta1 and --adam_beta2)");
  if (a.optim.rfind("paged_", 0) == 0)
    a.notes.push_back("--optim " + a.optim + ": bitsandbytes' " + (lion ? "Lion" : "AdamW") +
                      (a.optim.find("8bit") != std::string::npos ? " with 8-bit moments" : "") +
                      "; its paging (CUDA unified memory for the moments) is not done: they stay where FSDP keeps the "
                      "shards (host memory with --fsdp offload), as bitsandbytes itself does on CPU");
  ALPACA_USAGE_CHECK(a.learning_rate >= 0, "--learning_rate must be >= 0, got " << a.learning_rate);
  ALPACA_USAGE_CHECK(a.weight_decay >= 0, "--weight_decay must be >= 0, got " << a.weight_decay);
  ALPACA_USAGE_CHECK(a.adam_beta1 >= 0 && a.adam_beta1 < 1, "--adam_beta1 must be in [0, 1), got " << a.adam_beta1);
  ALPACA_USAGE_CHECK(a.adam_beta2 >= 0 && a.adam_beta2 < 1, "--adam_beta2 must be in [0, 1), got " << a.adam_beta2);
  ALPACA_USAGE_CHECK(a.adam_epsilon > 0, "--adam_epsilon must be > 0, got " << a.adam_epsilon);
  {
    // TrainingArguments: a boolean maps to "all" / "no".
    std::string& t = a.include_num_input_tokens_seen;
    const auto b = parse_bool_text(t);
    if (b) t = *b ? "all" : "no";
    ALPACA_USAGE_CHECK(t == "no" || t == "all" || t == "non_padding",
                       "--include_num_input_tokens_seen '" << t << "' is not one of no, all, non_padding (or True/False)");
  }
  ALPACA_USAGE_CHECK(a.label_smoothing_factor >= 0 && a.label_smoothing_factor < 1,
                     "--label_smoothing_factor must be in [0, 1) (0 = off), got " << a.label_smoothing_factor);
  ALPACA_USAGE_CHECK(a.loss_type == "nll" || a.loss_type == "dft",
                     "--loss_type '" << a.loss_type << "' is not a loss; give nll (cross-entropy) or dft (TRL's Dynamic "
                                                       "Fine-Tuning)");
  ALPACA_USAGE_CHECK(a.loss_type != "dft" || a.label_smoothing_factor == 0,
                     "--loss_type dft with --label_smoothing_factor " << a.label_smoothing_factor
                         << ": TRL applies label smoothing only to the nll loss (it ignores it under dft); give one");
  ALPACA_USAGE_CHECK(!a.neftune_noise_alpha || *a.neftune_noise_alpha >= 0,
                     "--neftune_noise_alpha must be >= 0 (the noise is uniform in [-a, a], a = alpha / sqrt(L * d)), got "
                         << *a.neftune_noise_alpha);
  ALPACA_USAGE_CHECK(!a.dataset_num_proc || *a.dataset_num_proc > 0,
                     "--dataset_num_proc must be positive, got " << *a.dataset_num_proc);
  ALPACA_USAGE_CHECK(!a.pad_to_multiple_of || *a.pad_to_multiple_of > 0,
                     "--pad_to_multiple_of must be a positive number of tokens (or None: pad to the longest example), got "
                         << *a.pad_to_multiple_of);
  ALPACA_USAGE_CHECK(!a.torch_empty_cache_steps || *a.torch_empty_cache_steps > 0,
                     "--torch_empty_cache_steps must be a positive number of steps (or None: never), got "
                         << *a.torch_empty_cache_steps);
  ALPACA_USAGE_CHECK(a.average_tokens_across_devices,
                     "--average_tokens_across_devices False (each rank's own token mean, then averaged) is not "
                     "supported: the loss is always the mean over the step's label tokens on every rank, HF's default "
                     "True, which keeps the result the same on any number of ranks");
  if (!a.gradient_checkpointing_kwargs.empty()) {
    ALPACA_USAGE_CHECK(a.gradient_checkpointing ||
                           a.mooted_by_command_line("gradient_checkpointing_kwargs", "gradient_checkpointing"),
                       "--gradient_checkpointing_kwargs has no effect without --gradient_checkpointing True");
    nlohmann::json kw;
    try {
      kw = nlohmann::json::parse(a.gradient_checkpointing_kwargs);
    } catch (const std::exception&) {
      ALPACA_USAGE_FAIL("--gradient_checkpointing_kwargs is not JSON: " << a.gradient_checkpointing_kwargs
                                                                        << " (e.g. '{\"use_reentrant\": false}')");
    }
    ALPACA_USAGE_CHECK(kw.is_object(), "--gradient_checkpointing_kwargs must be a JSON object, got "
                                           << a.gradient_checkpointing_kwargs);
    for (const auto& [key, value] : kw.items()) {
      // transformers 5's activation_checkpointing_kwargs: every_n_layers 1 is every layer, as here.
      if (key == "every_n_layers") {
        ALPACA_USAGE_CHECK(value.is_number_integer() && value.get<int64_t>() == 1,
                           "--gradient_checkpointing_kwargs every_n_layers " << value.dump() << " is not implemented: "
                           "every decoder layer is checkpointed (every_n_layers 1)");
        continue;
      }
      ALPACA_USAGE_CHECK(key == "use_reentrant",
                         "--gradient_checkpointing_kwargs key '" << key << "' is not supported (only use_reentrant "
                                                                 "and every_n_layers 1 are: the recompute is alpaca-train's own)");
      ALPACA_USAGE_CHECK(value.is_boolean(), "--gradient_checkpointing_kwargs use_reentrant must be true or false, got "
                                                 << value.dump());
    }
  }
  ALPACA_USAGE_CHECK(a.max_grad_norm >= 0, "--max_grad_norm must be >= 0 (0 disables clipping), got " << a.max_grad_norm);

  check_choice("lr_scheduler_type", a.lr_scheduler_type,
               {"linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup",
                "inverse_sqrt", "cosine_with_min_lr", "cosine_warmup_with_min_lr", "warmup_stable_decay",
                "reduce_lr_on_plateau"});
  a.lr_scheduler_kwargs_json = a.lr_scheduler_kwargs.empty() ? "{}" : read_json_flag("lr_scheduler_kwargs", a.lr_scheduler_kwargs).dump();
  // Unknown kwargs and invalid schedules are refused here, not at step 0 (with --deepspeed once its
  // config is mapped: a scheduler block replaces the flags' schedule).
  if (a.deepspeed.empty()) schedule_from_flags(a);
  ALPACA_USAGE_CHECK(a.warmup_ratio >= 0 && a.warmup_ratio <= 1, "--warmup_ratio must be in [0, 1], got " << a.warmup_ratio);
  ALPACA_USAGE_CHECK(a.warmup_steps >= 0, "--warmup_steps must be >= 0, got " << a.warmup_steps);
  ALPACA_USAGE_CHECK(a.warmup_steps < 1 || a.warmup_steps == std::floor(a.warmup_steps),
                     "--warmup_steps must be an integer if bigger than 1, got " << a.warmup_steps);
  ALPACA_USAGE_CHECK(!(a.warmup_ratio > 0 && a.warmup_steps > 0),
                     "--warmup_ratio " << a.warmup_ratio << " and --warmup_steps " << a.warmup_steps
                                       << " both set the warmup; give only one");
  // transformers builds ReduceLROnPlateau without the warmup (get_scheduler returns before it).
  ALPACA_USAGE_CHECK(a.lr_scheduler_type != "reduce_lr_on_plateau" || (a.warmup_ratio == 0 && a.warmup_steps == 0),
                     "--lr_scheduler_type reduce_lr_on_plateau has no warmup (transformers ignores --warmup_ratio / "
                     "--warmup_steps with it); drop them");
  ALPACA_USAGE_CHECK(!(a.bf16 && a.fp16), "--bf16 and --fp16 are both set; choose one mixed-precision mode "
                                          "(bf16 on Ampere or newer GPUs and on CPU, fp16 on older GPUs)");
}

void validate_strategies(TrainArgs& a) {
  const std::vector<std::string> intervals = {"no", "steps", "epoch"};
  check_choice("logging_strategy", a.logging_strategy, intervals);
  check_choice("eval_strategy", a.eval_strategy, intervals);
  check_choice("save_strategy", a.save_strategy, {"no", "steps", "epoch", "best"});
  check_choice("save_checkpoint_layout", a.save_checkpoint_layout, {"sharded", "gathered"});

  // A *_steps flag the user set only acts under the matching "steps" strategy.
  struct Pair { const char* steps; const char* strategy; const std::string& value; };
  for (const Pair& p : {Pair{"save_steps", "save_strategy", a.save_strategy},
                        Pair{"logging_steps", "logging_strategy", a.logging_strategy},
                        Pair{"eval_steps", "eval_strategy", a.eval_strategy}}) {
    // Default values do not count: training_args.json lists every flag and must read back.
    const FlagInfo* info = find_train_flag(p.steps);
    bool given = a.is_set(p.steps) && flag_value_text(a, p.steps) != info->default_text &&
                 !a.mooted_by_command_line(p.steps, p.strategy);
    ALPACA_USAGE_CHECK(!given || p.value == "steps",
                       "--" << p.steps << " " << flag_value_text(a, p.steps) << " has no effect with --" << p.strategy << " "
                            << p.value << "; set --" << p.strategy << " steps, or drop --" << p.steps);
  }
  if (a.save_strategy == "steps") check_interval("save_steps", a.save_steps);
  ALPACA_USAGE_CHECK(a.eval_delay >= 0, "--eval_delay must be >= 0, got " << a.eval_delay);
  ALPACA_USAGE_CHECK(a.eval_delay == 0 || a.eval_strategy != "no" || a.mooted_by_command_line("eval_delay", "eval_strategy"),
                     "--eval_delay " << a.eval_delay << " has no effect with --eval_strategy no; set --eval_strategy "
                                        "steps or epoch, or drop --eval_delay");
  if (a.logging_strategy == "steps") check_interval("logging_steps", a.logging_steps);
  if (a.eval_strategy == "steps") {
    if (!a.eval_steps) {
      ALPACA_USAGE_CHECK(a.logging_strategy == "steps" && a.logging_steps > 0,
                         "--eval_strategy steps needs --eval_steps (or --logging_steps with --logging_strategy steps, "
                         "which it defaults to)");
      a.eval_steps = a.logging_steps;  // HF: eval_steps defaults to logging_steps
    }
    check_interval("eval_steps", *a.eval_steps);
  }
  if (a.eval_strategy != "no") a.do_eval = true;  // HF sets do_eval when evaluation is scheduled
  ALPACA_USAGE_CHECK(!(a.is_set("do_eval") && a.do_eval && a.eval_strategy == "no" &&
                       !a.mooted_by_command_line("do_eval", "eval_strategy")),
                     "--do_eval True with --eval_strategy no would never evaluate; set --eval_strategy steps or epoch");
  ALPACA_USAGE_CHECK(a.eval_data_path.empty() || a.eval_strategy != "no" || a.eval_on_start ||
                         a.mooted_by_command_line("eval_data_path", "eval_strategy"),
                     "--eval_data_path is given but --eval_strategy is 'no', so it would never be read; "
                     "set --eval_strategy steps or epoch (or --eval_on_start True), or drop --eval_data_path");

  // HF's best-model tracking (TrainingArguments.__post_init__, Trainer.__init__); reduce_lr_on_plateau
  // steps on the same metric.
  const bool plateau = a.lr_scheduler_type == "reduce_lr_on_plateau" && a.deepspeed.empty();
  ALPACA_USAGE_CHECK(!plateau || a.eval_strategy != "no",
                     "--lr_scheduler_type reduce_lr_on_plateau requires an eval strategy (it steps on each evaluation's "
                     "--metric_for_best_model); set --eval_strategy steps or epoch and --eval_data_path");
  if ((a.load_best_model_at_end || plateau) && a.metric_for_best_model.empty()) a.metric_for_best_model = "loss";
  ALPACA_USAGE_CHECK(a.save_strategy != "best" || !a.metric_for_best_model.empty(),
                     "--save_strategy best needs --metric_for_best_model (or --load_best_model_at_end True, which "
                     "tracks loss)");
  if (!a.metric_for_best_model.empty()) {
    if (!a.greater_is_better)
      a.greater_is_better = a.metric_for_best_model.size() < 4 ||
                            a.metric_for_best_model.compare(a.metric_for_best_model.size() - 4, 4, "loss") != 0;
    const std::string key =
        a.metric_for_best_model.rfind("eval_", 0) == 0 ? a.metric_for_best_model : "eval_" + a.metric_for_best_model;
    const auto& names = train::eval_metric_names();
    std::string known;
    for (const auto& n : names) known += (known.empty() ? "" : ", ") + n.substr(5);
    ALPACA_USAGE_CHECK(std::find(names.begin(), names.end(), key) != names.end(),
                       "--metric_for_best_model " << a.metric_for_best_model << ": evaluation logs no " << key
                           << "; use one of " << known << " (eval_ prefix optional)");
    ALPACA_USAGE_CHECK(a.eval_strategy != "no",
                       "--metric_for_best_model is read from the evaluations of --eval_strategy steps or epoch, but "
                       "--eval_strategy is no"
                           << (a.load_best_model_at_end ? " (--load_best_model_at_end tracks loss)" : "")
                           << "; set --eval_strategy and --eval_data_path");
  }
  if (a.load_best_model_at_end && a.save_strategy != "best") {
    ALPACA_USAGE_CHECK(a.eval_strategy == a.save_strategy,
                       "--load_best_model_at_end requires the save and eval strategy to match (except with "
                       "--save_strategy best), but found --eval_strategy "
                           << a.eval_strategy << " and --save_strategy " << a.save_strategy);
    if (a.eval_strategy == "steps") {
      double ratio = a.save_steps / *a.eval_steps;
      ALPACA_USAGE_CHECK(ratio == std::floor(ratio),
                         "--load_best_model_at_end requires --save_steps to be a round multiple of --eval_steps, but found "
                             << a.save_steps << " and " << *a.eval_steps);
    }
  }
  ALPACA_USAGE_CHECK(a.eval_strategy == "no" || !a.eval_data_path.empty(),
                     "--eval_strategy " << a.eval_strategy << " needs --eval_data_path, an Alpaca JSON file to "
                     "evaluate on (alpaca-train does not split the training data)");
  ALPACA_USAGE_CHECK(!a.eval_on_start || !a.eval_data_path.empty(),
                     "--eval_on_start True needs --eval_data_path, the data to evaluate on");
}

void validate_logging(TrainArgs& a) {
  for (const char* flag : {"log_level", "log_level_replica"}) {
    try {
      log::parse_level(flag_value_text(a, flag));
    } catch (const Error& e) {
      ALPACA_USAGE_FAIL("--" << flag << " '" << flag_value_text(a, flag) << "' is not a level; use one of debug, info, "
                             "warning, error, critical, passive");
    }
  }
  if (!a.disable_tqdm) a.disable_tqdm = a.log_level == "error" || a.log_level == "critical";
  std::vector<std::string> targets = split_words(a.report_to);
  if (targets.empty()) {  // HF/TRL: report_to [] (a dumped SFTConfig's) reports to no integration
    a.report_to = "none";
    targets = {"none"};
  }
  for (const auto& t : targets) {
    ALPACA_USAGE_CHECK(one_of(t, {"none", "jsonl", "tensorboard", "all"}),
                       "--report_to '" << t << "' is not available: alpaca-train writes no wandb/mlflow/... logs; "
                                       "use jsonl (metrics.jsonl), tensorboard (event files in logging_dir), all (both) or none");
  }
  ALPACA_USAGE_CHECK(targets.size() == 1 || !one_of("none", targets), "--report_to none cannot be combined with other targets");
  // logging_dir stays "" unless given: trainer_options then sends event files to HF's
  // output_dir/runs/<date>_<host> (a new one per run) and metrics.jsonl to output_dir, and
  // training_args.json read back as --config into another output_dir does not point at this one.
  if (a.run_name.empty()) a.run_name = a.output_dir;  // HF: run_name defaults to output_dir
}

void validate_data(TrainArgs& a, const dist::LaunchInfo& launch) {
  ALPACA_USAGE_CHECK(a.remove_unused_columns, "--remove_unused_columns False is not supported: the Alpaca pipeline "
                                              "builds only input_ids, labels and attention_mask; drop the flag");
  ALPACA_USAGE_CHECK(a.packing_strategy == "bfd" || a.packing_strategy == "wrapped",
                     "--packing_strategy '" << a.packing_strategy << "' is not implemented; give bfd (TRL's default) or "
                     "wrapped" << (a.packing_strategy == "bfd_split" ? " (TRL's bfd_split, which splits long examples "
                                                                       "into several documents, is not implemented)" : ""));
  ALPACA_USAGE_CHECK(!a.shuffle_dataset || a.seed >= 0,
                     "--shuffle_dataset with --seed " << a.seed << ": datasets' shuffle (NumPy's default_rng) takes a "
                     "seed >= 0; give a non-negative --seed");
  const std::string& tss = a.train_sampling_strategy;
  ALPACA_USAGE_CHECK(tss == "random" || tss == "sequential" || tss == "group_by_length" || tss == "batch_rebalance",
                     "--train_sampling_strategy '" << tss << "' is not a strategy; give random (the default), "
                     "sequential, group_by_length or batch_rebalance");
  ALPACA_USAGE_CHECK(!(tss == "batch_rebalance" && a.group_by_length),
                     "--group_by_length True and --train_sampling_strategy batch_rebalance are two samplers; choose one");
  if (tss == "group_by_length") a.group_by_length = true;  // transformers 5's spelling of the 4.x flag
  ALPACA_USAGE_CHECK(!(a.packing && a.group_by_length),
                     "--packing and --group_by_length contradict: packed sequences all have model_max_length tokens; "
                     "choose one");
  if (!a.resume_from_checkpoint.empty()) {
    auto b = parse_bool_text(a.resume_from_checkpoint);
    std::string lower = a.resume_from_checkpoint;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lower == "auto") {
      a.resume_from_checkpoint = "auto";  // the newest complete checkpoint when there is one, else a fresh start
    } else if (b.has_value()) {
      a.resume_from_checkpoint = *b ? "True" : "";
    } else {
      ALPACA_USAGE_CHECK(std::filesystem::is_directory(a.resume_from_checkpoint),
                         "--resume_from_checkpoint " << a.resume_from_checkpoint << ": no such directory; give a "
                         "checkpoint-<step> directory, True for the newest checkpoint in --output_dir, or auto for "
                         "the newest one when there is one (a fresh start otherwise)");
    }
  }
  // torch.distributed.launch passes --local_rank as well as exporting it.
  if (a.local_rank >= 0) {
    ALPACA_USAGE_CHECK(launch.source == dist::LaunchSource::kSingle || launch.local_rank == a.local_rank,
                       "--local_rank " << a.local_rank << " contradicts the launcher's local rank " << launch.local_rank
                                       << "; drop --local_rank");
  }
}

// The FSDP flags -> one fsdp::FsdpPolicy, through fsdp::build_fsdp_policy (the engine's own
// parser, so the CLI and the engine cannot disagree); its errors become usage errors (exit 2).
// Runs after the DeepSpeed mapping, which may set fsdp_words and the precision flags.
void validate_fsdp(TrainArgs& a, const dist::LaunchInfo& launch) {
  fsdp::FsdpPolicyInputs in;
  in.fsdp = a.deepspeed.empty() ? a.fsdp : a.fsdp_words;
  if (!a.fsdp_config.empty()) in.fsdp_config = read_json_flag("fsdp_config", a.fsdp_config, &in.fsdp_config_origin).dump();
  in.transformer_layer_cls_to_wrap = split_words(a.fsdp_transformer_layer_cls_to_wrap);
  in.mixed_precision = a.bf16 ? "bf16" : a.fp16 ? "fp16" : "no";
  in.gradient_checkpointing = a.gradient_checkpointing;
  in.local_world_size = launch.local_world_size;
  try {
    a.fsdp_policy = fsdp::build_fsdp_policy(in);
    a.fsdp_words = join(fsdp::fsdp_words(in.fsdp), " ");
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    ALPACA_USAGE_FAIL(e.message());
  }
  a.fsdp_config_json = in.fsdp_config.empty() ? "{}" : in.fsdp_config;
}

// LoRA flags (TRL's names): values peft refuses are refused here, and a LoRA flag without
// --use_peft (which would silently do nothing) is an error.
void validate_lora(TrainArgs& a) {
  if (!a.use_peft) {
    // A value other than the default (a dumped config repeats the defaults; those are fine).
    const TrainArgs d;
    const std::pair<const char*, bool> changed[] = {
        {"lora_r", a.lora_r != d.lora_r}, {"lora_alpha", a.lora_alpha != d.lora_alpha},
        {"lora_dropout", a.lora_dropout != d.lora_dropout}, {"lora_target_modules", a.lora_target_modules != d.lora_target_modules},
        {"lora_modules_to_save", a.lora_modules_to_save != d.lora_modules_to_save}, {"use_rslora", a.use_rslora != d.use_rslora},
        {"use_dora", a.use_dora != d.use_dora},
        {"merge_adapter", a.merge_adapter != d.merge_adapter}};
    for (const auto& [f, differs] : changed)
      ALPACA_USAGE_CHECK(!differs || a.mooted_by_command_line(f, "use_peft"),
                         "--" << f << " only acts on a LoRA run; add --use_peft True or drop it");
    return;
  }
  ALPACA_USAGE_CHECK(a.lora_r > 0, "--lora_r must be > 0 (the LoRA rank), got " << a.lora_r);
  ALPACA_USAGE_CHECK(a.lora_dropout >= 0 && a.lora_dropout < 1, "--lora_dropout must be in [0, 1), got " << a.lora_dropout);
  ALPACA_USAGE_CHECK(std::isfinite(a.lora_alpha) && a.lora_alpha != 0, "--lora_alpha must be a non-zero number, got " << a.lora_alpha);
  bool lm_head_targeted = false;  // "lm_head" as a whole name in the list (model::split_module_list's forms)
  const std::string& t = a.lora_target_modules;
  auto word_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t at = t.find("lm_head"); at != std::string::npos; at = t.find("lm_head", at + 1))
    lm_head_targeted = lm_head_targeted || ((at == 0 || !word_char(t[at - 1])) &&
                                            (at + 7 == t.size() || !word_char(t[at + 7])));
  ALPACA_USAGE_CHECK(!lm_head_targeted || a.lora_dropout == 0,
                     "--lora_target_modules lm_head with --lora_dropout " << a.lora_dropout
                         << ": dropout on lm_head's LoRA branch is not supported (the fused loss takes one weight); "
                            "use --lora_dropout 0 or leave lm_head out");
  ALPACA_USAGE_CHECK(!lm_head_targeted || !a.use_dora,
                     "--use_dora with lm_head in --lora_target_modules: DoRA on lm_head is not supported (the fused "
                     "loss takes one plain weight); leave lm_head out or train it with --lora_modules_to_save lm_head");
}

// QLoRA flags (transformers' BitsAndBytesConfig names): a 4-bit base is frozen, so only a LoRA run
// takes one; the dequantized weights are in the run's own dtype. Sets the policy's quant4 fields.
void validate_quant(TrainArgs& a) {
  ALPACA_USAGE_CHECK(!a.load_in_8bit, "--load_in_8bit: 8-bit (LLM.int8) bases are not supported by alpaca-train; "
                                      "use --load_in_4bit True (QLoRA, NF4) instead");
  const TrainArgs d;
  if (!a.load_in_4bit) {
    const std::pair<const char*, bool> changed[] = {
        {"bnb_4bit_quant_type", a.bnb_4bit_quant_type != d.bnb_4bit_quant_type},
        {"use_bnb_nested_quant", a.use_bnb_nested_quant != d.use_bnb_nested_quant},
        {"bnb_4bit_compute_dtype", a.bnb_4bit_compute_dtype != d.bnb_4bit_compute_dtype},
        {"bnb_4bit_quant_storage", a.bnb_4bit_quant_storage != d.bnb_4bit_quant_storage}};
    for (const auto& [f, differs] : changed)
      ALPACA_USAGE_CHECK(!differs || a.mooted_by_command_line(f, "load_in_4bit"),
                         "--" << f << " only acts with a 4-bit base; add --load_in_4bit True or drop it");
    return;
  }
  ALPACA_USAGE_CHECK(a.use_peft, "--load_in_4bit: a 4-bit base is frozen, so it trains only an adapter; "
                                 "add --use_peft True (QLoRA) or drop --load_in_4bit");
  check_choice("bnb_4bit_quant_type", a.bnb_4bit_quant_type, {"nf4", "fp4"});
  check_choice("bnb_4bit_quant_storage", a.bnb_4bit_quant_storage, {"uint8", "bfloat16", "float16", "float32"});
  const at::ScalarType run = a.fsdp_policy.param_dtype;
  const char* run_name = run == at::kBFloat16 ? "bfloat16" : run == at::kHalf ? "float16" : "float32";
  const std::string& c = a.bnb_4bit_compute_dtype;
  const bool same = c.empty() || c == run_name || (c == "bf16" && run == at::kBFloat16) ||
                    (c == "fp16" && run == at::kHalf) || (c == "fp32" && run == at::kFloat);
  ALPACA_USAGE_CHECK(same, "--bnb_4bit_compute_dtype " << c << " differs from the run's dtype " << run_name
                           << ": the weights are dequantized into the dtype the layers compute in; drop the flag, "
                              "or choose the run's dtype with --bf16 / --fp16");
  // The 4-bit base is held per FSDP unit, one per decoder layer; a whole-model unit would train the
  // full-precision weights without a word.
  ALPACA_USAGE_CHECK(a.fsdp_policy.auto_wrap, "--load_in_4bit holds each decoder layer 4-bit, which needs one FSDP unit per "
                                              "decoder layer: add auto_wrap to --fsdp (e.g. --fsdp \"" << a.fsdp
                                              << " auto_wrap\") or drop --fsdp");
  a.fsdp_policy.quant4_type = a.bnb_4bit_quant_type;
  a.fsdp_policy.quant4_nested = a.use_bnb_nested_quant;
}

}  // namespace

void validate_train_args(TrainArgs& a, const dist::LaunchInfo& launch) {
  a.fsdp_words.clear();
  a.notes.clear();
  a.deepspeed_zero_stage = 0;
  a.deepspeed_schedule.reset();
  validate_required(a);
  validate_sizes(a);
  if (!a.deepspeed.empty()) {
    ALPACA_USAGE_CHECK(a.fsdp.empty(), "--deepspeed and --fsdp both choose the sharding engine; give one "
                                       "(alpaca-train maps the DeepSpeed config onto its FSDP engine)");
    ALPACA_USAGE_CHECK(a.fsdp_config.empty() && a.fsdp_transformer_layer_cls_to_wrap.empty(),
                       "--fsdp_config / --fsdp_transformer_layer_cls_to_wrap do not combine with --deepspeed; drop them");
  }
  validate_optimizer(a);
  validate_strategies(a);
  validate_logging(a);
  validate_data(a, launch);
  if (!a.deepspeed.empty()) {
    apply_deepspeed_config(a.deepspeed, a, launch.world_size);
    schedule_from_flags(a);
  }
  validate_fsdp(a, launch);
  validate_lora(a);
  validate_quant(a);
}

void check_input_paths(const TrainArgs& a) {
  namespace fs = std::filesystem;
  const fs::path model = a.model_name_or_path;
  ALPACA_USAGE_CHECK(fs::is_directory(model), "--model_name_or_path " << model.string() << " is not a directory; give a "
                     "local Hugging Face LLaMA directory (config.json, weights, tokenizer), or create a small one with "
                     "`alpaca-train init-model`");
  ALPACA_USAGE_CHECK(fs::is_regular_file(model / "config.json"), "--model_name_or_path " << model.string()
                     << " has no config.json; give a Hugging Face model directory (save_pretrained output)");
  ALPACA_USAGE_CHECK(fs::is_regular_file(model / "tokenizer.model") || fs::is_regular_file(model / "tokenizer.json"),
                     "--model_name_or_path " << model.string() << " has no tokenizer (tokenizer.model or tokenizer.json); "
                     "copy the base model's tokenizer files into it");
  // config.json read as the trainer reads it: an architecture or option the modules do not implement
  // is refused here, before output_dir is written.
  const std::string cfg = (model / "config.json").string();
  const model::LlamaConfig config = model::LlamaConfig::from_json_file(cfg);
  // A wrap class of another model type (accelerate: "could not find the transformer layer class").
  if (!a.fsdp_policy.wrap_classes.empty()) fsdp::check_wrap_classes(a.fsdp_policy, config.model_type, cfg);
  ALPACA_USAGE_CHECK(a.chat_template.empty() || fs::is_regular_file(a.chat_template),
                     "--chat_template " << a.chat_template << " is not a file (a Jinja chat template is needed)");
  for (const auto& [flag, paths] : {std::pair<const char*, std::string>{"data_path", a.data_path},
                                    std::pair<const char*, std::string>{"eval_data_path", a.eval_data_path}}) {
    if (paths.empty()) continue;
    std::stringstream items(paths);  // several files separated by commas (data::split_data_paths)
    for (std::string path; std::getline(items, path, ',');) {
      path.erase(0, path.find_first_not_of(" \t"));
      path.erase(path.find_last_not_of(" \t") + 1);
      ALPACA_USAGE_CHECK(fs::exists(path), "--" << flag << " " << path << ": no such file; give an Alpaca JSON "
                         "file of {instruction, input, output} records (or JSON Lines, Parquet, CSV, a save_to_disk directory)");
    }
  }
}

}  // namespace alpaca::cli
