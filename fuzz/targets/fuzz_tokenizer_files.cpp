// The HF tokenizer files beside a SentencePiece model: the input is tokenizer_config.json,
// special_tokens_map.json and added_tokens.json separated by NUL bytes (an empty part = the file
// is absent), loaded with the repo's small tokenizer.model, then used to encode and decode.
// (tokenizer.json on its own is fuzz_tokenizer_json.)
#include <filesystem>

#include "alpaca/tokenizer/tokenizer.h"
#include "fuzz_common.h"
#include "tokenizer_exercise.h"

namespace {
std::string model_bytes() {
  std::ifstream in(ALPACA_FUZZ_SP_MODEL, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string model = model_bytes();
  const auto dir = fuzz::scratch_dir() / "tok";
  std::filesystem::create_directories(dir);
  fuzz::write_file(dir / "tokenizer.model", model);
  const auto parts = fuzz::split_nul(data, size, 3);
  const char* names[3] = {"tokenizer_config.json", "special_tokens_map.json", "added_tokens.json"};
  for (int i = 0; i < 3; ++i) {
    std::filesystem::remove(dir / names[i]);
    if (!parts[i].empty()) fuzz::write_file(dir / names[i], parts[i]);
  }
  FUZZ_EXPECT_ALPACA_ERRORS({
    alpaca::tokenizer::Tokenizer tok = alpaca::tokenizer::Tokenizer::load(dir.string());
    fuzz::exercise_tokenizer(tok, "Below is an instruction.\n### Response: ok <s></s>");
  });
  return 0;
}
