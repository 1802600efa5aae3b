// --deepspeed: the mapping of ZeRO configs onto the FSDP engine's options, "auto" filling,
// mismatch errors, and refusal of anything without an equivalent.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "alpaca/cli/train_args.h"
#include "cli_test_util.h"
#include "test_util.h"

namespace alpaca::cli::test_deepspeed_config {
namespace {

using test::kRequired;
using test::shell_split;

// Parses the required flags plus `extra` with an inline DeepSpeed config.
TrainArgs with_ds(const std::string& ds_json, const std::string& extra = "") {
  std::vector<std::string> argv = shell_split(kRequired + extra);
  argv.push_back("--deepspeed");
  argv.push_back(ds_json);
  return parse_train_args(argv);
}

std::string ds_error(const std::string& ds_json, const std::string& extra = "") {
  try {
    with_ds(ds_json, extra);
  } catch (const UsageError& e) {
    return e.message();
  }
  return "";
}

#define EXPECT_DS_ERROR(json, extra, needle)                                                  \
  do {                                                                                       \
    std::string m_ = ds_error(json, extra);                                                  \
    EXPECT_NE(m_.find(needle), std::string::npos) << "message: " << m_ << "\nwanted: " << (needle); \
  } while (0)

TEST(DeepSpeedConfig, AlpacaOffloadConfigMapsToFullShardWithOffload) {
  std::string path = (testing::source_dir() / "configs" / "default_offload_opt_param.json").string();
  TrainArgs a = parse_train_args(shell_split(kRequired + "--bf16 True --learning_rate 2e-5 --deepspeed " + path));
  EXPECT_EQ(a.deepspeed_zero_stage, 3);
  EXPECT_EQ(a.fsdp_words, "full_shard auto_wrap offload");
  EXPECT_EQ(a.fsdp_policy.strategy, fsdp::ShardingStrategy::kFullShard);
  EXPECT_TRUE(a.fsdp_policy.auto_wrap);
  EXPECT_TRUE(a.fsdp_policy.offload);
  EXPECT_EQ(a.fsdp_policy.param_dtype, at::kBFloat16);
  ASSERT_TRUE(a.deepspeed_schedule);  // its WarmupDecayLR runs as DeepSpeed's class, log warmup
  EXPECT_EQ(a.deepspeed_schedule->type, optim::ScheduleType::kDeepSpeedWarmupDecayLR);
  EXPECT_TRUE(a.deepspeed_schedule->deepspeed.log_warmup);
  EXPECT_EQ(schedule_from_flags(a).type, optim::ScheduleType::kDeepSpeedWarmupDecayLR);
  EXPECT_DOUBLE_EQ(schedule_from_flags(a).base_lr, 2e-5);
  EXPECT_TRUE(a.bf16);
  // Its tuning knobs are reported, not silently dropped.
  std::string notes;
  for (const auto& n : a.notes) notes += n + "\n";
  EXPECT_NE(notes.find("stage3_max_live_parameters"), std::string::npos) << notes;
  EXPECT_NE(notes.find("steps_per_print"), std::string::npos) << notes;
}

TEST(DeepSpeedConfig, StagesMapToStrategies) {
  EXPECT_EQ(with_ds(R"({"zero_optimization": {"stage": 2}})").fsdp_words, "shard_grad_op auto_wrap");
  EXPECT_EQ(with_ds(R"({"zero_optimization": {"stage": 2}})").fsdp_policy.strategy, fsdp::ShardingStrategy::kShardGradOp);
  EXPECT_EQ(with_ds(R"({"zero_optimization": {"stage": 0}})").fsdp_words, "no_shard auto_wrap");
  EXPECT_EQ(with_ds(R"({"zero_optimization": {"stage": 0}})").fsdp_policy.strategy, fsdp::ShardingStrategy::kNoShard);
  TrainArgs z2 = with_ds(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})");
  EXPECT_TRUE(z2.fsdp_policy.offload);
  EXPECT_EQ(z2.fsdp_words, "shard_grad_op auto_wrap offload");
  EXPECT_EQ(z2.lr_scheduler_type, "linear");  // no scheduler block: --lr_scheduler_type applies
  EXPECT_DS_ERROR(R"({"zero_optimization": {"stage": 1}})", "", "zero_optimization.stage 1 is not supported");
  EXPECT_DS_ERROR(R"({"bf16": {"enabled": true}})", "--bf16 True", "zero_optimization is missing");
}

TEST(DeepSpeedConfig, AutoTakesTheFlagsAndExplicitValuesMustAgree) {
  TrainArgs a = with_ds(R"({"zero_optimization": {"stage": 3}, "optimizer": {"type": "AdamW", "params": {"lr": 3e-5,
                           "betas": [0.9, 0.95], "eps": "auto", "weight_decay": 0.1}}, "gradient_accumulation_steps": 4,
                           "train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.5})",
                        "--learning_rate 3e-5 --adam_beta2 0.95 --weight_decay 0.1 --gradient_accumulation_steps 4 "
                        "--per_device_train_batch_size 2 --max_grad_norm 0.5");
  EXPECT_DOUBLE_EQ(a.learning_rate, 3e-5);
  EXPECT_DS_ERROR(R"({"zero_optimization": {"stage": 3}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}})",
                  "--learning_rate 2e-5",
                  "optimizer.params.lr is 0.0001 but --learning_rate is 2e-05; set it to \"auto\" or pass --learning_rate 0.0001");
  EXPECT_DS_ERROR(R"({"zero_optimization": {"stage": 3}, "bf16": {"enabled": true}})", "",
                  "bf16.enabled is true but --bf16 is False");
  EXPECT_DS_ERROR(R"({"zero_optimization": {"stage": 3}, "gradient_accumulation_steps": 16})", "",
                  "gradient_accumulation_steps is 16 but --gradient_accumulation_steps is 1");
  EXPECT_DS_ERROR(R"({"zero_optimization": {"stage": 3}, "train_batch_size": 999})", "", "train_batch_size is 999");
}

// A scheduler block runs DeepSpeed's own class (as HF Trainer does), "auto" filled from the flags and
// DeepSpeed's defaults for absent keys; the values the classes give are tested in test_optim.
TEST(DeepSpeedConfig, SchedulerBlockRunsDeepSpeedsClass) {
  using optim::ScheduleType;
  const std::string z3 = R"("zero_optimization": {"stage": 3}, )";
  TrainArgs a = with_ds("{" + z3 + R"("scheduler": {"type": "WarmupDecayLR",
                           "params": {"warmup_num_steps": 10, "warmup_type": "linear", "total_num_steps": "auto",
                                      "warmup_min_lr": 1e-6, "warmup_max_lr": "auto"}}})");
  ASSERT_TRUE(a.deepspeed_schedule);
  EXPECT_EQ(a.deepspeed_schedule->type, ScheduleType::kDeepSpeedWarmupDecayLR);
  EXPECT_FALSE(a.deepspeed_schedule->deepspeed.log_warmup);
  EXPECT_DOUBLE_EQ(a.deepspeed_schedule->deepspeed.warmup_min_lr, 1e-6);
  EXPECT_DOUBLE_EQ(a.deepspeed_schedule->deepspeed.warmup_max_lr.value_or(0), 5e-5);  // "auto": --learning_rate
  EXPECT_FALSE(a.deepspeed_schedule->deepspeed.total_num_steps);  // "auto": the run's length
  EXPECT_DOUBLE_EQ(a.warmup_steps, 10);
  std::string notes;
  for (const auto& n : a.notes) notes += n + "\n";
  EXPECT_NE(notes.find("DeepSpeed's WarmupDecayLR decides the learning rate"), std::string::npos) << notes;

  // Absent keys take DeepSpeed's defaults: WarmupLR warms up over 1000 steps (log) to --learning_rate.
  TrainArgs w = with_ds("{" + z3 + R"("scheduler": {"type": "WarmupLR"}})");
  ASSERT_TRUE(w.deepspeed_schedule);
  EXPECT_EQ(w.deepspeed_schedule->type, ScheduleType::kDeepSpeedWarmupLR);
  EXPECT_TRUE(w.deepspeed_schedule->deepspeed.log_warmup);
  EXPECT_DOUBLE_EQ(w.warmup_steps, 1000);
  EXPECT_DS_ERROR("{" + z3 + R"("scheduler": {"type": "WarmupLR"}})", "--warmup_ratio 0.03",
                  "warmup_num_steps is absent, so DeepSpeed warms up over its default 1000 steps and --warmup_ratio would not be used");
  EXPECT_DS_ERROR("{" + z3 + R"("scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto"}}})", "--learning_rate 2e-5",
                  "warmup_max_lr is absent, so DeepSpeed's WarmupDecayLR would peak at its default 0.001");
  EXPECT_DS_ERROR("{" + z3 + R"("scheduler": {"type": "WarmupDecayLR", "params": {"warmup_max_lr": "auto"}}})", "",
                  "total_num_steps is missing (DeepSpeed's WarmupDecayLR requires it)");
  TrainArgs t = with_ds("{" + z3 + R"("scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 100,
                           "warmup_max_lr": "auto", "warmup_num_steps": "auto"}}})", "--warmup_ratio 0.1");
  ASSERT_TRUE(t.deepspeed_schedule);
  EXPECT_EQ(t.deepspeed_schedule->deepspeed.total_num_steps.value_or(0), 100);  // checked against the run by the trainer

  TrainArgs c = with_ds("{" + z3 + R"("scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": "auto",
                           "warmup_num_steps": "auto", "warmup_min_ratio": 0.1, "cos_min_ratio": 0.05}}})", "--warmup_steps 3");
  ASSERT_TRUE(c.deepspeed_schedule);
  EXPECT_EQ(c.deepspeed_schedule->type, ScheduleType::kDeepSpeedWarmupCosineLR);
  EXPECT_DOUBLE_EQ(c.deepspeed_schedule->deepspeed.warmup_min_ratio, 0.1);
  EXPECT_DOUBLE_EQ(c.deepspeed_schedule->deepspeed.cos_min_ratio, 0.05);
  EXPECT_DS_ERROR("{" + z3 + R"("scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": "auto", "warmup_min_lr": 0}}})",
                  "", "scheduler.params.warmup_min_lr is not supported");

  EXPECT_DS_ERROR("{" + z3 + R"("scheduler": {"type": "WarmupDecayLR", "params": {"warmup_type": "exp", "warmup_max_lr": "auto"}}})",
                  "", "warmup_type 'exp' is not supported");
  EXPECT_DS_ERROR("{" + z3 + R"("scheduler": {"type": "OneCycle"}})", "", "scheduler.type 'OneCycle' is not supported");
  EXPECT_DS_ERROR("{" + z3 + R"("scheduler": {"type": "WarmupLR"}})", "--lr_scheduler_type cosine",
                  "so --lr_scheduler_type cosine would not be used");
  EXPECT_DS_ERROR("{" + z3 + R"("scheduler": {"type": "WarmupLR"}})", "--lr_scheduler_kwargs '{\"num_cycles\": 1}'",
                  "so --lr_scheduler_kwargs would not be used");
  EXPECT_DS_ERROR("{" + z3 + R"("scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 0}}})", "",
                  "warmup_num_steps must be a positive step count");
  // A run's training_args.json (every flag, defaults included) replays as --config.
  for (const std::string& sched : {std::string(R"({"type": "WarmupLR"})"),
                                   std::string(R"({"type": "WarmupDecayLR", "params": {"total_num_steps": "auto",
                                       "warmup_max_lr": "auto", "warmup_num_steps": 5}})")}) {
    testing::TempDir dir("ds_replay");
    const std::string ds = "{" + z3 + R"("scheduler": )" + sched + "}";
    std::ofstream(dir.path() / "args.json") << train_args_to_json(with_ds(ds));
    const TrainArgs replay = parse_train_args({"--config", (dir.path() / "args.json").string()});
    ASSERT_TRUE(replay.deepspeed_schedule) << sched;
    EXPECT_EQ(replay.deepspeed_schedule->type, with_ds(ds).deepspeed_schedule->type);
    EXPECT_DOUBLE_EQ(replay.warmup_steps, with_ds(ds).warmup_steps);
  }
  // No scheduler block: --lr_scheduler_type decides, as in HF.
  EXPECT_FALSE(with_ds("{" + z3 + R"("gradient_clipping": "auto"})", "--lr_scheduler_type cosine").deepspeed_schedule);
  // gradient_clipping absent: DeepSpeed clips at its default 1.0 (HF leaves clipping to the engine).
  EXPECT_DS_ERROR("{" + z3.substr(0, z3.size() - 2) + "}", "--max_grad_norm 0.5",
                  "gradient_clipping is absent, so DeepSpeed clips at its default 1.0 and --max_grad_norm 0.5 would not be used");
  EXPECT_EQ(ds_error("{" + z3.substr(0, z3.size() - 2) + "}"), "");
}

TEST(DeepSpeedConfig, UnsupportedKeysAndValuesAreErrors) {
  EXPECT_DS_ERROR(R"({"zero_optimisation": {"stage": 3}})", "", "zero_optimisation is not supported by alpaca-train's FSDP engine; did you mean 'zero_optimization'?");
  EXPECT_DS_ERROR(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}, "offload_optimizer": {"device": "cpu"}}})",
                  "", "offload_param.device 'nvme' is not supported");
  EXPECT_DS_ERROR(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})", "",
                  "offload_param without offload_optimizer has no equivalent");
  EXPECT_DS_ERROR(R"({"zero_optimization": {"stage": 3, "round_robin_gradients": true}})", "",
                  "zero_optimization.round_robin_gradients is not supported");
  EXPECT_DS_ERROR(R"({"zero_optimization": {"stage": 3}, "optimizer": {"type": "Lamb"}})", "", "optimizer.type 'Lamb' is not supported");
  // DeepSpeed's "Adam" is AdamW unless adam_w_mode is false (engine._configure_basic_optimizer).
  EXPECT_EQ(ds_error(R"({"zero_optimization": {"stage": 3}, "optimizer": {"type": "Adam", "params": {"lr": "auto", "torch_adam": true}}})"), "");
  EXPECT_DS_ERROR(R"({"zero_optimization": {"stage": 3}, "optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})", "",
                  "adam_w_mode must be true");
  // An optimizer block is DeepSpeed's own AdamW: bitsandbytes' (--optim adamw_8bit) contradicts it.
  EXPECT_DS_ERROR(R"({"zero_optimization": {"stage": 3}, "optimizer": {"type": "AdamW"}})", "--optim adamw_8bit",
                  "--optim adamw_8bit contradicts; remove the optimizer block");
  EXPECT_EQ(ds_error(R"({"zero_optimization": {"stage": 3}})", "--optim adamw_8bit"), "");
  EXPECT_DS_ERROR(R"({"zero_optimization": {"stage": 3}, "fp16": {"enabled": "auto", "initial_scale_power": 12}})", "--fp16 True",
                  "fp16.initial_scale_power is not supported");
  // The HF docs' ZeRO configs carry DeepSpeed's fp16 scaler keys under "enabled": "auto": off without
  // --fp16 (as in DeepSpeed), so they are accepted and do nothing.
  const std::string hf_docs_fp16 = R"("fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000,
      "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1})";
  EXPECT_EQ(ds_error(R"({"zero_optimization": {"stage": 3}, )" + hf_docs_fp16 + "}", "--bf16 True"), "");
  EXPECT_EQ(ds_error(R"({"zero_optimization": {"stage": 2}, )" + hf_docs_fp16 + "}"), "");
  EXPECT_DS_ERROR(R"({"zero_optimization": {"stage": 3}, "wall_clock_breakdown": true})", "", "wall_clock_breakdown must be false");
  EXPECT_DS_ERROR(R"({"zero_optimization": {"stage": 3}})", "--fsdp_config x.json", "do not combine with --deepspeed");
  EXPECT_DS_ERROR("/no/such/ds.json", "", "--deepspeed /no/such/ds.json: cannot open the file");
  EXPECT_DS_ERROR("{\"zero_optimization\": ", "", "is not valid JSON");
}

}  // namespace
}  // namespace alpaca::cli::test_deepspeed_config

// A module's test files compile as one unit (tests/CMakeLists.txt): this file's macros end here.
#undef EXPECT_DS_ERROR
