// `alpaca-train init-model`: a randomly initialised LLaMA (transformers' init) written as an HF
// directory. This is how the project makes tiny models for tests and the quick start.
#include <iostream>

#include <CLI/CLI.hpp>  // defines: CLI::App

#include "alpaca/cli/commands.h"
#include "alpaca/io/hf_model.h"
#include "alpaca/model/llama.h"
#include "alpaca/util/error.h"
#include "alpaca/util/log.h"

namespace alpaca::cli {

int run_init_model(const std::vector<std::string>& args) {
  CLI::App app{"Write a randomly initialised LLaMA model as a Hugging Face directory", "alpaca-train init-model"};
  std::string config_path, output_dir, dtype = "float32", shard_size = "5GB";
  uint64_t seed = 42;
  app.add_option("--config", config_path, "HF config.json of the model to create")->required();
  app.add_option("--output_dir", output_dir, "Directory to write (config.json, safetensors, generation_config.json)")
      ->required();
  app.add_option("--seed", seed, "Seed of the normal(0, initializer_range) initialisation")->capture_default_str();
  app.add_option("--dtype", dtype, "Stored dtype: float32 or bfloat16")->capture_default_str();
  app.add_option("--save_max_shard_size", shard_size, "Largest safetensors shard, e.g. 5GB, 200MB")
      ->capture_default_str();
  std::vector<std::string> argv(args.rbegin(), args.rend());  // CLI11 parses a reversed vector
  try {
    app.parse(argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    ALPACA_FAIL("init-model: " << e.what() << " (see alpaca-train init-model --help)");
  }
  const at::ScalarType st = io::parse_dtype_name(dtype, "--dtype");
  ALPACA_CHECK(st == at::kFloat || st == at::kBFloat16, "--dtype must be float32 or bfloat16, got " << dtype);
  const int64_t max_shard = io::parse_shard_size(shard_size);

  model::LlamaConfig cfg = model::LlamaConfig::from_json_file(config_path);
  model::LlamaForCausalLM m(cfg, at::kFloat);
  model::init_weights(m, seed);
  io::save_hf_directory(m, output_dir, st, max_shard);
  ALPACA_INFO("init-model: wrote " << model::num_parameters(m) << " parameters (" << dtype << ") to " << output_dir);
  return 0;
}

}  // namespace alpaca::cli
