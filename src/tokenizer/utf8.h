// Private to src/tokenizer: the one UTF-8 decoder of the module and the character classes the
// `tokenizers` crate and transformers' slow tokenizer test (Rust's char::is_whitespace, the regex
// crate's \w). Decoding is inline: the BPE model and every normalizer walk text with it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace alpaca::tokenizer::detail {

// What decode_utf8 returns for a byte that does not start a well-formed-looking sequence (a
// continuation byte, 0xF8..0xFF, or a lead byte whose sequence runs past the end); it always
// consumes that one byte.
//  - kReplacement: U+FFFD, the `tokenizers` crate's view (its text is a Rust String, and every
//    tokenizer.json component here runs on what it would hold).
//  - kByteValue: the byte's own value (0x80..0xFF), the slow tokenizer's: it only asks "is this
//    Python whitespace?" next to an added token, and a stray 0x85 or 0xA0 byte counts as one.
// Neither policy validates continuation bytes or overlong forms: callers that need Rust's
// String::from_utf8_lossy use from_utf8_lossy below.
enum class Utf8Invalid { kReplacement, kByteValue };

// The code point starting at s[i] (i < s.size()) and its length in bytes (*len >= 1).
inline uint32_t decode_utf8(const std::string& s, size_t i, size_t* len,
                            Utf8Invalid invalid = Utf8Invalid::kReplacement) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  if (p[0] < 0x80) {
    *len = 1;
    return p[0];
  }
  if ((p[0] >> 5) == 0x6 && i + 1 < s.size()) {
    *len = 2;
    return ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu);
  }
  if ((p[0] >> 4) == 0xE && i + 2 < s.size()) {
    *len = 3;
    return ((p[0] & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
  }
  if ((p[0] >> 3) == 0x1E && i + 3 < s.size()) {
    *len = 4;
    return ((p[0] & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
  }
  *len = 1;
  return invalid == Utf8Invalid::kReplacement ? 0xFFFDu : p[0];
}

// Length of the sequence lead byte `c` announces (1 for a continuation or invalid byte).
inline size_t utf8_len(unsigned char c) {
  return c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
}

// Offset of the code point that ends at s[end - 1] (end > 0): steps back over continuation bytes.
inline size_t utf8_prev(const std::string& s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

void append_utf8(std::string* out, uint32_t cp);

// Rust's char::is_whitespace: the Unicode White_Space property.
inline bool is_white_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// The regex crate's \w: Alphabetic, marks, decimal digits, connector punctuation, joiners.
bool is_word_char(uint32_t c);

// Last code point of s[0, end) (end > 0, valid UTF-8).
uint32_t last_code_point(const std::string& s, size_t end);

// Rust's String::from_utf8_lossy: each maximal invalid subsequence becomes one U+FFFD.
std::string from_utf8_lossy(const std::string& b);
bool valid_utf8(const std::string& b);

}  // namespace alpaca::tokenizer::detail
