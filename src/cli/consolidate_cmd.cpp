// `alpaca-train consolidate CHECKPOINT OUT`: a sharded checkpoint -> a Hugging Face directory.
#include <iostream>

#include <CLI/CLI.hpp>  // defines: CLI::App

#include "alpaca/ckpt/consolidate.h"
#include "alpaca/cli/commands.h"
#include "alpaca/io/hf_model.h"
#include "alpaca/util/error.h"
#include "alpaca/util/log.h"

namespace alpaca::cli {

int run_consolidate(const std::vector<std::string>& args) {
  CLI::App app{"Turn a sharded training checkpoint (checkpoint-<step>/) into a Hugging Face model directory",
               "alpaca-train consolidate"};
  std::string checkpoint, out, shard_size = "5GB";
  app.add_option("CHECKPOINT", checkpoint, "A complete checkpoint-<step> directory of a sharded save")->required();
  app.add_option("OUT", out, "Where the HF directory is written")->required();
  app.add_option("--save_max_shard_size", shard_size, "Largest safetensors shard, e.g. 5GB, 200MB")->capture_default_str();
  std::vector<std::string> argv(args.rbegin(), args.rend());  // CLI11 parses a reversed vector
  try {
    app.parse(argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    ALPACA_FAIL("consolidate: " << e.what() << " (see alpaca-train consolidate --help)");
  }
  const auto s = ckpt::consolidate_checkpoint(checkpoint, out, io::parse_shard_size(shard_size));
  ALPACA_INFO("consolidate: wrote " << s.num_tensors << " tensors (" << s.bytes << " bytes) to " << out);
  return 0;
}

}  // namespace alpaca::cli
