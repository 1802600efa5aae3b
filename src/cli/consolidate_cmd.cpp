// `alpaca-train consolidate CHECKPOINT OUT`: a sharded checkpoint -> a Hugging Face directory.
#include "alpaca/ckpt/consolidate.h"
#include "alpaca/cli/commands.h"
#include "alpaca/cli/subcommand_flags.h"
#include "alpaca/cli/usage_error.h"
#include "alpaca/io/hf_model.h"
#include "alpaca/util/error.h"
#include "alpaca/util/log.h"

namespace alpaca::cli {

int run_consolidate(const std::vector<std::string>& args) {
  std::string shard_size = "5GB";
  const Subcommand cmd{"consolidate",
                       "Turn a sharded training checkpoint (checkpoint-<step>/) into a Hugging Face model directory.",
                       {{"--save_max_shard_size", &shard_size, "Largest safetensors shard, e.g. 5GB, 200MB"}},
                       "CHECKPOINT OUT"};
  // The two positional arguments pass through the flag table; anything else that looks like a flag
  // is a usage error (exit 2) like every other subcommand's.
  const ParsedFlags parsed = parse_subcommand_flags(cmd, args, /*pass_through=*/true);
  if (parsed.help) return 0;
  for (const auto& a : parsed.rest)
    ALPACA_USAGE_CHECK(a.rfind("--", 0) != 0, "consolidate: unknown flag " << a << "\n" << subcommand_help(cmd));
  ALPACA_USAGE_CHECK(parsed.rest.size() == 2, "consolidate: expected CHECKPOINT and OUT, got "
                                                  << parsed.rest.size() << " argument(s)\n" << subcommand_help(cmd));
  const std::string& checkpoint = parsed.rest[0];
  const std::string& out = parsed.rest[1];
  const auto s = ckpt::consolidate_checkpoint(checkpoint, out, io::parse_shard_size(shard_size));
  ALPACA_INFO("consolidate: wrote " << s.num_tensors << " tensors (" << s.bytes << " bytes) to " << out);
  return 0;
}

}  // namespace alpaca::cli
