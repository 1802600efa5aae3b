// tokenizer.json (Hugging Face tokenizers: BPE / byte-level, Unigram and WordPiece models, the
// Precompiled SentencePiece charsmap, pre-tokenizer regexes through PCRE2, normalizers through
// utf8proc, added tokens, post-processor templates) read by src/data/hf_tokenizer.cpp: the input is the file, loaded on its own, then used to
// encode and decode text that touches its added tokens, and written back out.
#include <filesystem>

#include "alpaca/tokenizer/tokenizer.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto file = fuzz::scratch_dir() / "tokenizer.json";
  fuzz::write_file(file, fuzz::as_string(data, size));
  FUZZ_EXPECT_ALPACA_ERRORS({
    alpaca::tokenizer::Tokenizer tok = alpaca::tokenizer::Tokenizer::load(file.string(), true);
    std::string text = "Below is an instruction.\n### Response: ok <s></s> \xc3\xa9\xe2\x80\x83 x\r\n\t 123";
    for (const auto& t : tok.added_tokens()) text += " " + t.content + "x";
    const auto ids = tok.encode(text, true);
    (void)tok.decode(ids, false);
    (void)tok.decode(ids, true);
    (void)tok.vocab_size();
  });
  return 0;
}
