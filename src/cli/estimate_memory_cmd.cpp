// `alpaca-train estimate-memory <train flags> [--num_gpus N | --num_cpu_ranks N] [--gpus_per_node G]
//  [--gpu_memory_gb X] [--host_memory_gb Y] [--json]`: the memory planner (plan/memory_plan.h) for
// the configuration the same flags would train, reading only config.json: per-rank device and
// host bytes, broken down, for the given configuration and each rung of the OOM ladder, with the
// largest per_device_train_batch_size that fits. Nothing is loaded, written or launched.
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "alpaca/cli/commands.h"
#include "alpaca/cli/subcommand_flags.h"
#include "alpaca/cli/train_args.h"
#include "alpaca/cli/usage_error.h"
#include "alpaca/data/collate.h"
#include "alpaca/dist/launch.h"
#include "alpaca/fsdp/policy.h"
#include "alpaca/model/lora.h"
#include "alpaca/model/loss_gemm.h"
#include "alpaca/model/matmul.h"
#include "alpaca/plan/memory_plan.h"
#include "alpaca/util/error.h"

namespace alpaca::cli {

namespace fs = std::filesystem;

namespace {

// The planner's inputs for the run `args` would train on `job`.
plan::MemoryPlanInputs plan_inputs(const TrainArgs& args, const dist::LaunchInfo& job, bool gpu) {
  fs::path cfg_path = args.model_name_or_path;
  if (fs::is_directory(cfg_path)) cfg_path /= "config.json";
  ALPACA_USAGE_CHECK(fs::is_regular_file(cfg_path), "--model_name_or_path " << args.model_name_or_path
                                                                            << ": no config.json there; give a Hugging "
                                                                               "Face LLaMA directory or its config.json");
  plan::MemoryPlanInputs in;
  in.config = model::LlamaConfig::from_json_file(cfg_path.string());
  // train.py adds [PAD] (one embedding row) when the tokenizer has none; LLaMA configs that name no
  // pad token are such models.
  // Under LoRA that row trains as a peft trainable-token delta.
  if (!in.config.pad_token_id) {
    ++in.config.vocab_size;
    in.lora_token_rows = 1;
  }
  in.micro_batch = args.per_device_train_batch_size;
  in.adamw_8bit = args.optim.find("8bit") != std::string::npos;  // bitsandbytes' 8-bit moments
  in.adafactor = args.optim == "adafactor";
  in.lion = args.optim.find("lion") != std::string::npos;
  in.seq_len = args.model_max_length;
  if (args.pad_to_multiple_of) in.seq_len = data::round_up_to_multiple(in.seq_len, *args.pad_to_multiple_of);  // the longest batch
  in.gpu = gpu;
  in.num_ranks = job.world_size;
  in.ranks_per_node = job.local_world_size;
  in.cpu_bf16_via_fp32 = model::cpu_bf16_gemm() == model::CpuBf16Gemm::kFp32;
  in.cpu_bf16_head_grad_in_gemm = model::head_grad_summed_in_cpu_gemm();
  const fsdp::FsdpPolicy& policy = args.fsdp_policy;  // the policy training would run
  in.strategy = policy.strategy;
  in.auto_wrap = policy.auto_wrap;
  in.param_dtype = policy.param_dtype;
  in.reduce_dtype = policy.reduce_dtype;
  in.offload = policy.offload;
  in.checkpointing = policy.activation_checkpointing;
  in.async_checkpoint = args.save_async && args.save_strategy != "no";
  in.backward_prefetch = policy.backward_prefetch;
  in.forward_prefetch = policy.forward_prefetch;
  in.limit_all_gathers = policy.limit_all_gathers;
  in.hybrid_shard_size = policy.hybrid_shard_size;
  if (args.use_peft) {  // the LoRA run these flags train (trainer_options.cpp reads the same flags)
    in.lora_rank = args.lora_r;
    in.lora_dropout = args.lora_dropout;
    in.lora_use_dora = args.use_dora;
    in.lora_target_modules = model::split_module_list(args.lora_target_modules);
    in.lora_modules_to_save = model::split_module_list(args.lora_modules_to_save);
    in.quant4_type = policy.quant4_type;  // --load_in_4bit (validate_train_args set it; "" otherwise)
    in.quant4_nested = policy.quant4_nested;
  }
  return in;
}

}  // namespace

int run_estimate_memory(const std::vector<std::string>& argv) {
  int64_t num_gpus = 0, num_cpu = 0, per_node = 0;
  double gpu_gb = 80, host_gb = 0;
  bool json = false;
  const Subcommand cmd{
      "estimate-memory",
      "Per-rank memory of the run the same flags would start, from config.json alone (no weights, no GPU):\n"
      "fp32 master/gradient/AdamW shards, gathered units, reduce-scatter buffers, the root units,\n"
      "activations (with and without gradient checkpointing), the fused loss chunk and an allocator margin;\n"
      "the same for each OOM-ladder rung with the largest micro-batch that fits; DeepSpeed's ZeRO-3\n"
      "estimator beside it. Every train flag is accepted (--data_path is not read).",
      {{"--num_gpus", &num_gpus, "GPU ranks in the job (default: 1)"},
       {"--num_cpu_ranks", &num_cpu, "CPU ranks instead (device memory is host memory; the tests' setting)"},
       {"--gpus_per_node", &per_node, "Ranks per node (default: min(N, 8))"},
       {"--gpu_memory_gb", &gpu_gb, "Memory of one GPU in GiB"},
       {"--host_memory_gb", &host_gb, "Host memory per node in GiB (default: unknown, not judged)"},
       {"--json", &json, "One JSON object: device_total_bytes, host_total_bytes, fits, breakdown, rungs"}},
      "<the train flags>"};
  const ParsedFlags parsed = parse_subcommand_flags(cmd, argv, /*pass_through=*/true);
  if (parsed.help) return 0;
  auto positive = [&](const char* flag, double v) {
    ALPACA_USAGE_CHECK(!parsed.was_given(flag) || v > 0, flag << " must be positive, got " << v);
  };
  positive("--num_gpus", static_cast<double>(num_gpus));
  positive("--num_cpu_ranks", static_cast<double>(num_cpu));
  positive("--gpus_per_node", static_cast<double>(per_node));
  positive("--gpu_memory_gb", gpu_gb);
  positive("--host_memory_gb", host_gb);
  std::vector<std::string> train_argv = parsed.rest;
  bool has_data = false;
  for (const auto& a : train_argv) has_data |= a == "--data_path" || a.rfind("--data_path=", 0) == 0;
  ALPACA_USAGE_CHECK(num_gpus == 0 || num_cpu == 0, "give --num_gpus or --num_cpu_ranks, not both");
  // The estimate never reads the data; the train flags' parser requires the flag.
  if (!has_data) {
    train_argv.push_back("--data_path");
    train_argv.push_back("(not read by estimate-memory)");
  }
  // The job this estimates: its rank count and ranks per node (hybrid_shard groups are a node).
  dist::LaunchInfo job;
  job.world_size = static_cast<int>(num_cpu > 0 ? num_cpu : std::max<int64_t>(num_gpus, 1));
  job.local_world_size = static_cast<int>(per_node > 0 ? per_node : std::min<int64_t>(job.world_size, num_cpu > 0 ? job.world_size : 8));
  job.num_nodes = (job.world_size + job.local_world_size - 1) / job.local_world_size;
  const TrainArgs args = parse_train_args(train_argv, job);

  plan::MemoryPlanInputs in = plan_inputs(args, job, /*gpu=*/num_cpu == 0);
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  if (in.gpu) in.device_memory_bytes = static_cast<int64_t>(gpu_gb * kGiB);
  in.host_memory_bytes = static_cast<int64_t>(host_gb * kGiB);

  const plan::MemoryPlan plan = plan::plan_memory(in);
  const auto rungs = plan::plan_ladder(in);
  std::cout << (json ? plan::report_to_json(in, plan, rungs) : plan::report_to_text(in, plan, rungs)) << std::endl;
  return 0;
}

}  // namespace alpaca::cli
