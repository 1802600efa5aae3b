// tokenizer.json (Hugging Face tokenizers: BPE / byte-level, Unigram and WordPiece models, the
// Precompiled SentencePiece charsmap, pre-tokenizer regexes through PCRE2, normalizers through
// utf8proc, added tokens, post-processor templates) read by src/tokenizer/ (hf_tokenizer.h): the
// input is the file, loaded on its own, then used to encode and decode text that touches its added
// tokens.
#include <filesystem>

#include "alpaca/tokenizer/tokenizer.h"
#include "fuzz_common.h"
#include "tokenizer_exercise.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto file = fuzz::scratch_dir() / "tokenizer.json";
  fuzz::write_file(file, fuzz::as_string(data, size));
  FUZZ_EXPECT_ALPACA_ERRORS({
    alpaca::tokenizer::Tokenizer tok = alpaca::tokenizer::Tokenizer::load(file.string(), true);
    fuzz::exercise_tokenizer(tok, "Below is an instruction.\n### Response: ok <s></s> \xc3\xa9\xe2\x80\x83 x\r\n\t 123");
  });
  return 0;
}
