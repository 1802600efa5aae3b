// `alpaca-train init-model`: a randomly initialised LLaMA (transformers' init) written as an HF
// directory. This is how the project makes tiny models for tests and the quick start.
#include <iostream>

#include "alpaca/cli/commands.h"
#include "alpaca/cli/subcommand_flags.h"
#include "alpaca/cli/usage_error.h"
#include "alpaca/io/hf_model.h"
#include "alpaca/model/llama.h"
#include "alpaca/util/error.h"
#include "alpaca/util/log.h"

namespace alpaca::cli {

int run_init_model(const std::vector<std::string>& args) {
  std::string config_path, output_dir, dtype = "float32", shard_size = "5GB";
  uint64_t seed = 42;
  const Subcommand cmd{"init-model", "Write a randomly initialised LLaMA model as a Hugging Face directory.",
                       {{"--config", &config_path, "HF config.json of the model to create", true},
                        {"--output_dir", &output_dir, "Directory to write (config.json, safetensors, generation_config.json)", true},
                        {"--seed", &seed, "Seed of the normal(0, initializer_range) initialisation"},
                        {"--dtype", &dtype, "Stored dtype: float32 or bfloat16"},
                        {"--save_max_shard_size", &shard_size, "Largest safetensors shard, e.g. 5GB, 200MB"}}};
  if (parse_subcommand_flags(cmd, args).help) return 0;
  ALPACA_USAGE_CHECK(dtype == "float32" || dtype == "bfloat16", "--dtype must be float32 or bfloat16, got " << dtype);
  const at::ScalarType st = io::parse_dtype_name(dtype, "--dtype");
  const int64_t max_shard = io::parse_shard_size(shard_size);

  model::LlamaConfig cfg = model::LlamaConfig::from_json_file(config_path);
  model::LlamaForCausalLM m(cfg, at::kFloat);
  model::init_weights(m, seed);
  io::save_hf_directory(m, output_dir, st, max_shard);
  ALPACA_INFO("init-model: wrote " << model::num_parameters(m) << " parameters (" << dtype << ") to " << output_dir);
  return 0;
}

}  // namespace alpaca::cli
