// --deepspeed <json>: alpaca-train has no DeepSpeed; it maps a ZeRO config onto its own FSDP
// engine so the Stanford Alpaca "Addressing OOM" command runs unchanged:
//   zero_optimization.stage 3 -> full_shard, 2 -> shard_grad_op, 0 -> no_shard (each with
//   auto_wrap: one unit per decoder layer); offload_optimizer/offload_param device cpu -> offload;
//   scheduler WarmupDecayLR -> linear warmup + linear decay, WarmupLR -> constant_with_warmup;
//   "auto" values come from the flags; explicit values must agree with the flags (HF's rule).
// Any key or value without an equivalent is an error naming it; pure tuning knobs that change
// no result (bucket sizes, prefetch sizes) are accepted and listed in TrainArgs::notes.
#pragma once

#include <string>

namespace alpaca::cli {

struct TrainArgs;

// `path_or_json`: a JSON file, or an inline object starting with '{'. Updates args.fsdp_words,
// args.lr_scheduler_type, args.warmup_steps, args.deepspeed_zero_stage and args.notes.
// `world_size`: the ranks of the launch (dist::LaunchInfo), which an explicit train_batch_size
// must agree with. Throws cli::UsageError naming the key and what to change.
void apply_deepspeed_config(const std::string& path_or_json, TrainArgs& args, int world_size);

}  // namespace alpaca::cli
