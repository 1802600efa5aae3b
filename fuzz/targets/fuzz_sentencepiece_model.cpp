// A SentencePiece model (tokenizer.model, a serialized ModelProto): load it, encode, decode.
// libsentencepiece itself is not instrumented (Debian's build), so coverage counts our side;
// a crash inside it still fails the run.
#include "alpaca/tokenizer/tokenizer.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FUZZ_EXPECT_ALPACA_ERRORS({
    alpaca::tokenizer::Tokenizer tok = alpaca::tokenizer::Tokenizer::from_serialized_model(fuzz::as_string(data, size));
    const auto ids = tok.encode("Hello world, \xE2\x96\x81 <s> </s> 12345 \xC3\xA9\xE4\xB8\xAD", true);
    (void)tok.decode(ids, false);
    (void)tok.decode({0, 1, 2, tok.vocab_size() - 1}, true);
  });
  return 0;
}
