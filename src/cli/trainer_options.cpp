// TrainArgs -> train::TrainerOptions: the one place where validated flags become what the trainer
// does (interval words -> Interval, --report_to -> outputs, --data_seed/--seed, which checkpoint
// to resume, the LR schedule with its kwargs). train/ never sees the flags.
#include <nlohmann/json.hpp>  // defines: nlohmann::json

#include "alpaca/cli/flag_table.h"
#include "alpaca/cli/train_args.h"
#include "alpaca/cli/usage_error.h"
#include "alpaca/model/lora.h"
#include "alpaca/train/metrics.h"
#include "alpaca/train/tensorboard.h"
#include "alpaca/util/error.h"

namespace alpaca::cli {
namespace {

train::Interval interval_of(const std::string& word, const char* flag) {
  if (word == "no") return train::Interval::kNo;
  if (word == "steps") return train::Interval::kSteps;
  if (word == "epoch") return train::Interval::kEpoch;
  if (word == "best" && std::string(flag) == "save_strategy") return train::Interval::kBest;
  ALPACA_USAGE_FAIL("--" << flag << " '" << word << "' is not a strategy; use no, steps or epoch");
}

std::vector<std::string> report_words(const std::string& text) {
  std::vector<std::string> words;
  std::string w;
  for (char ch : text + " ") {
    if (ch == ' ' || ch == ',') {
      if (!w.empty()) words.push_back(w);
      w.clear();
    } else {
      w += ch;
    }
  }
  return words;
}

// --use_peft's adapter: the --lora_* flags as peft's LoraConfig reads them.
model::LoraOptions lora_options(const TrainArgs& a) {
  model::LoraOptions l;
  l.r = a.lora_r;
  l.alpha = a.lora_alpha;
  l.dropout = a.lora_dropout;
  l.use_rslora = a.use_rslora;
  l.use_dora = a.use_dora;
  l.target_modules = model::split_module_list(a.lora_target_modules);
  l.modules_to_save = model::split_module_list(a.lora_modules_to_save);
  return l;
}

void set_data_options(const TrainArgs& a, train::TrainerOptions& o) {
  o.model_name_or_path = a.model_name_or_path;
  o.use_fast_tokenizer = a.use_fast_tokenizer;
  o.data_path = a.data_path;
  o.eval_data_path = a.eval_data_path;
  o.dataset_format = a.dataset_format;
  o.dataset_text_field = a.dataset_text_field;
  o.chat_template = a.chat_template;
  o.eos_token = a.eos_token;
  o.pad_token = a.pad_token;
  o.assistant_only_loss = a.assistant_only_loss;
  o.completion_only_loss = a.completion_only_loss;
  o.model_max_length = a.model_max_length;
  o.packing = a.packing;
  o.packing_strategy = a.packing_strategy;
  o.shuffle_dataset = a.shuffle_dataset;
  o.pad_to_multiple_of = a.pad_to_multiple_of.value_or(1);
  o.eval_packing = a.eval_packing;
  o.group_by_length = a.group_by_length;
  o.shuffle = a.train_sampling_strategy != "sequential";
  o.batch_rebalance = a.train_sampling_strategy == "batch_rebalance";
  o.dataloader_drop_last = a.dataloader_drop_last;
}

// Batches, steps, the optimizer and its schedule, precision and the FSDP policy.
void set_loop_options(const TrainArgs& a, train::TrainerOptions& o) {
  o.per_device_train_batch_size = a.per_device_train_batch_size;
  o.per_device_eval_batch_size = a.per_device_eval_batch_size;
  o.gradient_accumulation_steps = a.gradient_accumulation_steps;
  o.max_steps = a.max_steps;
  o.num_train_epochs = a.num_train_epochs;
  o.auto_find_batch_size = a.auto_find_batch_size;
  o.neftune_noise_alpha = a.neftune_noise_alpha;
  o.loss.label_smoothing = a.label_smoothing_factor;
  o.loss.dft = a.loss_type == "dft";
  o.include_num_input_tokens_seen = a.include_num_input_tokens_seen;
  o.tokenize_threads = static_cast<int>(a.dataset_num_proc.value_or(0));
  o.torch_empty_cache_steps = a.torch_empty_cache_steps.value_or(0);

  o.adamw.beta1 = a.adam_beta1;
  o.adamw.beta2 = a.adam_beta2;
  o.adamw.eps = a.adam_epsilon;
  o.adamw.weight_decay = a.weight_decay;
  // transformers' _get_bitsandbytes_optimizer: "8bit" in the name is optim_bits 8, else 32.
  const bool lion = a.optim.find("lion") != std::string::npos;
  if (a.optim.find("bnb") != std::string::npos || a.optim.find("paged") != std::string::npos ||
      a.optim == "adamw_8bit" || lion)
    o.adamw.bnb_bits = a.optim.find("8bit") != std::string::npos ? 8 : 32;
  o.adamw.lion = lion;
  o.adamw.adafactor = a.optim == "adafactor";
  o.max_grad_norm = a.max_grad_norm;
  o.schedule = schedule_from_flags(a);
  o.warmup_steps = a.warmup_steps;
  o.warmup_ratio = a.warmup_ratio;

  o.fp16 = a.fp16;
  o.tf32 = a.tf32;
  o.fsdp_policy = a.fsdp_policy;
  o.ddp_timeout_seconds = a.ddp_timeout;
  o.use_cpu = a.use_cpu;
  o.full_determinism = a.full_determinism;
}

// Where and when the run logs, evaluates and reports (jsonl, TensorBoard).
void set_logging_options(const TrainArgs& a, train::TrainerOptions& o) {
  o.output_dir = a.output_dir;
  o.logging_dir = a.logging_dir.empty() ? a.output_dir : a.logging_dir;
  o.run_name = a.run_name;
  o.overwrite_output_dir = a.overwrite_output_dir;
  o.logging_strategy = interval_of(a.logging_strategy, "logging_strategy");
  o.eval_strategy = interval_of(a.eval_strategy, "eval_strategy");
  o.eval_on_start = a.eval_on_start;
  o.eval_delay = a.eval_delay;
  o.save_strategy = interval_of(a.save_strategy, "save_strategy");
  o.load_best_model_at_end = a.load_best_model_at_end;
  if (!a.metric_for_best_model.empty()) {  // validate_train_args checked it names an eval_ key
    const std::string& m = a.metric_for_best_model;
    o.metric_for_best_model = m.rfind("eval_", 0) == 0 ? m : "eval_" + m;
    o.greater_is_better = a.greater_is_better.value_or(false);
  }
  o.logging_steps = a.logging_steps;
  o.save_steps = a.save_steps;
  o.eval_steps = a.eval_steps;
  o.logging_first_step = a.logging_first_step;
  try {
    const train::ReportTo r = train::parse_report_to(report_words(a.report_to));
    o.report_jsonl = r.jsonl;
    o.report_tensorboard = r.tensorboard;
  } catch (const Error& e) {
    ALPACA_USAGE_FAIL(e.message());
  }
  if (o.report_tensorboard) {
    o.tensorboard_dir_given = !a.logging_dir.empty();
    o.tensorboard_dir = o.tensorboard_dir_given ? std::filesystem::path(a.logging_dir)
                                                : std::filesystem::path(a.output_dir) / train::default_tensorboard_subdir();
    TrainArgs shown = a;  // HF's to_json_string shows the resolved logging_dir
    shown.logging_dir = o.tensorboard_dir.string();
    o.args_json = train_args_to_json(shown);
  }
  o.disable_tqdm = a.disable_tqdm.value_or(false);
}

void set_save_options(const TrainArgs& a, train::TrainerOptions& o) {
  o.save_max_shard_bytes = a.save_max_shard_bytes;
  o.save_only_model = a.save_only_model;
  o.save_async = a.save_async;
  o.sharded_checkpoints = a.save_checkpoint_layout == "sharded";
  o.save_total_limit = a.save_total_limit;
  if (a.use_peft) {
    o.lora = lora_options(a);
    o.merge_adapter = a.merge_adapter;
  }
}

train::ResumeFrom resume_from(const std::string& flag) {
  if (flag == "True") return {train::ResumeFrom::Kind::kLatest, {}};
  if (flag == "auto") return {train::ResumeFrom::Kind::kLatestIfAny, {}};
  if (!flag.empty()) return {train::ResumeFrom::Kind::kDirectory, flag};
  return {};
}

}  // namespace

train::TrainerOptions trainer_options(const TrainArgs& a) {
  train::TrainerOptions o;
  set_data_options(a, o);
  set_loop_options(a, o);
  set_logging_options(a, o);
  set_save_options(a, o);
  o.seed = a.seed;
  o.data_seed = a.data_seed.value_or(a.seed);
  o.resume = resume_from(a.resume_from_checkpoint);
  o.ignore_data_skip = a.ignore_data_skip;
  return o;
}

}  // namespace alpaca::cli
