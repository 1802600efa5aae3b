// tokenizer.json (Hugging Face tokenizers: BPE / byte-level, Unigram and WordPiece models, the
// Precompiled SentencePiece charsmap, pre-tokenizer regexes through PCRE2, normalizers through
// utf8proc, added tokens, post-processor templates) read by src/tokenizer/ (hf_tokenizer.h): the
// input is the file, loaded on its own, then used to encode and decode text that touches its added
// tokens. An input with a NUL byte is tokenizer.json NUL tokenizer_config.json, loaded as a model
// directory, so transformers 5's class rule (tokenizer_class.cpp) rewrites the file first.
#include <algorithm>
#include <filesystem>

#include "alpaca/tokenizer/tokenizer.h"
#include "fuzz_common.h"
#include "tokenizer_exercise.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = fuzz::split_nul(data, size, 2);
  const bool as_dir = std::find(data, data + size, 0) != data + size;
  const auto dir = fuzz::scratch_dir() / "tok";
  std::filesystem::create_directories(dir);
  const auto file = dir / "tokenizer.json";
  fuzz::write_file(file, parts[0]);
  std::filesystem::remove(dir / "tokenizer_config.json");
  if (as_dir && !parts[1].empty()) fuzz::write_file(dir / "tokenizer_config.json", parts[1]);
  FUZZ_EXPECT_ALPACA_ERRORS({
    alpaca::tokenizer::Tokenizer tok = alpaca::tokenizer::Tokenizer::load(as_dir ? dir.string() : file.string(), true);
    fuzz::exercise_tokenizer(tok, "Below is an instruction.\n### Response: ok <s></s> \xc3\xa9\xe2\x80\x83 x\r\n\t 123");
  });
  return 0;
}
