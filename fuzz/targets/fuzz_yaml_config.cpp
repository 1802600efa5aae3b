// --config <file>.yaml: TRL's YAML recipes, through libyaml, PyYAML's scalar resolver and then the
// same parse and validation as a JSON config.
#include "alpaca/cli/train_args.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = fuzz::scratch_dir() / "train_config.yaml";
  fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  FUZZ_EXPECT_ALPACA_ERRORS({ (void)alpaca::cli::parse_train_args({"--config", path.string()}); });
  return 0;
}
