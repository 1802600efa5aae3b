// The Precompiled normalizer as the `tokenizers` crate runs it (see precompiled.h). The charsmap:
// a little-endian u32 trie size in bytes, the trie's u32 units, then the replacement blob (which
// must be UTF-8 as a whole). Segmentation into extended grapheme clusters is utf8proc's
// (the crate uses unicode-segmentation; both follow UAX #29).
#include "precompiled.h"

#include <utf8proc.h>

#include "alpaca/util/error.h"

namespace alpaca::tokenizer::detail {
namespace {

std::string base64_decode(const std::string& in, const std::string& where) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
  };
  ALPACA_CHECK(in.size() % 4 == 0, where << ": precompiled_charsmap is not padded base64 (length " << in.size() << ")");
  std::string out;
  for (size_t i = 0; i < in.size(); i += 4) {
    const size_t pad = in[i + 3] != '=' ? 0 : in[i + 2] != '=' ? 1 : 2;
    ALPACA_CHECK(pad == 0 || i + 4 == in.size(), where << ": precompiled_charsmap has base64 padding inside");
    uint32_t bits = 0;
    for (size_t k = 0; k < 4 - pad; ++k) {
      const int v = value(in[i + k]);
      ALPACA_CHECK(v >= 0, where << ": precompiled_charsmap has a character that is not base64 at " << i + k);
      bits |= static_cast<uint32_t>(v) << (18 - 6 * k);
    }
    for (size_t k = 0; k < 3 - pad; ++k) out.push_back(static_cast<char>((bits >> (16 - 8 * k)) & 0xFF));
  }
  return out;
}

uint32_t le32(const std::string& b, size_t at) {
  return static_cast<uint32_t>(static_cast<unsigned char>(b[at])) |
         static_cast<uint32_t>(static_cast<unsigned char>(b[at + 1])) << 8 |
         static_cast<uint32_t>(static_cast<unsigned char>(b[at + 2])) << 16 |
         static_cast<uint32_t>(static_cast<unsigned char>(b[at + 3])) << 24;
}

// darts-clone's unit fields (spm_precompiled's ArrayUnitTrait).
bool has_leaf(uint32_t u) { return (u >> 8) & 1; }
int64_t value(uint32_t u) { return u & ((1u << 31) - 1); }
uint32_t label(uint32_t u) { return u & ((1u << 31) | 0xFF); }
uint32_t offset(uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); }

}  // namespace

Precompiled::Precompiled(const std::string& base64, const std::string& where) : where_(where) {
  const std::string blob = base64_decode(base64, where);
  ALPACA_CHECK(blob.size() >= 4, where << ": precompiled_charsmap is too short to hold its trie size");
  const size_t trie_bytes = le32(blob, 0) / 4 * 4;
  ALPACA_CHECK(blob.size() - 4 >= trie_bytes,
               where << ": precompiled_charsmap's trie (" << trie_bytes << " bytes) is longer than the map");
  for (size_t at = 4; at < 4 + trie_bytes; at += 4) trie_.push_back(le32(blob, at));
  normalized_ = blob.substr(4 + trie_bytes);
  ALPACA_CHECK(utf8proc_decompose(reinterpret_cast<const utf8proc_uint8_t*>(normalized_.data()),
                                  static_cast<utf8proc_ssize_t>(normalized_.size()), nullptr, 0, UTF8PROC_STABLE) >= 0,
               where << ": precompiled_charsmap's replacement strings are not valid UTF-8");
  ALPACA_CHECK(!trie_.empty(), where << ": precompiled_charsmap has an empty trie");
}

int64_t Precompiled::lookup(const std::string& s, size_t begin, size_t end) const {
  auto unit = [&](size_t pos) {
    ALPACA_CHECK(pos < trie_.size(), where_ << ": precompiled_charsmap's trie points outside itself (" << pos << ")");
    return trie_[pos];
  };
  size_t pos = offset(unit(0));
  for (size_t i = begin; i < end && s[i] != '\0'; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    pos ^= c;
    const uint32_t u = unit(pos);
    if (label(u) != c) return -1;
    pos ^= offset(u);
    if (has_leaf(u)) return value(unit(pos));  // the first (shortest) match is the one used
  }
  return -1;
}

void Precompiled::append(std::string* out, int64_t at) const {
  const auto begin = static_cast<size_t>(at);
  ALPACA_CHECK(begin <= normalized_.size(), where_ << ": precompiled_charsmap's trie points past its strings");
  const size_t end = normalized_.find('\0', begin);
  out->append(normalized_, begin, (end == std::string::npos ? normalized_.size() : end) - begin);
}

std::string Precompiled::normalize(const std::string& s) const {
  std::string out;
  out.reserve(s.size());
  utf8proc_int32_t state = 0, prev = -1;
  std::vector<size_t> chars;  // byte offsets of the current grapheme's characters
  auto flush = [&](size_t end) {
    if (chars.empty()) return;
    const size_t begin = chars.front();
    const int64_t whole = end - begin < 6 ? lookup(s, begin, end) : -1;
    if (whole >= 0) {
      append(&out, whole);
    } else {
      for (size_t k = 0; k < chars.size(); ++k) {
        const size_t b = chars[k], e = k + 1 < chars.size() ? chars[k + 1] : end;
        const int64_t one = lookup(s, b, e);
        if (one >= 0) append(&out, one); else out.append(s, b, e - b);
      }
    }
    chars.clear();
  };
  for (size_t i = 0; i < s.size();) {
    utf8proc_int32_t c = 0;
    const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                    static_cast<utf8proc_ssize_t>(s.size() - i), &c);
    ALPACA_CHECK(n > 0, where_ << ": the text to normalize is not valid UTF-8");
    if (prev >= 0 && utf8proc_grapheme_break_stateful(prev, c, &state)) flush(i);
    chars.push_back(i);
    prev = c;
    i += static_cast<size_t>(n);
  }
  flush(s.size());
  return out;
}

}  // namespace alpaca::tokenizer::detail
