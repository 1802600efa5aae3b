// --fsdp_config <file>: the input is the file; the first byte picks the --fsdp words and the
// precision so the strategy-dependent keys are reached.
#include "alpaca/cli/train_args.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const char* kWords[] = {"full_shard auto_wrap", "shard_grad_op auto_wrap", "full_shard auto_wrap offload",
                                 "hybrid_shard auto_wrap", "no_shard", "full_shard"};
  static const char* kPrecision[] = {"--bf16", "--fp16"};
  const auto path = fuzz::scratch_dir() / "fsdp_config.json";
  fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
  std::vector<std::string> argv = {"--output_dir", "out", "--model_name_or_path", "m", "--data_path", "d.json", "--fsdp", kWords[data[0] % 6], "--fsdp_config", path.string()};
  if (data[0] & 0x80) argv.push_back(kPrecision[(data[0] >> 6) & 1]);
  FUZZ_EXPECT_ALPACA_ERRORS({ (void)alpaca::cli::parse_train_args(argv); });
  return 0;
}
