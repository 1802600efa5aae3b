// --config <file>: a JSON object of flag names -> values, through the same parse and validation
// as the command line (the values include inline --fsdp_config / --deepspeed objects).
#include "alpaca/cli/train_args.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = fuzz::scratch_dir() / "train_config.json";
  fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  FUZZ_EXPECT_ALPACA_ERRORS({ (void)alpaca::cli::parse_train_args({"--config", path.string()}); });
  return 0;
}
