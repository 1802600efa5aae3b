// TrainArgs parsing: the Stanford Alpaca README commands verbatim, boolean forms, unknown and
// contradictory flags, --config precedence, the JSON dump reading back, the derived values.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "alpaca/cli/flag_table.h"
#include "alpaca/cli/train_args.h"
#include "alpaca/cli/usage_error.h"
#include "yaml_config.h"
#include "alpaca/fsdp/policy.h"
#include "cli_test_util.h"
#include "test_util.h"

namespace alpaca::cli::test_train_args {
namespace {

using test::kRequired;
using test::parse_error;
using test::expect_usage_errors;
using test::shell_split;

// The flags the README's two commands (stanford_alpaca README, "Fine-tuning" and "Addressing
// OOM") share, from the first flag on; only the <placeholders> are filled in.
const std::string kAlpacaCommonFlags = R"(--model_name_or_path /models/llama-7b-hf \
    --data_path ./alpaca_data.json \
    --bf16 True \
    --output_dir /tmp/alpaca-out \
    --num_train_epochs 3 \
    --per_device_train_batch_size 4 \
    --per_device_eval_batch_size 4 \
    --gradient_accumulation_steps 8 \
    --evaluation_strategy "no" \
    --save_strategy "steps" \
    --save_steps 2000 \
    --save_total_limit 1 \
    --learning_rate 2e-5 \
    --weight_decay 0. \
    --warmup_ratio 0.03 \
)";

// The README's FSDP command.
const std::string kAlpacaFsdpCommand = kAlpacaCommonFlags + R"(    --lr_scheduler_type "cosine" \
    --logging_steps 1 \
    --fsdp "full_shard auto_wrap" \
    --fsdp_transformer_layer_cls_to_wrap 'LlamaDecoderLayer' \
    --tf32 True)";

// The README's DeepSpeed command.
const std::string kAlpacaDeepSpeedCommand = kAlpacaCommonFlags + R"(    --deepspeed "./configs/default_offload_opt_param.json" \
    --tf32 True)";

// The DeepSpeed command names ./configs/...: run from the repository root, as the README does.
class FromRepoRoot : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = std::filesystem::current_path();
    std::filesystem::current_path(testing::source_dir());
  }
  void TearDown() override { std::filesystem::current_path(saved_); }
  std::filesystem::path saved_;
};

void expect_alpaca_common(const TrainArgs& a) {
  EXPECT_EQ(a.model_name_or_path, "/models/llama-7b-hf");
  EXPECT_EQ(a.data_path, "./alpaca_data.json");
  EXPECT_TRUE(a.bf16);
  EXPECT_FALSE(a.fp16);
  EXPECT_EQ(a.output_dir, "/tmp/alpaca-out");
  EXPECT_DOUBLE_EQ(a.num_train_epochs, 3.0);
  EXPECT_EQ(a.max_steps, -1);
  EXPECT_EQ(a.per_device_train_batch_size, 4);
  EXPECT_EQ(a.per_device_eval_batch_size, 4);
  EXPECT_EQ(a.gradient_accumulation_steps, 8);
  EXPECT_EQ(a.eval_strategy, "no");
  EXPECT_FALSE(a.do_eval);
  EXPECT_EQ(a.save_strategy, "steps");
  EXPECT_DOUBLE_EQ(a.save_steps, 2000);
  ASSERT_TRUE(a.save_total_limit.has_value());
  EXPECT_EQ(*a.save_total_limit, 1);
  EXPECT_DOUBLE_EQ(a.learning_rate, 2e-5);
  EXPECT_DOUBLE_EQ(a.weight_decay, 0.0);
  EXPECT_DOUBLE_EQ(a.warmup_ratio, 0.03);
  ASSERT_TRUE(a.tf32.has_value());
  EXPECT_TRUE(*a.tf32);
  // HF / Alpaca defaults the README relies on.
  EXPECT_EQ(a.model_max_length, 512);
  EXPECT_EQ(a.optim, "adamw_torch");
  EXPECT_DOUBLE_EQ(a.adam_beta1, 0.9);
  EXPECT_DOUBLE_EQ(a.adam_beta2, 0.999);
  EXPECT_DOUBLE_EQ(a.adam_epsilon, 1e-8);
  EXPECT_DOUBLE_EQ(a.max_grad_norm, 1.0);
  EXPECT_EQ(a.seed, 42);
  EXPECT_EQ(trainer_options(a).data_seed, 42);
  EXPECT_FALSE(a.gradient_checkpointing);
  EXPECT_EQ(a.ddp_timeout, 1800);
  // 52,002 examples on 4 GPUs x 4 x 8: 1,218 steps, 37 of them warmup (stanford_alpaca_facts §1.9).
  EXPECT_EQ(train::warmup_steps_for(a.warmup_steps, a.warmup_ratio, 1218), 37);
}

TEST(TrainArgs, AlpacaFsdpCommandParsesVerbatim) {
  TrainArgs a = parse_train_args(shell_split(kAlpacaFsdpCommand));
  expect_alpaca_common(a);
  EXPECT_EQ(a.lr_scheduler_type, "cosine");
  EXPECT_DOUBLE_EQ(a.logging_steps, 1);
  EXPECT_EQ(a.logging_strategy, "steps");
  EXPECT_EQ(a.fsdp, "full_shard auto_wrap");
  EXPECT_EQ(a.fsdp_words, "full_shard auto_wrap");
  EXPECT_EQ(a.fsdp_policy.strategy, fsdp::ShardingStrategy::kFullShard);
  EXPECT_TRUE(a.fsdp_policy.auto_wrap);
  EXPECT_EQ(a.fsdp_policy.param_dtype, at::kBFloat16);
  EXPECT_EQ(a.fsdp_transformer_layer_cls_to_wrap, "LlamaDecoderLayer");
  EXPECT_EQ(a.fsdp_policy.wrap_classes, std::vector<std::string>{"LlamaDecoderLayer"});
  EXPECT_EQ(a.fsdp_config_json, "{}");
  EXPECT_EQ(a.deepspeed_zero_stage, 0);
  EXPECT_TRUE(a.is_set("eval_strategy"));  // given as --evaluation_strategy
  EXPECT_FALSE(a.is_set("seed"));
}

TEST_F(FromRepoRoot, AlpacaDeepSpeedCommandParsesVerbatim) {
  TrainArgs a = parse_train_args(shell_split(kAlpacaDeepSpeedCommand));
  expect_alpaca_common(a);
  EXPECT_EQ(a.deepspeed, "./configs/default_offload_opt_param.json");
  // ZeRO-3 with parameter and optimizer offload = FSDP full_shard + offload, a unit per layer.
  EXPECT_EQ(a.deepspeed_zero_stage, 3);
  EXPECT_EQ(a.fsdp_words, "full_shard auto_wrap offload");
  EXPECT_TRUE(a.fsdp_policy.offload);
  // WarmupDecayLR runs as DeepSpeed's class: logarithmic warmup (DeepSpeed's default warmup_type; the
  // config does not set one) over ceil(0.03 x steps), then linear decay; no cosine in the DeepSpeed run.
  ASSERT_TRUE(a.deepspeed_schedule);
  EXPECT_EQ(a.deepspeed_schedule->type, optim::ScheduleType::kDeepSpeedWarmupDecayLR);
  EXPECT_TRUE(a.deepspeed_schedule->deepspeed.log_warmup);
  EXPECT_DOUBLE_EQ(a.warmup_ratio, 0.03);
  bool noted = false;
  for (const auto& n : a.notes) noted = noted || n.find("DeepSpeed's WarmupDecayLR decides the learning rate") != std::string::npos;
  EXPECT_TRUE(noted) << "the schedule DeepSpeed runs must be reported";
}

TEST(TrainArgs, BooleanForms) {
  for (const char* t : {"True", "true", "1", "yes"}) {
    EXPECT_TRUE(parse_train_args(shell_split(kRequired + "--bf16 " + t)).bf16) << t;
  }
  for (const char* f : {"False", "false", "0", "no"}) {
    EXPECT_FALSE(parse_train_args(shell_split(kRequired + "--bf16 " + f)).bf16) << f;
  }
  // Bare, at the end and before another flag; --flag=value.
  EXPECT_TRUE(parse_train_args(shell_split(kRequired + "--bf16")).bf16);
  TrainArgs a = parse_train_args(shell_split(kRequired + "--gradient_checkpointing --tf32 False --bf16=True"));
  EXPECT_TRUE(a.gradient_checkpointing);
  ASSERT_TRUE(a.tf32.has_value());
  EXPECT_FALSE(*a.tf32);
  EXPECT_TRUE(a.bf16);
  // Optional booleans stay None unless given; HF's --no_<flag> for flags that default to True.
  EXPECT_FALSE(parse_train_args(shell_split(kRequired)).tf32.has_value());
  // --no_save_safetensors sets it to False, which is refused at parse time (exit 2), not at step 0.
  expect_usage_errors({
      {"--no_save_safetensors", "--save_safetensors False is not supported"},
      {"--bf16 maybe", "--bf16 expects a boolean (True/False, true/false, 1/0), got 'maybe'"},
      {"--save_safetensors True --no_save_safetensors", "contradict"},
  });
}

// TRL's dataset_text_field: "text" unless given, passed to the trainer; an empty name is refused.
TEST(TrainArgs, DatasetTextField) {
  EXPECT_EQ(trainer_options(parse_train_args(shell_split(kRequired))).dataset_text_field, "text");
  EXPECT_EQ(trainer_options(parse_train_args(shell_split(kRequired + "--dataset_text_field body"))).dataset_text_field,
            "body");
  expect_usage_errors({{"--dataset_text_field ''", "--dataset_text_field is empty"}});
}

TEST(TrainArgs, NumbersAndOptionals) {
  TrainArgs a = parse_train_args(shell_split(kRequired + "--max_steps -1 --save_total_limit None --learning_rate 3e-4 "
                                                         "--data_seed 7 --max_steps=20"));
  EXPECT_EQ(a.max_steps, 20);  // the last occurrence wins, as with argparse
  EXPECT_FALSE(a.save_total_limit.has_value());
  EXPECT_DOUBLE_EQ(a.learning_rate, 3e-4);
  EXPECT_EQ(trainer_options(a).data_seed, 7);
  expect_usage_errors({
      {"--per_device_train_batch_size four", "--per_device_train_batch_size expects an integer, got 'four'"},
      {"--learning_rate fast", "--learning_rate expects a number, got 'fast'"},
      {"--max_steps 0", "--max_steps must be a positive number"},
      {"--learning_rate", "--learning_rate needs a value, e.g. --learning_rate VALUE"},
      {"--output_dir --bf16", "--output_dir needs a value, but the next argument is the flag --bf16"},
      // A flag whose value is missing before another flag with a value: named, not the value left over.
      {"--learning_rate --max_steps 2", "--learning_rate needs a value, but the next argument is the flag --max_steps"},
  });
}

// HfArgumentParser: every flag also spelled with '-'; an empty value ("" from a script's unset
// variable) is the empty string, never the bare flag's True.
TEST(TrainArgs, DashSpellingsAndEmptyValuesAsHfArgumentParser) {
  TrainArgs a = parse_train_args(shell_split(kRequired + "--learning-rate 3e-4 --per-device-train-batch-size=2 "
                                                         "--fsdp '' --resume_from_checkpoint '' --bf16"));
  EXPECT_DOUBLE_EQ(a.learning_rate, 3e-4);
  EXPECT_EQ(a.per_device_train_batch_size, 2);
  EXPECT_EQ(a.fsdp_words, "");
  EXPECT_EQ(trainer_options(a).resume.kind, train::ResumeFrom::Kind::kNone);
  EXPECT_TRUE(a.bf16);
  // List flags (nargs="+" in HfArgumentParser / TRL) take every word up to the next flag.
  a = parse_train_args(shell_split(kRequired + "--use_peft --lora_target_modules q_proj k_proj v_proj --lora_modules_to_save "
                                               "lm_head --report_to jsonl tensorboard --bf16"));
  EXPECT_EQ(a.lora_target_modules, "q_proj k_proj v_proj");
  EXPECT_EQ(a.lora_modules_to_save, "lm_head");
  EXPECT_TRUE(a.bf16);
  expect_usage_errors({
      {"--output_dir ''", "--output_dir must not be empty"},
      {"--learning_rate ''", "--learning_rate expects a number, got ''"},
      {"--learning-rat 1e-4", "did you mean --learning_rate?"},
      {"--no-save-safetensors", "--save_safetensors False is not supported"},
  });
}

TEST(TrainArgs, UnknownFlagsSuggestTheClosestName) {
  expect_usage_errors({
      {"--learning_rat 1e-4", "unknown flag --learning_rat; did you mean --learning_rate?"},
      {"--per_device_train_batch 4", "did you mean --per_device_train_batch_size?"},
      {"--evaluation_strateg no", "did you mean --evaluation_strategy?"},
      {"--gradient_accumulation=8", "did you mean --gradient_accumulation_steps?"},
      {"--frobnicate 3", "unknown flag --frobnicate; run 'alpaca-train --help'"},
      // An unquoted multi-word value leaves a stray word behind.
      {"--fsdp full_shard auto_wrap", "unexpected argument 'auto_wrap'"},
      // Values of choice flags get suggestions too.
      {"--lr_scheduler_type cosin", "did you mean 'cosine'?"},
      {"--fsdp \"full_shard auto_wrapp\"", "did you mean 'auto_wrap'?"},
  });
}

TEST(TrainArgs, ContradictionsSayWhatToChange) {
  expect_usage_errors({
      {"--bf16 True --fp16 True", "--bf16 and --fp16 are both set; choose one mixed-precision mode"},
      {"--save_strategy epoch --save_steps 100", "--save_steps 100.0 has no effect with --save_strategy epoch; set --save_strategy steps, or drop --save_steps"},
      {"--logging_strategy no --logging_steps 5", "--logging_steps 5.0 has no effect with --logging_strategy no"},
      {"--eval_steps 10", "--eval_steps 10.0 has no effect with --eval_strategy no"},
      {"--eval_strategy steps --logging_strategy epoch", "--eval_strategy steps needs --eval_steps"},
      {"--evaluation_strategy steps --eval_strategy steps", "--evaluation_strategy and --eval_strategy are the same flag; give only --eval_strategy"},
      {"--fsdp full_shard --deepspeed configs/default_offload_opt_param.json", "--deepspeed and --fsdp both choose the sharding engine; give one"},
      {"--fsdp \"full_shard shard_grad_op\"", "names full_shard and shard_grad_op; choose one sharding strategy"},
      {"--fsdp offload", "--fsdp offload can't work on its own"},
      {"--fsdp \"no_shard offload\"", "is not supported"},
      {"--fsdp hybrid_shard_zero2", "--fsdp hybrid_shard_zero2 is not implemented by the FSDP engine; use one of full_shard, shard_grad_op, no_shard, hybrid_shard"},
      {"--fsdp full_shard --fsdp_transformer_layer_cls_to_wrap LlamaDecoderLayer", "only acts with --fsdp auto_wrap"},
      {"--fsdp \"full_shard auto_wrap\" --fsdp_transformer_layer_cls_to_wrap LLaMADecoderLayer", "use LlamaDecoderLayer"},
      {"--fsdp_config '{\"backward_prefetch\": \"backward_pre\"}'", "--fsdp_config has no effect without --fsdp"},
      {"--warmup_ratio 0.1 --warmup_steps 10", "both set the warmup; give only one"},
      {"--load_best_model_at_end --eval_strategy epoch --save_strategy steps", "--load_best_model_at_end requires the save and eval strategy to match"},
      {"--load_best_model_at_end --eval_strategy steps --eval_steps 30 --save_steps 50", "--save_steps to be a round multiple of --eval_steps"},
      {"--eval_data_path eval.json", "--eval_data_path is given but --eval_strategy is 'no'"},
      {"--save_strategy best --eval_strategy steps --eval_steps 5", "--save_strategy best needs --metric_for_best_model"},
      {"--metric_for_best_model accuracy --eval_strategy steps --eval_steps 5",
       "--metric_for_best_model accuracy: evaluation logs no eval_accuracy; use one of loss, perplexity, runtime, "
       "samples_per_second, steps_per_second, entropy, mean_token_accuracy, num_tokens (eval_ prefix optional)"},
      {"--metric_for_best_model loss", "--metric_for_best_model is read from the evaluations of --eval_strategy steps or epoch"},
      {"--load_best_model_at_end", "(--load_best_model_at_end tracks loss); set --eval_strategy"},
      {"--eval_delay 3", "--eval_delay 3 has no effect with --eval_strategy no"},
      {"--gradient_checkpointing_kwargs '{\"use_reentrant\": false}'", "has no effect without --gradient_checkpointing True"},
      {"--gradient_checkpointing --gradient_checkpointing_kwargs '{\"preserve_rng_state\": false}'",
       "key 'preserve_rng_state' is not supported"},
      {"--gradient_checkpointing --gradient_checkpointing_kwargs '[1]'", "must be a JSON object"},
      {"--average_tokens_across_devices False", "--average_tokens_across_devices False (each rank's own token mean"},
      {"--dataset_num_proc 0", "--dataset_num_proc must be positive"},
      // Refused when parsing, not after the communicators start (they used to be trainer checks).
      {"--eval_strategy epoch", "--eval_strategy epoch needs --eval_data_path"},
      {"--eval_on_start True", "--eval_on_start True needs --eval_data_path"},
      {"--lr_scheduler_kwargs '{\"num_cycle\": 2}'", "--lr_scheduler_kwargs key 'num_cycle' is not an argument of the linear schedule"},
      // A key another schedule takes is a TypeError in transformers, not ignored.
      {"--lr_scheduler_type cosine --lr_scheduler_kwargs '{\"min_lr\": 1e-4}'", "'min_lr' is not an argument of the cosine schedule (transformers would raise TypeError); it takes num_cycles"},
      {"--lr_scheduler_type constant --lr_scheduler_kwargs '{\"power\": 2}'", "it takes none"},
      {"--lr_scheduler_type cosine_with_min_lr", "one of min_lr or min_lr_rate must be set"},
      {"--lr_scheduler_type warmup_stable_decay", "needs num_decay_steps in --lr_scheduler_kwargs"},
      {"--lr_scheduler_type reduce_lr_on_plateau", "reduce_lr_on_plateau requires an eval strategy"},
      {"--lr_scheduler_type reduce_lr_on_plateau --warmup_ratio 0.1 --eval_strategy steps --eval_steps 5",
       "reduce_lr_on_plateau has no warmup"},
      {"--lr_scheduler_type reduce_lr_on_plateau --eval_strategy steps --eval_steps 5 --lr_scheduler_kwargs "
       "'{\"factor\": 1.5}'", "factor should be < 1.0"},
      {"--lr_scheduler_type reduce_lr_on_plateau --eval_strategy steps --eval_steps 5 --lr_scheduler_kwargs "
       "'{\"num_cycles\": 1}'", "'num_cycles' is not an argument of the reduce_lr_on_plateau schedule"},
      {"--lr_scheduler_type warmup_stable_decay --lr_scheduler_kwargs '{\"num_decay_steps\": 10, \"decay_type\": \"step\"}'",
       "unknown decay type 'step'"},
      {"--lr_scheduler_type warmup_stable_decay --lr_scheduler_kwargs '{\"num_decay_steps\": 2.5}'", "is a step count"},
      {"--lr_scheduler_type cosine_warmup_with_min_lr --lr_scheduler_kwargs '{\"warmup_lr_rate\": 0.1}'",
       "cosine_warmup_with_min_lr: one of min_lr or min_lr_rate must be set"},
      {"--do_eval True", "would never evaluate"},
      {"--packing --group_by_length", "--packing and --group_by_length contradict"},
      {"--packing --packing_strategy bfd_split", "bfd_split, which splits long examples"},
      {"--packing --packing_strategy greedy", "--packing_strategy 'greedy' is not"},
      {"--logging_steps 2.5", "--logging_steps must be an integer if bigger than 1"},
  });
}

// transformers 5's train_sampling_strategy: random (shuffled), sequential (the data's order),
// group_by_length (the 4.x flag), batch_rebalance (not with the 4.x flag). TRL's eval_packing: unset = packing.
TEST(TrainArgs, SamplingStrategyAndEvalPacking) {
  EXPECT_TRUE(trainer_options(parse_train_args(shell_split(kRequired))).shuffle);
  auto seq = trainer_options(parse_train_args(shell_split(kRequired + "--train_sampling_strategy sequential")));
  EXPECT_FALSE(seq.shuffle);
  EXPECT_FALSE(seq.group_by_length);
  auto grouped = trainer_options(parse_train_args(shell_split(kRequired + "--train_sampling_strategy group_by_length")));
  EXPECT_TRUE(grouped.shuffle);
  EXPECT_TRUE(grouped.group_by_length);
  EXPECT_FALSE(grouped.batch_rebalance);
  auto rebalanced = trainer_options(parse_train_args(shell_split(kRequired + "--train_sampling_strategy batch_rebalance")));
  EXPECT_TRUE(rebalanced.batch_rebalance);
  EXPECT_FALSE(rebalanced.group_by_length);
  EXPECT_FALSE(trainer_options(parse_train_args(shell_split(kRequired))).eval_packing.has_value());
  EXPECT_EQ(trainer_options(parse_train_args(shell_split(kRequired + "--eval_packing False"))).eval_packing,
            std::optional<bool>(false));
  expect_usage_errors({
      {"--train_sampling_strategy batch_rebalance --group_by_length True", "are two samplers; choose one"},
      {"--train_sampling_strategy shuffled", "'shuffled' is not a strategy"},
      {"--train_sampling_strategy group_by_length --packing", "--packing and --group_by_length contradict"},
  });
}

// HF's best-model tracking: load_best_model_at_end tracks loss unless told otherwise; the direction
// follows the name (greater_is_better False for a *loss, True otherwise); save_strategy best is
// accepted with a metric; the eval_ prefix is optional, as in HF.
TEST(TrainArgs, BestModelTrackingDefaultsAsTransformers) {
  const std::string eval = "--eval_strategy steps --eval_steps 10 --eval_data_path e.json ";
  TrainArgs a = parse_train_args(shell_split(kRequired + eval + "--save_steps 20 --load_best_model_at_end"));
  EXPECT_EQ(a.metric_for_best_model, "loss");
  EXPECT_EQ(a.greater_is_better, std::optional<bool>(false));
  a = parse_train_args(shell_split(kRequired + eval + "--save_strategy best --metric_for_best_model eval_perplexity"));
  EXPECT_EQ(a.greater_is_better, std::optional<bool>(true));
  a = parse_train_args(shell_split(kRequired + eval + "--metric_for_best_model eval_loss --greater_is_better True"));
  EXPECT_EQ(a.greater_is_better, std::optional<bool>(true));
  // reduce_lr_on_plateau steps on the tracked metric: loss unless told otherwise, as in HF.
  a = parse_train_args(shell_split(kRequired + eval + "--lr_scheduler_type reduce_lr_on_plateau"));
  EXPECT_EQ(a.metric_for_best_model, "loss");
  a = parse_train_args(shell_split(kRequired + "--save_steps 20"));
  EXPECT_EQ(a.metric_for_best_model, "");
  EXPECT_FALSE(a.greater_is_better);
}

// Fields of HF TrainingArguments / TRL's configs that alpaca-train does not take say why and what
// to do instead (not only "unknown flag"), on the command line and in a --config file; TRL's
// names that are ours are taken (chat_template_path, dataset_num_proc, gradient_checkpointing_kwargs).
TEST(TrainArgs, HfAndTrlFieldsWeDoNotTakeSayWhy) {
  expect_usage_errors({
      {"--push_to_hub", "unknown flag --push_to_hub: transformers/TRL take it, alpaca-train does not: alpaca-train never uploads"},
      {"--dataset_name trl-lib/Capybara", "reads local files only"},
      {"--torch_dtype bfloat16", "--bf16 True or --fp16 True picks the compute dtype"},
      {"--attn_implementation flash_attention_2", "attention is alpaca-train's own"},
      {"--label_smoothing_factor -0.1", "--label_smoothing_factor must be in [0, 1)"},
      {"--loss_type focal", "--loss_type 'focal' is not a loss; give nll"},
      {"--include_num_input_tokens_seen some", "'some' is not one of no, all, non_padding"},
      {"--loss_type dft --label_smoothing_factor 0.1", "TRL applies label smoothing only to the nll loss"},
      {"--learnig_rate 1", "did you mean --learning_rate?"},
      {"--pad_to_multiple_of 0", "--pad_to_multiple_of must be a positive number of tokens"},
      {"--torch_empty_cache_steps -1", "--torch_empty_cache_steps must be a positive number of steps"},
  });
  {  // TRL's pad_to_multiple_of and HF's torch_empty_cache_steps reach the trainer; None = off.
    const TrainArgs t = parse_train_args(shell_split(kRequired + "--pad_to_multiple_of 64 --torch_empty_cache_steps 5"));
    EXPECT_EQ(trainer_options(t).pad_to_multiple_of, 64);
    EXPECT_EQ(trainer_options(t).torch_empty_cache_steps, 5);
    const TrainArgs n = parse_train_args(shell_split(kRequired + "--pad_to_multiple_of None --torch_empty_cache_steps None"));
    EXPECT_EQ(trainer_options(n).pad_to_multiple_of, 1);
    EXPECT_EQ(trainer_options(n).torch_empty_cache_steps, 0);
  }
  TrainArgs a = parse_train_args(shell_split(kRequired + "--chat_template_path t.jinja --dataset_num_proc 3 "
                                             "--gradient_checkpointing --gradient_checkpointing_kwargs "
                                             "'{\"use_reentrant\": false}' --eval_strategy steps --eval_steps 5 "
                                             "--eval_delay 10 --eval_data_path e.json"));
  EXPECT_EQ(a.chat_template, "t.jinja");
  EXPECT_EQ(a.dataset_num_proc, std::optional<int64_t>(3));
  EXPECT_DOUBLE_EQ(a.eval_delay, 10);
}

// --optim adafactor: transformers' Adafactor; the AdamW flags it does not use are said to be unused.
TEST(TrainArgs, AdafactorTakesNoAdamFlags) {
  const TrainArgs a = parse_train_args(shell_split(kRequired + "--optim adafactor --weight_decay 0.1"));
  EXPECT_TRUE(trainer_options(a).adamw.adafactor);
  EXPECT_EQ(trainer_options(a).adamw.bnb_bits, 0);
  EXPECT_DOUBLE_EQ(trainer_options(a).adamw.weight_decay, 0.1);
  EXPECT_TRUE(a.notes.empty());
  const TrainArgs b = parse_train_args(shell_split(kRequired + "--optim adafactor --adam_beta2 0.95"));
  bool noted = false;
  for (const auto& n : b.notes) noted = noted || n.find("--adam_beta2 and --adam_epsilon are not used") != std::string::npos;
  EXPECT_TRUE(noted);
  EXPECT_FALSE(trainer_options(parse_train_args(shell_split(kRequired + "--optim adamw_8bit"))).adamw.adafactor);
}

// --optim lion_*: bitsandbytes' Lion (8 bits where the name says so); the epsilon it does not use is
// said to be unused.
TEST(TrainArgs, LionIsBitsandbytesLion) {
  for (const auto& [name, bits] : std::vector<std::pair<std::string, int>>{
           {"lion_8bit", 8}, {"paged_lion_8bit", 8}, {"lion_32bit", 32}, {"paged_lion_32bit", 32}}) {
    const TrainArgs a = parse_train_args(shell_split(kRequired + "--optim " + name));
    EXPECT_TRUE(trainer_options(a).adamw.lion) << name;
    EXPECT_EQ(trainer_options(a).adamw.bnb_bits, bits) << name;
  }
  EXPECT_FALSE(trainer_options(parse_train_args(shell_split(kRequired + "--optim adamw_8bit"))).adamw.lion);
  const TrainArgs e = parse_train_args(shell_split(kRequired + "--optim lion_8bit --adam_epsilon 1e-6"));
  bool noted = false;
  for (const auto& n : e.notes) noted = noted || n.find("--adam_epsilon is not used") != std::string::npos;
  EXPECT_TRUE(noted);
}

// HF's use_cpu: a real flag (the CPU where a GPU is visible), off by default as in HF.
TEST(TrainArgs, UseCpuIsHfs) {
  EXPECT_FALSE(trainer_options(parse_train_args(shell_split(kRequired))).use_cpu);
  EXPECT_TRUE(trainer_options(parse_train_args(shell_split(kRequired + "--use_cpu True"))).use_cpu);
  EXPECT_TRUE(trainer_options(parse_train_args(shell_split(kRequired + "--use_cpu"))).use_cpu);
}

TEST(TrainArgs, UnsupportedValuesAreRefusedNotIgnored) {
  expect_usage_errors({
      {"--optim sgd", "--optim 'sgd' is not one of: adamw_torch, adamw_torch_fused"},
      {"--report_to wandb", "--report_to 'wandb' is not available"},
      {"--dataloader_num_workers 4", "--dataloader_num_workers 4 is not supported"},
      {"--remove_unused_columns False", "--remove_unused_columns False is not supported"},
      {"--log_level verbose", "--log_level 'verbose' is not a level"},
      {"--resume_from_checkpoint /no/such/checkpoint-5", "no such directory"},
  });
  EXPECT_USAGE_ERROR("--data_path d.json", "--model_name_or_path is required");
  EXPECT_USAGE_ERROR("--model_name_or_path m", "--data_path is required");
}

TEST(TrainArgs, LoraFlagsHaveTrlNamesAndDefaults) {
  TrainArgs a = parse_train_args(shell_split(kRequired + "--use_peft"));
  EXPECT_TRUE(a.use_peft);
  EXPECT_EQ(a.lora_r, 16);
  EXPECT_EQ(a.lora_alpha, 32);
  EXPECT_DOUBLE_EQ(a.lora_dropout, 0.05);
  EXPECT_EQ(a.lora_target_modules, "");
  EXPECT_FALSE(a.use_rslora);
  a = parse_train_args(shell_split(kRequired + "--use_peft True --lora_r 8 --lora_target_modules 'q_proj,k_proj' --use_rslora"));
  EXPECT_EQ(a.lora_r, 8);
  EXPECT_EQ(a.lora_target_modules, "q_proj,k_proj");
  EXPECT_TRUE(a.use_rslora);
  expect_usage_errors({
      {"--use_peft --lora_r 0", "--lora_r must be > 0"},
      {"--use_peft --lora_r -4", "--lora_r must be > 0"},
      {"--use_peft --lora_dropout 1", "--lora_dropout must be in [0, 1)"},
      {"--lora_r 8", "--lora_r only acts on a LoRA run; add --use_peft True"},
      {"--use_peft --lora_target_modules 'q_proj lm_head' --lora_dropout 0.1", "dropout on lm_head's LoRA branch is not supported"},
      // A 4-bit base is held per decoder-layer unit; a whole-model unit would silently stay full precision.
      {"--use_peft --load_in_4bit --fsdp full_shard", "needs one FSDP unit per decoder layer: add auto_wrap to --fsdp (e.g. --fsdp \"full_shard auto_wrap\")"},
      {"--use_peft --load_in_4bit --fsdp no_shard", "add auto_wrap to --fsdp"},
  });
  EXPECT_TRUE(parse_train_args(shell_split(kRequired + "--use_peft --lora_target_modules 'q_proj,lm_head' --lora_dropout 0")).use_peft);
  EXPECT_TRUE(parse_train_args(shell_split(kRequired + "--use_peft --load_in_4bit --fsdp 'full_shard auto_wrap'")).load_in_4bit);
}

TEST(TrainArgs, DerivedValues) {
  TrainArgs a = parse_train_args(shell_split(kRequired + "--fsdp --eval_strategy steps --logging_steps 10 --eval_data_path e.json "
                                                         "--save_max_shard_size 500MiB --resume_from_checkpoint true "
                                                         "--lr_scheduler_type cosine --lr_scheduler_kwargs '{\"num_cycles\": 2}' --output_dir o"));
  EXPECT_EQ(a.fsdp_words, "full_shard");  // bare --fsdp = full_shard, as HF
  EXPECT_EQ(a.fsdp_policy.strategy, fsdp::ShardingStrategy::kFullShard);
  ASSERT_TRUE(a.eval_steps.has_value());
  EXPECT_DOUBLE_EQ(*a.eval_steps, 10);  // defaults to logging_steps
  EXPECT_TRUE(a.do_eval);
  EXPECT_EQ(a.save_max_shard_bytes, 500LL * 1024 * 1024);
  EXPECT_EQ(trainer_options(a).resume.kind, train::ResumeFrom::Kind::kLatest);
  // auto, in any case: the newest checkpoint when there is one, else a fresh start
  EXPECT_EQ(trainer_options(parse_train_args(shell_split(kRequired + "--resume_from_checkpoint Auto"))).resume.kind,
            train::ResumeFrom::Kind::kLatestIfAny);
  EXPECT_EQ(a.lr_scheduler_kwargs_json, R"({"num_cycles":2})");
  EXPECT_EQ(a.logging_dir, "");  // trainer_options resolves it (output_dir/runs/<date>_<host>, as HF)
  EXPECT_EQ(a.run_name, "o");
  EXPECT_EQ(parse_train_args(shell_split(kRequired)).save_max_shard_bytes, 5'000'000'000LL);
  EXPECT_EQ(train::resolve_interval_steps(0.1, 95), 10);  // ratios round up, as HF
  EXPECT_EQ(train::resolve_interval_steps(500, 95), 500);
  // The training flag reads a size as the subcommands' --save_max_shard_size does (one parser,
  // text::parse_byte_size; tests/io/test_hf_checkpoint.cpp checks it against transformers).
  const std::vector<std::pair<std::string, long long>> sizes = {
      {"1000B", 1000}, {"8Gb", 1'000'000'000}, {"5gib", 5368709120}, {"1.5GB", 1'500'000'000}, {"20kb", 2500}};
  for (const auto& [size, bytes] : sizes)
    EXPECT_EQ(parse_train_args(shell_split(kRequired + "--save_max_shard_size " + size)).save_max_shard_bytes, bytes)
        << size;
  expect_usage_errors({
      {"--save_max_shard_size 5XB", "unknown unit 'XB'"},
      {"--save_max_shard_size 1.2.3GB", "is not a size"},
      {"--save_max_shard_size 0MB", "must be more than 0 bytes"},
      {"--lr_scheduler_kwargs '{num_cycles: 2}'", "--lr_scheduler_kwargs is not valid JSON"},
  });
}

class ConfigFile : public ::testing::Test {
 protected:
  std::string write(const std::string& text, const std::string& ext = ".json") {
    auto p = dir_.path() / ("config" + std::to_string(n_++) + ext);
    std::ofstream(p) << text;
    return p.string();
  }
  testing::TempDir dir_{"cli_config"};
  int n_ = 0;
};

TEST_F(ConfigFile, CommandLineWinsOverFileAndFileOverDefaults) {
  std::string cfg = write(R"({
    "model_name_or_path": "/models/from-config",
    "data_path": "cfg.json",
    "learning_rate": 1e-4,
    "num_train_epochs": 5,
    "bf16": true,
    "fsdp": ["full_shard", "auto_wrap"],
    "save_total_limit": null,
    "evaluation_strategy": "no",
    "tf32": "True"
  })");
  TrainArgs a = parse_train_args(shell_split("--config " + cfg + " --learning_rate 3e-5 --data_path cli.json"));
  EXPECT_EQ(a.config_path, cfg);
  EXPECT_DOUBLE_EQ(a.learning_rate, 3e-5);  // command line over file
  EXPECT_EQ(a.data_path, "cli.json");
  EXPECT_DOUBLE_EQ(a.num_train_epochs, 5);  // file over default
  EXPECT_EQ(a.model_name_or_path, "/models/from-config");
  EXPECT_TRUE(a.bf16);
  EXPECT_TRUE(a.tf32.value_or(false));
  EXPECT_FALSE(a.save_total_limit.has_value());
  EXPECT_EQ(a.fsdp_words, "full_shard auto_wrap");
  EXPECT_DOUBLE_EQ(a.weight_decay, 0.0);  // default
  EXPECT_TRUE(a.is_set("num_train_epochs"));
  EXPECT_FALSE(a.is_set("weight_decay"));
  // The flag order does not matter: --config after the flags still loses to them.
  TrainArgs b = parse_train_args(shell_split("--learning_rate 3e-5 --config " + cfg));
  EXPECT_DOUBLE_EQ(b.learning_rate, 3e-5);
}

// A training_args.json reused as --config with one setting changed on the command line: what the
// change makes moot (save_steps under --save_strategy no, the LoRA flags under --use_peft False, ...)
// is ignored, as HF ignores it, not refused as if the user had typed it. The same contradiction
// inside the file, or typed on the command line, is still an error.
TEST_F(ConfigFile, OverridesMootTheFilesDependentValues) {
  const std::string run = write(R"({"model_name_or_path": "m", "data_path": "d", "save_strategy": "steps",
    "save_steps": 2, "eval_strategy": "steps", "eval_steps": 1, "eval_delay": 3, "eval_data_path": "e.json",
    "use_peft": true, "lora_r": 4, "load_in_4bit": true, "bnb_4bit_quant_type": "fp4",
    "gradient_checkpointing": true, "gradient_checkpointing_kwargs": "{\"use_reentrant\": false}"})");
  const TrainArgs a = parse_train_args(shell_split("--config " + run + " --save_strategy no --eval_strategy no "
                                                   "--use_peft False --load_in_4bit False --gradient_checkpointing False"));
  EXPECT_EQ(a.save_strategy, "no");
  EXPECT_FALSE(a.use_peft);
  EXPECT_USAGE_ERROR("--config " + run + " --save_strategy no --save_steps 5",
                     "--save_steps 5.0 has no effect with --save_strategy no");
  EXPECT_USAGE_ERROR("--config " + run + " --use_peft False --lora_r 8", "--lora_r only acts on a LoRA run");
  const std::string contradictory = write(R"({"model_name_or_path": "m", "data_path": "d", "save_strategy": "no",
    "save_steps": 7})");
  EXPECT_USAGE_ERROR("--config " + contradictory, "--save_steps 7.0 has no effect with --save_strategy no");
}

TEST_F(ConfigFile, BadFilesNameTheFileAndKey) {
  std::string typo = write(R"({"model_name_or_path": "m", "data_path": "d", "learnig_rate": 1})");
  EXPECT_USAGE_ERROR("--config " + typo, "config file " + typo + ": unknown key 'learnig_rate'; did you mean 'learning_rate'?");
  std::string hub = write(R"({"model_name_or_path": "m", "data_path": "d", "hub_model_id": "me/model"})");
  EXPECT_USAGE_ERROR("--config " + hub, "config file " + hub + ": unknown key 'hub_model_id': transformers/TRL take it, "
                                        "alpaca-train does not: alpaca-train never uploads");
  std::string bad_value = write(R"({"model_name_or_path": "m", "data_path": "d", "bf16": "sometimes"})");
  EXPECT_USAGE_ERROR("--config " + bad_value, "config file " + bad_value + ": --bf16 expects a boolean");
  std::string not_json = write("{\"bf16\": tru");
  EXPECT_USAGE_ERROR("--config " + not_json, "is not valid JSON");
  std::string a_list = write("[1, 2]");
  EXPECT_USAGE_ERROR("--config " + a_list, "must hold a JSON object");
  EXPECT_USAGE_ERROR("--config /no/such/config.json", "--config /no/such/config.json: cannot open the file");
}

// TRL's YAML recipes (`trl sft --config`), as PyYAML's safe_load reads them: YAML 1.1 booleans
// (yes/on), ~ for None, quoted "no" a string, flow and block lists and mappings, anchors; a plain
// 2e-5 (a string to PyYAML, converted by argparse) a number; HF/TRL keys set to what asks for
// nothing (push_to_hub: false, dtype: float32) dropped, others refused with the reason.
TEST_F(ConfigFile, YamlRecipesReadAsTrlDoes) {
  const std::string cfg = write(R"(# a TRL recipe
model_name_or_path: /models/smollm2
data_path: data.jsonl
learning_rate: 2e-5
weight_decay: 1.0e-2
num_train_epochs: 1
packing: true
per_device_train_batch_size: 2
gradient_accumulation_steps: 0x8
gradient_checkpointing: yes
gradient_checkpointing_kwargs:
  use_reentrant: false
eos_token: <|im_end|>
eval_strategy: "no"
lr_scheduler_type: cosine_with_min_lr
lr_scheduler_kwargs: {min_lr_rate: 0.1}
fsdp: [full_shard, auto_wrap]
lora_target_modules: &targets
- q_proj
- v_proj
report_to: none
push_to_hub: false
dtype: float32
trust_remote_code: off
save_total_limit: ~
output_dir: out
)", ".yaml");
  TrainArgs a = parse_train_args(shell_split("--config " + cfg + " --use_peft"));
  EXPECT_EQ(a.model_name_or_path, "/models/smollm2");
  EXPECT_DOUBLE_EQ(a.learning_rate, 2e-5);
  EXPECT_DOUBLE_EQ(a.weight_decay, 0.01);
  EXPECT_TRUE(a.packing);
  EXPECT_EQ(a.gradient_accumulation_steps, 8);
  EXPECT_TRUE(a.gradient_checkpointing);
  EXPECT_EQ(nlohmann::json::parse(a.gradient_checkpointing_kwargs), nlohmann::json({{"use_reentrant", false}}));
  EXPECT_EQ(a.eos_token, "<|im_end|>");
  EXPECT_EQ(a.eval_strategy, "no");
  EXPECT_EQ(nlohmann::json::parse(a.lr_scheduler_kwargs), nlohmann::json({{"min_lr_rate", 0.1}}));
  EXPECT_EQ(a.fsdp_words, "full_shard auto_wrap");
  EXPECT_EQ(a.lora_target_modules, "q_proj v_proj");
  EXPECT_FALSE(a.save_total_limit.has_value());
  EXPECT_EQ(a.output_dir, "out");

  const std::string head = "model_name_or_path: m\ndata_path: d\n";
  EXPECT_USAGE_ERROR("--config " + write(head + "dtype: bfloat16\n", ".yml"),
                     "unknown key 'dtype': transformers/TRL take it, alpaca-train does not");
  EXPECT_USAGE_ERROR("--config " + write(head + "learning_rate: [1\n", ".yaml"), "is not valid YAML: ");
  EXPECT_USAGE_ERROR("--config " + write(head + "---\nmax_steps: 3\n", ".yaml"), "holds several YAML documents");
  EXPECT_USAGE_ERROR("--config " + write(head + "max_steps: 3\nmax_steps: 4\n", ".yaml"), "key 'max_steps' is given twice");
  EXPECT_USAGE_ERROR("--config " + write("- max_steps\n", ".yaml"), "must hold a YAML mapping of flag_name: value");
}

// A whole dumped SFTConfig (TRL 1.16 / transformers 5.23: SFTConfig(output_dir="o", bf16=False).to_dict(),
// 135 fields, saved as tests/fixtures/configs/trl_sftconfig_defaults.json) is a valid --config: the
// fields we take keep TRL's values, the ones we do not take hold values that ask for nothing (nulls,
// the default AcceleratorConfig, the masked hub token), activation_checkpointing is
// gradient_checkpointing's transformers 5 name, and report_to [] is none.
TEST_F(ConfigFile, AWholeDumpedSftConfigIsAValidConfig) {
  const std::string cfg = (testing::source_dir() / "tests/fixtures/configs/trl_sftconfig_defaults.json").string();
  TrainArgs a = parse_train_args(shell_split("--config " + cfg + " --model_name_or_path m --data_path d"));
  EXPECT_DOUBLE_EQ(a.learning_rate, 2e-5);
  EXPECT_TRUE(a.gradient_checkpointing);
  EXPECT_EQ(a.model_max_length, 1024);
  EXPECT_EQ(a.optim, "adamw_torch_fused");
  EXPECT_EQ(a.report_to, "none");
  EXPECT_TRUE(a.fsdp.empty());
  EXPECT_TRUE(a.deepspeed.empty());
  EXPECT_EQ(a.output_dir, "o");
  const std::string head = "model_name_or_path: m\ndata_path: d\n";
  a = parse_train_args(shell_split("--config " + write(head + "activation_checkpointing: true\n", ".yaml")));
  EXPECT_TRUE(a.gradient_checkpointing);
  a = parse_train_args(shell_split("--config " + write(head + "activation_checkpointing: null\n", ".yaml")));
  EXPECT_FALSE(a.gradient_checkpointing);
  // TRL's max_length None (no truncation) is not our default: an error, not 512 in silence.
  EXPECT_USAGE_ERROR("--config " + write(head + "max_length: null\n", ".yaml"), "model_max_length");
  EXPECT_USAGE_ERROR("--config " + write(head + "activation_checkpointing: true\ngradient_checkpointing: false\n", ".yaml"),
                     "'gradient_checkpointing' is given twice (once as an alias) with different values");
  EXPECT_USAGE_ERROR("--config " + write(head + "activation_checkpointing: true\nactivation_checkpointing_kwargs: "
                                                "{every_n_layers: 2}\n", ".yaml"),
                     "every_n_layers 2 is not implemented");
  a = parse_train_args(shell_split("--config " + write(head + "loss_type: dft\nlabel_smoothing_factor: 0\n", ".yaml")));
  EXPECT_EQ(a.loss_type, "dft");
  a = parse_train_args(shell_split("--config " + write(head + "shuffle_dataset: true\n", ".yaml")));
  EXPECT_TRUE(a.shuffle_dataset);
  EXPECT_USAGE_ERROR("--config " + write(head + "shuffle_dataset: true\nseed: -1\n", ".yaml"), "non-negative --seed");
  EXPECT_USAGE_ERROR("--config " + write(head + "save_on_each_node: true\n", ".yaml"), "save_on_each_node");
}

// The YAML reader against PyYAML's safe_load (the .venv's, what TRL's parser calls) on YAML 1.1's
// corners: every scalar kind the resolver knows, quoting, block and flow collections, anchors and
// aliases, comments, multi-line strings. The one difference we make on purpose (a plain 2e-5 is a
// number, not a string) is left out here and tested above.
TEST_F(ConfigFile, YamlReaderMatchesPyYamlSafeLoad) {
  const std::string yaml = R"(# comment
bools: [yes, No, TRUE, off, On, y, n]
nulls: [~, null, Null, "null"]
empty:
ints: [0, -7, +12, 1_000, 0x1F, 0b101, 017, 1:30, 1:09, -1:30, 09]
floats: [1.5, -.5, 1.0e+3, 6.8523015e+5, 1:30.5, 1_0.5, 3.]
strings: ['yes', "no", 2001-12-14, 1.2.3, x1, "0x10", +, ':']
nested: {a: [1, {b: c}], d: {}}
anchor: &a {k: v, n: 1}
alias: *a
block: |
  line one
  line two
folded: >-
  one
  two
key with spaces: value with spaces
)";
  const std::string path = write(yaml, ".yaml");
  const nlohmann::json ours = alpaca::cli::parse_yaml_config(yaml, path);
  std::string out;
  ASSERT_EQ(testing::run_command(testing::python() + " -c \"import json, sys, yaml; print(json.dumps(yaml.safe_load("
                                 "open(sys.argv[1])), default=str))\" " + path, &out), 0) << out;
  const nlohmann::json want = nlohmann::json::parse(out);
  for (const auto& [key, value] : want.items()) EXPECT_EQ(ours[key], value) << key;
  EXPECT_EQ(ours.size(), want.size());
  // Infinities (which JSON cannot carry back from Python): .inf, -.Inf.
  const nlohmann::json inf = alpaca::cli::parse_yaml_config("a: [.inf, -.Inf]", path);
  EXPECT_EQ(inf["a"][0].get<double>(), INFINITY);
  EXPECT_EQ(inf["a"][1].get<double>(), -INFINITY);
}

TEST_F(ConfigFile, JsonDumpReadsBackAsConfig) {
  TrainArgs a = parse_train_args(shell_split(kAlpacaFsdpCommand));
  std::string cfg = write(train_args_to_json(a));
  TrainArgs b = parse_train_args({"--config", cfg});
  for (const auto& f : train_flags()) {
    EXPECT_EQ(flag_value_text(a, f.name), flag_value_text(b, f.name)) << f.name;
  }
  EXPECT_EQ(a.fsdp_words, b.fsdp_words);
  EXPECT_EQ(a.fsdp_policy, b.fsdp_policy);
  EXPECT_EQ(a.fsdp_config_json, b.fsdp_config_json);
}

TEST(TrainArgs, HelpListsEveryFlagUnderItsGroup) {
  std::string help = train_help();
  for (const auto& f : train_flags()) {
    size_t at = help.find("\n  --" + f.name + " ");
    ASSERT_NE(at, std::string::npos) << "--help misses --" << f.name;
    // The nearest group title above the flag is its own group.
    size_t group_at = help.rfind("\n" + group_title(f.group) + ":\n", at);
    ASSERT_NE(group_at, std::string::npos) << f.name;
    for (const auto& other : train_flags()) {
      if (other.group == f.group) continue;
      size_t other_at = help.rfind("\n" + group_title(other.group) + ":\n", at);
      EXPECT_TRUE(other_at == std::string::npos || other_at < group_at) << f.name << " is listed under " << group_title(other.group);
    }
    EXPECT_NE(help.find(f.help.substr(0, 20)), std::string::npos) << "--help misses the text of --" << f.name;
  }
  EXPECT_NE(help.find("--config FILE"), std::string::npos);
  EXPECT_NE(help.find("Alias: --evaluation_strategy"), std::string::npos);
  EXPECT_NE(help.find("Aliases:"), std::string::npos);
  EXPECT_NE(help.find("--max_seq_length."), std::string::npos);
}

// TRL's names of the sequence length (SFTConfig.max_length; max_seq_length before TRL 0.20), on
// the command line, set --model_max_length.
TEST(TrainArgs, TrlSequenceLengthNamesAreAliases) {
  TrainArgs a = parse_train_args(shell_split(kRequired + "--max_length 1024"));
  EXPECT_EQ(a.model_max_length, 1024);
  EXPECT_TRUE(a.is_set("model_max_length"));
  EXPECT_EQ(parse_train_args(shell_split(kRequired + "--max-seq-length 256")).model_max_length, 256);
  EXPECT_EQ(parse_train_args(shell_split(kRequired)).model_max_length, 512);  // train.py's default, not TRL's 1024
  expect_usage_errors(
      {{"--max_length 64 --model_max_length 128",
        "--max_length and --model_max_length are the same flag; give only --model_max_length"},
       {"--max_seq_length 64 --max_length 128", "--max_length and --max_seq_length are the same flag"}});
}

TEST(TrainArgs, EffectiveArgsListingMarksWhatWasSet) {
  TrainArgs a = parse_train_args(shell_split(kAlpacaFsdpCommand));
  std::string text = format_train_args(a);
  EXPECT_NE(text.find("* learning_rate = 2e-05"), std::string::npos) << text;
  EXPECT_NE(text.find("  seed = 42"), std::string::npos) << text;
  EXPECT_NE(text.find("fsdp options = full_shard auto_wrap"), std::string::npos) << text;
  for (const auto& f : train_flags()) EXPECT_NE(text.find(" " + f.name + " = "), std::string::npos) << f.name;
}

TEST(TrainArgs, ReportToTensorboardAndAll) {
  EXPECT_EQ(parse_train_args(shell_split(kRequired + "--report_to tensorboard")).report_to, "tensorboard");
  EXPECT_EQ(parse_train_args(shell_split(kRequired + "--report_to 'jsonl tensorboard'")).report_to, "jsonl tensorboard");
  EXPECT_EQ(parse_train_args(shell_split(kRequired + "--report_to all")).report_to, "all");
  expect_usage_errors({
      {"--report_to 'none tensorboard'", "--report_to none cannot be combined"},
      {"--report_to mlflow", "--report_to 'mlflow' is not available"},
  });

  // trainer_options: HF's default directory, a given --logging_dir, the args text.
  const train::TrainerOptions d = trainer_options(parse_train_args(shell_split(kRequired + "--report_to all --output_dir o")));
  EXPECT_TRUE(d.report_jsonl);
  EXPECT_TRUE(d.report_tensorboard);
  EXPECT_FALSE(d.tensorboard_dir_given);
  EXPECT_EQ(d.tensorboard_dir.parent_path(), std::filesystem::path("o/runs")) << d.tensorboard_dir;
  EXPECT_EQ(d.logging_dir, std::filesystem::path("o"));  // metrics.jsonl stays in output_dir
  EXPECT_NE(d.args_json.find("\"logging_dir\": \"" + d.tensorboard_dir.string() + "\""), std::string::npos) << d.args_json;
  const train::TrainerOptions g =
      trainer_options(parse_train_args(shell_split(kRequired + "--report_to tensorboard --logging_dir tb --output_dir o")));
  EXPECT_FALSE(g.report_jsonl);
  EXPECT_TRUE(g.tensorboard_dir_given);
  EXPECT_EQ(g.tensorboard_dir, std::filesystem::path("tb"));
  EXPECT_FALSE(trainer_options(parse_train_args(shell_split(kRequired + "--report_to jsonl"))).report_tensorboard);
}

}  // namespace
}  // namespace alpaca::cli::test_train_args

namespace alpaca::cli::test_train_args {
namespace {

// One parser for the FSDP flags: the same --fsdp value gives the same verdict (and, when accepted,
// the same policy) through the CLI (parse_train_args -> validate_train_args) and through the
// engine's builder (fsdp::build_fsdp_policy), which the trainer then uses as is.
struct FsdpCase {
  const char* fsdp;  // the --fsdp value; nullptr = no --fsdp flag, "<bare>" = --fsdp with no value
  bool bf16;
  const char* error;  // nullptr = accepted; else a part of the message both paths give
  fsdp::ShardingStrategy strategy;
  bool auto_wrap, offload;
  const char* words;  // the canonical words the CLI records
};

TEST(FsdpFlags, SameVerdictAndPolicyThroughCliAndEngine) {
  using S = fsdp::ShardingStrategy;
  const FsdpCase cases[] = {
      {"full_shard auto_wrap", true, nullptr, S::kFullShard, true, false, "full_shard auto_wrap"},
      {"FULL_SHARD AUTO_WRAP", false, nullptr, S::kFullShard, true, false, "full_shard auto_wrap"},  // case
      {"auto_wrap full_shard", false, nullptr, S::kFullShard, true, false, "full_shard auto_wrap"},  // order
      {"full_shard,auto_wrap", false, nullptr, S::kFullShard, true, false, "full_shard auto_wrap"},  // commas
      {"full_shard full_shard auto_wrap", false, nullptr, S::kFullShard, true, false, "full_shard auto_wrap"},
      {"full_shard", false, nullptr, S::kFullShard, false, false, "full_shard"},  // one root unit
      {"shard_grad_op auto_wrap", true, nullptr, S::kShardGradOp, true, false, "shard_grad_op auto_wrap"},
      {"no_shard", false, nullptr, S::kNoShard, false, false, "no_shard"},
      {"hybrid_shard auto_wrap", false, nullptr, S::kHybridShard, true, false, "hybrid_shard auto_wrap"},
      {"full_shard auto_wrap offload", true, nullptr, S::kFullShard, true, true, "full_shard auto_wrap offload"},
      {"Offload Shard_Grad_Op", false, nullptr, S::kShardGradOp, false, true, "shard_grad_op offload"},
      {"hybrid_shard offload auto_wrap", false, nullptr, S::kHybridShard, true, true, "hybrid_shard auto_wrap offload"},
      {"no_shard offload", false, "nothing is sharded to offload", S::kNoShard, false, false, ""},
      {"offload", false, "--fsdp offload can't work on its own", S::kNoShard, false, false, ""},
      {"auto_wrap", false, nullptr, S::kFullShard, true, false, "auto_wrap"},  // accelerate: full_shard
      {"<bare>", false, nullptr, S::kFullShard, false, false, "full_shard"},    // HF: const=True
      {"True", false, nullptr, S::kFullShard, false, false, "full_shard"},
      {"false", false, nullptr, S::kNoShard, true, false, ""},
      {nullptr, true, nullptr, S::kNoShard, true, false, ""},  // no FSDP: a replica per rank, a unit per layer
      {"full_shard shard_grad_op", false, "names full_shard and shard_grad_op; choose one sharding strategy",
       S::kNoShard, false, false, ""},
      {"full_shard zero3", false, "--fsdp word 'zero3' is not one of", S::kNoShard, false, false, ""},
      {"full_shard auto_wrapp", false, "did you mean 'auto_wrap'?", S::kNoShard, false, false, ""},
      {"hybrid_shard_zero2", false, "hybrid_shard_zero2 is not implemented by the FSDP engine", S::kNoShard, false,
       false, ""},
  };
  dist::LaunchInfo launch;  // a node of 2 ranks in a job of 4: hybrid shard groups default to 2
  launch.world_size = 4;
  launch.local_world_size = 2;
  for (const FsdpCase& c : cases) {
    const std::string name = c.fsdp ? c.fsdp : "(no --fsdp)";
    SCOPED_TRACE("--fsdp " + name + (c.bf16 ? " --bf16" : ""));
    const bool bare = c.fsdp && std::string(c.fsdp) == "<bare>";
    std::string cmd = kRequired + (c.bf16 ? "--bf16 True " : "");
    if (bare) cmd += "--fsdp";
    else if (c.fsdp) cmd += "--fsdp '" + std::string(c.fsdp) + "'";

    fsdp::FsdpPolicyInputs in;
    in.fsdp = bare ? "true" : c.fsdp ? c.fsdp : "";
    in.mixed_precision = c.bf16 ? "bf16" : "no";
    in.local_world_size = launch.local_world_size;

    std::string cli_error, engine_error;
    TrainArgs a;
    fsdp::FsdpPolicy engine_policy;
    try {
      a = parse_train_args(shell_split(cmd), launch);
    } catch (const UsageError& e) {
      cli_error = e.message();
    }
    try {
      engine_policy = fsdp::build_fsdp_policy(in);
    } catch (const Error& e) {
      engine_error = e.message();
    }
    EXPECT_EQ(cli_error, engine_error);  // the same verdict, in the same words
    if (c.error) {
      EXPECT_NE(cli_error.find(c.error), std::string::npos) << cli_error;
      continue;
    }
    ASSERT_EQ(cli_error, "");
    EXPECT_EQ(a.fsdp_policy, engine_policy);
    EXPECT_EQ(engine_policy.strategy, c.strategy);
    EXPECT_EQ(engine_policy.auto_wrap, c.auto_wrap);
    EXPECT_EQ(engine_policy.offload, c.offload);
    EXPECT_EQ(engine_policy.param_dtype, c.bf16 ? at::kBFloat16 : at::kFloat);
    EXPECT_EQ(engine_policy.hybrid_shard_size, c.strategy == S::kHybridShard ? 2 : 0);
    EXPECT_EQ(a.fsdp_words, c.words);
  }
}

}  // namespace
}  // namespace alpaca::cli::test_train_args
