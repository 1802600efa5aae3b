// Shared by the tokenizer fuzz targets: what they do with a tokenizer that loaded. The text
// touches every added token (each followed by a character, so a token's lstrip/rstrip/single_word
// rules run), is encoded with the special tokens and decoded both ways.
#pragma once

#include <string>

#include "alpaca/tokenizer/tokenizer.h"

namespace fuzz {

inline void exercise_tokenizer(const alpaca::tokenizer::Tokenizer& tok, std::string text) {
  for (const auto& t : tok.added_tokens()) text += " " + t.content + "x";
  const auto ids = tok.encode(text, true);
  (void)tok.decode(ids, false);
  (void)tok.decode(ids, true);
  (void)tok.vocab_size();
}

}  // namespace fuzz
