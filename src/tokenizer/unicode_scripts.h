// Private to src/tokenizer: the script of a character as the `tokenizers` crate's UnicodeScripts
// pre-tokenizer sees it (pre_tokenizers/unicode_scripts/: a frozen Unicode 9 script table, with
// Hiragana, Katakana and U+30FC counted as Han and the space as "Any").
#pragma once

#include <cstdint>

namespace alpaca::tokenizer::detail {

// A character of this class never starts a piece and does not change the current script: the
// space, and every code point the crate's table leaves out (unassigned in Unicode 9).
constexpr int kAnyScript = 0;

// The script class of `c`: kAnyScript, or a number equal for two characters exactly when the
// crate gives them the same script (the numbers themselves mean nothing).
int script_of(uint32_t c);

}  // namespace alpaca::tokenizer::detail
