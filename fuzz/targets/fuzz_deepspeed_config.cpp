// --deepspeed <file>: a DeepSpeed ZeRO config mapped onto the FSDP engine; the first byte picks
// a few flags the mapping compares with ("auto" values, explicit values that must agree).
#include "alpaca/cli/train_args.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto path = fuzz::scratch_dir() / "ds_config.json";
  fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
  std::vector<std::string> argv = {"--output_dir", "out", "--model_name_or_path", "m", "--data_path", "d.json", "--deepspeed", path.string()};
  if (data[0] & 1) argv.insert(argv.end(), {"--bf16", "True"});
  if (data[0] & 2) argv.insert(argv.end(), {"--fp16", "True"});
  if (data[0] & 4) argv.insert(argv.end(), {"--gradient_accumulation_steps", "8"});
  if (data[0] & 8) argv.insert(argv.end(), {"--per_device_train_batch_size", "4"});
  if (data[0] & 16) argv.insert(argv.end(), {"--learning_rate", "2e-5", "--warmup_ratio", "0.03"});
  if (data[0] & 32) argv.insert(argv.end(), {"--lr_scheduler_type", "cosine"});
  if (data[0] & 64) argv.insert(argv.end(), {"--max_grad_norm", "1.0", "--weight_decay", "0.0"});
  FUZZ_EXPECT_ALPACA_ERRORS({ (void)alpaca::cli::parse_train_args(argv); });
  return 0;
}
