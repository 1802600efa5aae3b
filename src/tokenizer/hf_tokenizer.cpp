// tokenizer.json reader and runner with the `tokenizers` library's semantics (see hf_tokenizer.h).
// The pipeline of `Tokenizer::encode` in the library:
//   1. added tokens with normalized=false are split out of the raw text (leftmost-longest,
//      lstrip/rstrip/single_word applied);
//   2. every other piece is normalized on its own, then added tokens with normalized=true are
//      split out of it (matched in their normalized form);
//   3. the pre-tokenizer splits the pieces further; empty pieces are dropped after every step;
//   4. the model (BPE) turns each piece into ids;
//   5. with add_special_tokens the post-processor adds its template's special tokens.
#include "hf_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "alpaca/util/error.h"
#include "precompiled.h"
#include "tokenizer_model.h"

namespace alpaca::tokenizer::detail {
namespace {

using nlohmann::json;

// ---------------------------------------------------------------- UTF-8 helpers

// Code point at s[i] (s is valid UTF-8) and its length in bytes.
inline uint32_t decode_utf8(const std::string& s, size_t i, size_t* len) {
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
  return 0xFFFD;
}

inline size_t utf8_len(unsigned char c) {
  return c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
}

void append_utf8(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Rust's char::is_whitespace: the Unicode White_Space property.
bool is_white_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// The regex crate's \w: Alphabetic, marks, decimal digits, connector punctuation, joiners.
bool is_word_char(uint32_t c) {
  if (c == '_' || c == 0x200C || c == 0x200D) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

// Last code point of s (s non-empty, valid UTF-8).
uint32_t last_code_point(const std::string& s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  size_t len = 0;
  return decode_utf8(s, i, &len);
}

// Rust's String::from_utf8_lossy: each maximal invalid subsequence becomes one U+FFFD.
std::string from_utf8_lossy(const std::string& b) {
  std::string out;
  out.reserve(b.size());
  const auto* p = reinterpret_cast<const unsigned char*>(b.data());
  const size_t n = b.size();
  for (size_t i = 0; i < n;) {
    unsigned char c = p[i];
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    size_t need = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      need = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      need = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
      continue;
    }
    size_t j = i + 1;
    bool ok = true;
    for (size_t k = 0; k < need; ++k, ++j) {
      if (j >= n || p[j] < (k == 0 ? lo : 0x80) || p[j] > (k == 0 ? hi : 0xBF)) {
        ok = false;
        break;
      }
    }
    if (ok) {
      out.append(b, i, need + 1);
    } else {
      out += "\xEF\xBF\xBD";
    }
    i = j;
  }
  return out;
}

bool valid_utf8(const std::string& b) { return from_utf8_lossy(b) == b; }

// ---------------------------------------------------------------- regex (PCRE2, UTF + UCP)

struct Match {
  size_t start, end;
  bool is_match;
};

class Regex {
 public:
  Regex(const std::string& pattern, const std::string& where) {
    int err = 0;
    PCRE2_SIZE off = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
    if (!code) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(err, buf, sizeof buf);
      ALPACA_FAIL(where << ": regex " << json(pattern).dump() << " does not compile at offset "
                        << off << ": " << reinterpret_cast<const char*>(buf));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional speed-up; falls back to the interpreter
    code_.reset(code, pcre2_code_free);
  }

  // The library's Pattern::find_matches: the whole of `s` as alternating non-match / match
  // ranges; an empty `s` gives one empty non-match.
  void find_matches(const std::string& s, std::vector<Match>* out) const {
    out->clear();
    if (s.empty()) {
      out->push_back({0, 0, false});
      return;
    }
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_.get(), nullptr);
    ALPACA_CHECK(md, "out of memory allocating PCRE2 match data");
    size_t prev = 0, pos = 0;
    uint32_t opts = 0;  // the first call checks the UTF-8, the rest skip it
    while (pos <= s.size()) {
      int rc = pcre2_match(code_.get(), reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos,
                           opts, md, nullptr);
      opts = PCRE2_NO_UTF_CHECK;
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        pcre2_match_data_free(md);
        ALPACA_FAIL("regex matching failed (PCRE2 error " << rc << "); is the text valid UTF-8?");
      }
      PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      size_t st = ov[0], en = ov[1];
      if (prev != st) out->push_back({prev, st, false});
      out->push_back({st, en, true});
      prev = en;
      if (en == st) {  // empty match: step over one character
        if (en >= s.size()) break;
        pos = en + utf8_len(static_cast<unsigned char>(s[en]));
      } else {
        pos = en;
      }
    }
    pcre2_match_data_free(md);
    if (prev != s.size()) out->push_back({prev, s.size(), false});
  }

 private:
  std::shared_ptr<pcre2_code> code_;
};

// A SplitPattern / Replace pattern: {"String": "..."} (literal) or {"Regex": "..."}.
struct Pattern {
  std::string literal;
  std::shared_ptr<Regex> regex;

  void find_matches(const std::string& s, std::vector<Match>* out) const {
    if (regex) return regex->find_matches(s, out);
    out->clear();
    if (s.empty()) {
      out->push_back({0, 0, false});
      return;
    }
    size_t prev = 0;
    if (!literal.empty()) {
      for (size_t at = s.find(literal); at != std::string::npos; at = s.find(literal, prev)) {
        if (prev != at) out->push_back({prev, at, false});
        out->push_back({at, at + literal.size(), true});
        prev = at + literal.size();
      }
    }
    if (prev != s.size()) out->push_back({prev, s.size(), false});
  }

  std::string replace_all(const std::string& s, const std::string& content) const {
    std::vector<Match> m;
    find_matches(s, &m);
    std::string out;
    for (const auto& x : m) out += x.is_match ? content : s.substr(x.start, x.end - x.start);
    return out;
  }
};

// ---------------------------------------------------------------- JSON access with file context

class Ctx {
 public:
  explicit Ctx(std::string file) : file_(std::move(file)) {}
  const std::string& file() const { return file_; }

  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    ALPACA_FAIL(file_ << ": " << where << ": " << what);
  }
  const json& get(const json& obj, const char* key, const std::string& where) const {
    if (!obj.is_object() || !obj.contains(key))
      fail(where, std::string("required field \"") + key + "\" is missing");
    return obj.at(key);
  }
  std::string str(const json& obj, const char* key, const std::string& where) const {
    const json& v = get(obj, key, where);
    if (!v.is_string()) fail(where, std::string("field \"") + key + "\" must be a string");
    return v.get<std::string>();
  }
  std::optional<std::string> opt_str(const json& obj, const char* key, const std::string& where) const {
    if (!obj.contains(key) || obj.at(key).is_null()) return std::nullopt;
    return str(obj, key, where);
  }
  bool boolean(const json& obj, const char* key, bool fallback, const std::string& where) const {
    if (!obj.contains(key) || obj.at(key).is_null()) return fallback;
    const json& v = obj.at(key);
    if (!v.is_boolean()) fail(where, std::string("field \"") + key + "\" must be true or false");
    return v.get<bool>();
  }
  int64_t integer(const json& obj, const char* key, int64_t fallback, const std::string& where) const {
    if (!obj.contains(key) || obj.at(key).is_null()) return fallback;
    const json& v = obj.at(key);
    if (!v.is_number_integer()) fail(where, std::string("field \"") + key + "\" must be an integer");
    return v.get<int64_t>();
  }
  std::string type(const json& obj, const std::string& where) const {
    if (!obj.is_object()) fail(where, "must be a JSON object or null");
    return str(obj, "type", where);
  }
  Pattern pattern(const json& obj, const char* key, const std::string& where) const {
    const json& p = get(obj, key, where);
    Pattern out;
    if (p.is_object() && p.contains("String") && p.at("String").is_string()) {
      out.literal = p.at("String").get<std::string>();
    } else if (p.is_object() && p.contains("Regex") && p.at("Regex").is_string()) {
      out.regex = std::make_shared<Regex>(p.at("Regex").get<std::string>(), file_ + ": " + where);
    } else {
      fail(where, std::string("field \"") + key +
                      "\" must be {\"String\": ...} or {\"Regex\": ...}, got " + p.dump());
    }
    return out;
  }

 private:
  std::string file_;
};

// ---------------------------------------------------------------- normalizers

struct Normalizer {
  enum Kind { kSequence, kPrepend, kReplace, kNFC, kNFKC, kNFD, kNFKD, kLowercase, kStrip, kBert, kPrecompiled,
              kStripAccents } kind;
  std::vector<Normalizer> children;
  std::string text;  // Prepend: prepend; Replace: content
  Pattern pattern;
  bool left = false, right = false;
  // BertNormalizer
  bool clean_text = true, chinese_chars = true, strip_accents = false, lowercase = true;
  std::shared_ptr<const Precompiled> charsmap;  // Precompiled (precompiled.h)

  static std::string unicode(const std::string& s, int options) {
    utf8proc_uint8_t* out = nullptr;
    auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                          static_cast<utf8proc_ssize_t>(s.size()), &out,
                          static_cast<utf8proc_option_t>(options | UTF8PROC_STABLE));
    ALPACA_CHECK(n >= 0, "Unicode normalization failed: " << utf8proc_errmsg(n)
                                                          << " (is the text valid UTF-8?)");
    std::string r(reinterpret_cast<char*>(out), static_cast<size_t>(n));
    std::free(out);
    return r;
  }

  // Rust char::to_lowercase, one code point at a time.
  static std::string to_lower(const std::string& s) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0, len = 0; i < s.size(); i += len) {
      uint32_t c = decode_utf8(s, i, &len);
      if (c == 0x130) {  // the one multi-code-point lowercase mapping: İ -> i + U+0307
        out += "i\xCC\x87";
      } else {
        append_utf8(&out, static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
      }
    }
    return out;
  }

  // The library's BertNormalizer: drop NUL, U+FFFD and control characters (Cc Cf Cn Co, except
  // \t \n \r), whitespace -> " ", spaces around CJK ideographs, strip accents (NFD, drop Mn;
  // strip_accents null follows lowercase), lowercase.
  void bert(std::string& s) const {
    auto is_chinese = [](uint32_t c) {
      return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
             (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
             (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
    };
    auto category = [](uint32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)); };
    std::string out;
    out.reserve(s.size() + 8);
    for (size_t i = 0, len = 0; i < s.size(); i += len) {
      const uint32_t c = decode_utf8(s, i, &len);
      if (clean_text) {
        const bool ws = c == '\t' || c == '\n' || c == '\r' || is_white_space(c);
        const auto cat = category(c);
        const bool control = !ws && (cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF ||
                                     cat == UTF8PROC_CATEGORY_CN || cat == UTF8PROC_CATEGORY_CO);
        if (c == 0 || c == 0xFFFD || control) continue;
        if (ws) {
          out.push_back(' ');
          continue;
        }
      }
      if (chinese_chars && is_chinese(c)) {
        out.push_back(' ');
        append_utf8(&out, c);
        out.push_back(' ');
      } else {
        out.append(s, i, len);
      }
    }
    if (strip_accents) {
      const std::string nfd = unicode(out, UTF8PROC_DECOMPOSE);
      out.clear();
      for (size_t i = 0, len = 0; i < nfd.size(); i += len)
        if (category(decode_utf8(nfd, i, &len)) != UTF8PROC_CATEGORY_MN) out.append(nfd, i, len);
    }
    s = lowercase ? to_lower(out) : out;
  }

  void normalize(std::string& s) const {
    switch (kind) {
      case kSequence:
        for (const auto& c : children) c.normalize(s);
        break;
      case kPrepend:
        if (!s.empty()) s = text + s;
        break;
      case kReplace:
        s = pattern.replace_all(s, text);
        break;
      case kNFC:
        s = unicode(s, UTF8PROC_COMPOSE);
        break;
      case kNFKC:
        s = unicode(s, UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
        break;
      case kNFD:
        s = unicode(s, UTF8PROC_DECOMPOSE);
        break;
      case kNFKD:
        s = unicode(s, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
        break;
      case kLowercase:
        s = to_lower(s);
        break;
      case kBert:
        bert(s);
        break;
      case kPrecompiled:
        s = charsmap->normalize(s);
        break;
      case kStripAccents: {  // the library drops every combining mark (Mn, Mc, Me)
        std::string out;
        for (size_t i = 0, len = 0; i < s.size(); i += len) {
          const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(decode_utf8(s, i, &len)));
          if (cat != UTF8PROC_CATEGORY_MN && cat != UTF8PROC_CATEGORY_MC && cat != UTF8PROC_CATEGORY_ME) out.append(s, i, len);
        }
        s = std::move(out);
        break;
      }
      case kStrip: {
        size_t b = 0, e = s.size();
        if (left) {
          for (size_t len = 0; b < e; b += len)
            if (!is_white_space(decode_utf8(s, b, &len))) break;
        }
        if (right) {
          while (e > b) {
            size_t i = e - 1;
            while (i > b && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
            size_t len = 0;
            if (!is_white_space(decode_utf8(s, i, &len))) break;
            e = i;
          }
        }
        s = s.substr(b, e - b);
        break;
      }
    }
  }

  static Normalizer parse(const json& j, const Ctx& ctx, const std::string& where) {
    Normalizer n{};
    std::string t = ctx.type(j, where);
    if (t == "Sequence") {
      n.kind = kSequence;
      const json& list = ctx.get(j, "normalizers", where);
      if (!list.is_array()) ctx.fail(where, "\"normalizers\" must be a list");
      for (size_t i = 0; i < list.size(); ++i)
        n.children.push_back(parse(list[i], ctx, where + ".normalizers[" + std::to_string(i) + "]"));
    } else if (t == "Prepend") {
      n.kind = kPrepend;
      n.text = ctx.str(j, "prepend", where);
    } else if (t == "Replace") {
      n.kind = kReplace;
      n.pattern = ctx.pattern(j, "pattern", where);
      n.text = ctx.str(j, "content", where);
    } else if (t == "NFC") {
      n.kind = kNFC;
    } else if (t == "NFKC") {
      n.kind = kNFKC;
    } else if (t == "NFD") {
      n.kind = kNFD;
    } else if (t == "NFKD") {
      n.kind = kNFKD;
    } else if (t == "Lowercase") {
      n.kind = kLowercase;
    } else if (t == "Strip") {
      n.kind = kStrip;
      n.left = ctx.boolean(j, "strip_left", true, where);
      n.right = ctx.boolean(j, "strip_right", true, where);
    } else if (t == "BertNormalizer") {
      n.kind = kBert;
      n.clean_text = ctx.boolean(j, "clean_text", true, where);
      n.chinese_chars = ctx.boolean(j, "handle_chinese_chars", true, where);
      n.lowercase = ctx.boolean(j, "lowercase", true, where);
      n.strip_accents = ctx.boolean(j, "strip_accents", n.lowercase, where);
    } else if (t == "StripAccents") {
      n.kind = kStripAccents;
    } else if (t == "Precompiled") {
      n.kind = kPrecompiled;
      n.charsmap = std::make_shared<Precompiled>(ctx.str(j, "precompiled_charsmap", where), ctx.file() + ": " + where);
    } else {
      ctx.fail(where, "normalizer type \"" + t +
                          "\" is not supported (supported: Sequence, Prepend, Replace, NFC, NFKC, "
                          "NFD, NFKD, Lowercase, Strip, StripAccents, BertNormalizer, Precompiled)");
    }
    return n;
  }
};

// ---------------------------------------------------------------- pieces and splitting

struct Piece {
  std::string s;
  int64_t id = -1;         // >= 0: already a token (an added token)
  bool at_origin = false;  // starts at offset 0 of the original text (Metaspace "first")
};

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// NormalizedString::split: the kept [start, end) ranges for `matches` under `behavior`.
std::vector<std::pair<size_t, size_t>> split_ranges(std::vector<Match> matches, Behavior behavior,
                                                     bool invert) {
  if (invert)
    for (auto& m : matches) m.is_match = !m.is_match;
  std::vector<std::pair<size_t, size_t>> out;
  out.reserve(matches.size());
  switch (behavior) {
    case Behavior::kIsolated:
      for (const auto& m : matches) out.emplace_back(m.start, m.end);
      break;
    case Behavior::kRemoved:
      for (const auto& m : matches)
        if (!m.is_match) out.emplace_back(m.start, m.end);
      break;
    case Behavior::kContiguous: {
      bool prev = false;
      for (const auto& m : matches) {
        if (m.is_match == prev && !out.empty()) {
          out.back().second = m.end;
        } else {
          out.emplace_back(m.start, m.end);
        }
        prev = m.is_match;
      }
      break;
    }
    case Behavior::kMergedWithPrevious: {
      bool prev = false;
      for (const auto& m : matches) {
        if (m.is_match && !prev && !out.empty()) {
          out.back().second = m.end;
        } else {
          out.emplace_back(m.start, m.end);
        }
        prev = m.is_match;
      }
      break;
    }
    case Behavior::kMergedWithNext: {
      bool prev = false;
      for (auto it = matches.rbegin(); it != matches.rend(); ++it) {
        if (it->is_match && !prev && !out.empty()) {
          out.back().first = it->start;
        } else {
          out.emplace_back(it->start, it->end);
        }
        prev = it->is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
  }
  return out;
}

// Replaces every untokenized piece by fn(piece) (which appends sub-pieces), dropping empty ones.
template <typename Fn>
void split_pieces(std::vector<Piece>& pieces, Fn&& fn) {
  std::vector<Piece> out;
  out.reserve(pieces.size() * 2);
  std::vector<Piece> sub;
  for (auto& p : pieces) {
    if (p.id >= 0) {
      out.push_back(std::move(p));
      continue;
    }
    sub.clear();
    fn(p, sub);
    for (auto& q : sub)
      if (!q.s.empty()) out.push_back(std::move(q));
  }
  pieces = std::move(out);
}

// Sub-pieces of `p` for the kept ranges; the one at offset 0 keeps p's origin flag.
void slice_into(const Piece& p, const std::vector<std::pair<size_t, size_t>>& ranges,
                std::vector<Piece>& sub) {
  for (const auto& r : ranges)
    sub.push_back(Piece{p.s.substr(r.first, r.second - r.first), -1, p.at_origin && r.first == 0});
}

const std::array<std::string, 256>& byte_to_char() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    std::vector<int> bs;
    for (int b = '!'; b <= '~'; ++b) bs.push_back(b);
    for (int b = 0xA1; b <= 0xAC; ++b) bs.push_back(b);
    for (int b = 0xAE; b <= 0xFF; ++b) bs.push_back(b);
    std::vector<bool> direct(256, false);
    for (int b : bs) direct[b] = true;
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      uint32_t cp = direct[b] ? static_cast<uint32_t>(b) : 256u + static_cast<uint32_t>(n++);
      append_utf8(&t[b], cp);
    }
    return t;
  }();
  return table;
}

const std::unordered_map<uint32_t, unsigned char>& char_to_byte() {
  static const std::unordered_map<uint32_t, unsigned char> table = [] {
    std::unordered_map<uint32_t, unsigned char> m;
    for (int b = 0; b < 256; ++b) {
      size_t len = 0;
      m[decode_utf8(byte_to_char()[b], 0, &len)] = static_cast<unsigned char>(b);
    }
    return m;
  }();
  return table;
}

const Regex& gpt2_regex() {
  static const Regex re(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
                        "ByteLevel pre-tokenizer");
  return re;
}

// ---------------------------------------------------------------- pre-tokenizers

enum class PrependScheme { kAlways, kFirst, kNever };

PrependScheme parse_prepend_scheme(const json& j, const Ctx& ctx, const std::string& where) {
  if (j.contains("prepend_scheme") && !j.at("prepend_scheme").is_null()) {
    std::string s = ctx.str(j, "prepend_scheme", where);
    if (s == "always") return PrependScheme::kAlways;
    if (s == "first") return PrependScheme::kFirst;
    if (s == "never") return PrependScheme::kNever;
    ctx.fail(where, "prepend_scheme \"" + s + "\" is not one of always, first, never");
  }
  return ctx.boolean(j, "add_prefix_space", true, where) ? PrependScheme::kAlways
                                                         : PrependScheme::kNever;
}

struct PreTokenizer {
  enum Kind { kSequence, kByteLevel, kSplit, kMetaspace, kDigits, kBert, kWhitespaceSplit } kind;
  std::vector<PreTokenizer> children;
  bool add_prefix_space = false, use_regex = true;  // ByteLevel
  Pattern pattern;                                  // Split; Digits (\p{N} or \p{N}+)
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
  std::string replacement;  // Metaspace
  PrependScheme scheme = PrependScheme::kAlways;
  bool split = true;

  void apply(std::vector<Piece>& pieces) const {
    std::vector<Match> m;
    switch (kind) {
      case kSequence:
        for (const auto& c : children) c.apply(pieces);
        break;
      case kByteLevel: {
        split_pieces(pieces, [&](Piece& p, std::vector<Piece>& sub) {
          if (add_prefix_space && p.s[0] != ' ') p.s.insert(0, " ");
          if (!use_regex) {
            sub.push_back(std::move(p));
            return;
          }
          gpt2_regex().find_matches(p.s, &m);
          slice_into(p, split_ranges(m, Behavior::kIsolated, false), sub);
        });
        const auto& table = byte_to_char();
        for (auto& p : pieces) {
          if (p.id >= 0) continue;
          std::string out;
          out.reserve(p.s.size() * 2);
          for (unsigned char c : p.s) out += table[c];
          p.s = std::move(out);
        }
        break;
      }
      case kSplit:
      case kDigits:
        split_pieces(pieces, [&](Piece& p, std::vector<Piece>& sub) {
          pattern.find_matches(p.s, &m);
          slice_into(p, split_ranges(m, behavior, invert), sub);
        });
        break;
      case kBert:  // whitespace removed, then each punctuation character isolated
      case kWhitespaceSplit:  // whitespace removed
        split_pieces(pieces, [&](Piece& p, std::vector<Piece>& sub) { split_bert(p, sub, kind == kBert); });
        break;
      case kMetaspace: {
        Pattern space{" ", nullptr};
        Pattern rep{replacement, nullptr};
        split_pieces(pieces, [&](Piece& p, std::vector<Piece>& sub) {
          p.s = space.replace_all(p.s, replacement);
          const bool starts = p.s.compare(0, replacement.size(), replacement) == 0;
          if (!starts && (scheme == PrependScheme::kAlways ||
                          (scheme == PrependScheme::kFirst && p.at_origin)))
            p.s.insert(0, replacement);
          if (!split) {
            sub.push_back(std::move(p));
            return;
          }
          rep.find_matches(p.s, &m);
          slice_into(p, split_ranges(m, Behavior::kMergedWithNext, false), sub);
        });
        break;
      }
    }
  }

  // BertPreTokenizer on one piece: split at White_Space (removed) and at punctuation (ASCII
  // punctuation and Unicode P*, each character its own piece).
  static void split_bert(const Piece& p, std::vector<Piece>& sub, bool punctuation) {
    const std::string& s = p.s;
    size_t start = 0;
    auto flush = [&](size_t end) {
      if (end > start) sub.push_back(Piece{s.substr(start, end - start), -1, p.at_origin && start == 0});
    };
    for (size_t i = 0, len = 0; i < s.size(); i += len) {
      const uint32_t c = decode_utf8(s, i, &len);
      if (is_white_space(c)) {
        flush(i);
        start = i + len;
        continue;
      }
      const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
      const bool punct = punctuation && ((c < 0x80 && std::ispunct(static_cast<int>(c))) ||
                         (cat >= UTF8PROC_CATEGORY_PC && cat <= UTF8PROC_CATEGORY_PO));
      if (punct) {
        flush(i);
        sub.push_back(Piece{s.substr(i, len), -1, p.at_origin && i == 0});
        start = i + len;
      }
    }
    flush(s.size());
  }

  static Behavior parse_behavior(const json& j, const Ctx& ctx, const std::string& where) {
    std::string b = ctx.str(j, "behavior", where);
    if (b == "Removed") return Behavior::kRemoved;
    if (b == "Isolated") return Behavior::kIsolated;
    if (b == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
    if (b == "MergedWithNext") return Behavior::kMergedWithNext;
    if (b == "Contiguous") return Behavior::kContiguous;
    ctx.fail(where, "split behavior \"" + b +
                        "\" is not supported (supported: Removed, Isolated, MergedWithPrevious, "
                        "MergedWithNext, Contiguous)");
  }

  static PreTokenizer parse(const json& j, const Ctx& ctx, const std::string& where) {
    PreTokenizer p{};
    std::string t = ctx.type(j, where);
    if (t == "Sequence") {
      p.kind = kSequence;
      const json& list = ctx.get(j, "pretokenizers", where);
      if (!list.is_array()) ctx.fail(where, "\"pretokenizers\" must be a list");
      for (size_t i = 0; i < list.size(); ++i)
        p.children.push_back(parse(list[i], ctx, where + ".pretokenizers[" + std::to_string(i) + "]"));
    } else if (t == "ByteLevel") {
      p.kind = kByteLevel;
      p.add_prefix_space = ctx.boolean(j, "add_prefix_space", true, where);
      p.use_regex = ctx.boolean(j, "use_regex", true, where);
    } else if (t == "Split") {
      p.kind = kSplit;
      p.pattern = ctx.pattern(j, "pattern", where);
      p.behavior = parse_behavior(j, ctx, where);
      p.invert = ctx.boolean(j, "invert", false, where);
    } else if (t == "Metaspace") {
      p.kind = kMetaspace;
      p.replacement = ctx.str(j, "replacement", where);
      p.scheme = parse_prepend_scheme(j, ctx, where);
      p.split = ctx.boolean(j, "split", true, where);
    } else if (t == "Digits") {
      p.kind = kDigits;
      const bool individual = ctx.boolean(j, "individual_digits", false, where);
      p.pattern.regex = std::make_shared<Regex>(individual ? "\\p{N}" : "\\p{N}+", ctx.file());
      p.behavior = Behavior::kIsolated;
    } else if (t == "BertPreTokenizer") {
      p.kind = kBert;
    } else if (t == "WhitespaceSplit") {
      p.kind = kWhitespaceSplit;
    } else {
      ctx.fail(where, "pre-tokenizer type \"" + t +
                          "\" is not supported (supported: ByteLevel, Split, Metaspace, Digits, "
                          "BertPreTokenizer, WhitespaceSplit, Sequence)");
    }
    return p;
  }
};

// ---------------------------------------------------------------- decoders

struct Decoder {
  enum Kind { kSequence, kByteLevel, kMetaspace, kByteFallback, kFuse, kStrip, kReplace, kBpe, kWordPiece } kind;
  std::vector<Decoder> children;
  std::string replacement;  // Metaspace
  uint32_t replacement_cp = 0;
  PrependScheme scheme = PrependScheme::kAlways;
  uint32_t content_cp = 0;  // Strip
  int64_t start = 0, stop = 0;
  Pattern pattern;          // Replace
  std::string content;      // Replace: the replacement; BPEDecoder: the suffix; WordPiece: the prefix
  bool cleanup = true;      // WordPiece

  void decode_chain(std::vector<std::string>& tokens) const {
    switch (kind) {
      case kSequence:
        for (const auto& c : children) c.decode_chain(tokens);
        break;
      case kByteLevel: {
        const auto& table = char_to_byte();
        std::string bytes;
        for (const auto& t : tokens) {
          std::string mapped;
          bool ok = true;
          for (size_t i = 0, len = 0; i < t.size(); i += len) {
            auto it = table.find(decode_utf8(t, i, &len));
            if (it == table.end()) {
              ok = false;
              break;
            }
            mapped.push_back(static_cast<char>(it->second));
          }
          bytes += ok ? mapped : t;
        }
        tokens.assign(1, from_utf8_lossy(bytes));
        break;
      }
      case kMetaspace:
        for (size_t i = 0; i < tokens.size(); ++i) {
          std::string out;
          const std::string& t = tokens[i];
          for (size_t k = 0, len = 0; k < t.size(); k += len) {
            uint32_t c = decode_utf8(t, k, &len);
            if (c == replacement_cp) {
              if (!(i == 0 && scheme != PrependScheme::kNever)) out.push_back(' ');
            } else {
              out.append(t, k, len);
            }
          }
          tokens[i] = std::move(out);
        }
        break;
      case kByteFallback: {
        std::vector<std::string> out;
        std::string pending;
        size_t pending_n = 0;
        auto flush = [&] {
          if (pending_n == 0) return;
          if (valid_utf8(pending)) {
            out.push_back(pending);
          } else {
            for (size_t k = 0; k < pending_n; ++k) out.push_back("\xEF\xBF\xBD");
          }
          pending.clear();
          pending_n = 0;
        };
        for (auto& t : tokens) {
          bool is_byte = t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
                         std::isxdigit(static_cast<unsigned char>(t[3])) &&
                         std::isxdigit(static_cast<unsigned char>(t[4]));
          if (is_byte) {
            pending.push_back(static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16)));
            ++pending_n;
          } else {
            flush();
            out.push_back(std::move(t));
          }
        }
        flush();
        tokens = std::move(out);
        break;
      }
      case kFuse: {
        std::string all;
        for (const auto& t : tokens) all += t;
        tokens.assign(1, all);
        break;
      }
      case kStrip:
        for (auto& t : tokens) {
          std::vector<std::pair<size_t, uint32_t>> cps;  // (byte offset, code point)
          for (size_t k = 0, len = 0; k < t.size(); k += len) cps.emplace_back(k, decode_utf8(t, k, &len));
          size_t b = 0, e = cps.size();
          for (int64_t k = 0; k < start && b < cps.size() && cps[b].second == content_cp; ++k) ++b;
          for (int64_t k = 0; k < stop && e > 0 && e - 1 < cps.size() && cps[e - 1].second == content_cp; ++k) --e;
          if (e < b) e = b;
          size_t bb = b < cps.size() ? cps[b].first : t.size();
          size_t ee = e < cps.size() ? cps[e].first : t.size();
          t = t.substr(bb, ee - bb);
        }
        break;
      case kReplace:
        for (auto& t : tokens) t = pattern.replace_all(t, content);
        break;
      case kBpe:  // BPEDecoder: the word suffix becomes " ", "" on the last token
        for (size_t i = 0; i < tokens.size(); ++i)
          tokens[i] = Pattern{content, nullptr}.replace_all(tokens[i], i + 1 == tokens.size() ? "" : " ");
        break;
      case kWordPiece:
        wordpiece_decode(tokens, content, cleanup);
        break;
    }
  }

  static uint32_t single_char(const std::string& s, const Ctx& ctx, const std::string& where,
                              const char* field) {
    size_t len = 0;
    if (s.empty() || (decode_utf8(s, 0, &len), len != s.size()))
      ctx.fail(where, std::string("\"") + field + "\" must be a single character");
    return decode_utf8(s, 0, &len);
  }

  static Decoder parse(const json& j, const Ctx& ctx, const std::string& where) {
    Decoder d{};
    std::string t = ctx.type(j, where);
    if (t == "Sequence") {
      d.kind = kSequence;
      const json& list = ctx.get(j, "decoders", where);
      if (!list.is_array()) ctx.fail(where, "\"decoders\" must be a list");
      for (size_t i = 0; i < list.size(); ++i)
        d.children.push_back(parse(list[i], ctx, where + ".decoders[" + std::to_string(i) + "]"));
    } else if (t == "ByteLevel") {
      d.kind = kByteLevel;
    } else if (t == "Metaspace") {
      d.kind = kMetaspace;
      d.replacement = ctx.str(j, "replacement", where);
      d.replacement_cp = single_char(d.replacement, ctx, where, "replacement");
      d.scheme = parse_prepend_scheme(j, ctx, where);
    } else if (t == "ByteFallback") {
      d.kind = kByteFallback;
    } else if (t == "Fuse") {
      d.kind = kFuse;
    } else if (t == "Strip") {
      d.kind = kStrip;
      d.content_cp = single_char(ctx.str(j, "content", where), ctx, where, "content");
      d.start = ctx.integer(j, "start", 0, where);
      d.stop = ctx.integer(j, "stop", 0, where);
    } else if (t == "Replace") {
      d.kind = kReplace;
      d.pattern = ctx.pattern(j, "pattern", where);
      d.content = ctx.str(j, "content", where);
    } else if (t == "BPEDecoder") {
      d.kind = kBpe;
      d.content = j.contains("suffix") && !j.at("suffix").is_null() ? ctx.str(j, "suffix", where) : "</w>";
    } else if (t == "WordPiece") {
      d.kind = kWordPiece;
      d.content = j.contains("prefix") && !j.at("prefix").is_null() ? ctx.str(j, "prefix", where) : "##";
      d.cleanup = ctx.boolean(j, "cleanup", true, where);
    } else {
      ctx.fail(where, "decoder type \"" + t +
                          "\" is not supported (supported: ByteLevel, Metaspace, ByteFallback, "
                          "Fuse, Strip, Replace, BPEDecoder, WordPiece, Sequence)");
    }
    return d;
  }
};

// ---------------------------------------------------------------- post-processors

struct PostProcessor {
  enum Kind { kSequence, kTemplate, kByteLevel } kind;
  std::vector<PostProcessor> children;
  // TemplateProcessing's single template: -1 = the sequence, else a special token's ids.
  std::vector<std::vector<int64_t>> single;

  void apply(std::vector<int64_t>& ids) const {
    if (kind == kSequence) {
      for (const auto& c : children) c.apply(ids);
    } else if (kind == kTemplate) {
      std::vector<int64_t> out;
      out.reserve(ids.size() + 4);
      for (const auto& item : single) {
        if (item.size() == 1 && item[0] == -1) {
          out.insert(out.end(), ids.begin(), ids.end());
        } else {
          out.insert(out.end(), item.begin(), item.end());
        }
      }
      ids = std::move(out);
    }
  }

  // Ids before and after the sequence in the single template.
  void affixes(std::vector<int64_t>* prefix, std::vector<int64_t>* suffix) const {
    if (kind == kSequence) {
      for (const auto& c : children) c.affixes(prefix, suffix);
      return;
    }
    if (kind != kTemplate) return;
    std::vector<int64_t> pre, post;
    bool seen = false;
    for (const auto& item : single) {
      if (item.size() == 1 && item[0] == -1) {
        seen = true;
      } else {
        (seen ? post : pre).insert((seen ? post : pre).end(), item.begin(), item.end());
      }
    }
    prefix->insert(prefix->begin(), pre.begin(), pre.end());
    suffix->insert(suffix->end(), post.begin(), post.end());
  }

  static PostProcessor parse(const json& j, const Ctx& ctx, const std::string& where) {
    PostProcessor p{};
    std::string t = ctx.type(j, where);
    if (t == "Sequence") {
      p.kind = kSequence;
      const json& list = ctx.get(j, "processors", where);
      if (!list.is_array()) ctx.fail(where, "\"processors\" must be a list");
      for (size_t i = 0; i < list.size(); ++i)
        p.children.push_back(parse(list[i], ctx, where + ".processors[" + std::to_string(i) + "]"));
    } else if (t == "ByteLevel") {
      p.kind = kByteLevel;  // only moves offsets (trim_offsets); ids are unchanged
    } else if (t == "RobertaProcessing" || t == "BertProcessing") {
      p.kind = kTemplate;  // single: cls $A sep (the pair form and offsets do not change single ids)
      for (const char* key : {"cls", "sep"}) {
        const json& v = ctx.get(j, key, where);
        if (!v.is_array() || v.size() != 2 || !v[1].is_number_integer())
          ctx.fail(where, std::string("\"") + key + "\" must be [token, id]");
        if (std::string(key) == "sep") p.single.push_back({-1});
        p.single.push_back({v[1].get<int64_t>()});
      }
    } else if (t == "TemplateProcessing") {
      p.kind = kTemplate;
      const json& specials = ctx.get(j, "special_tokens", where);
      if (!specials.is_object()) ctx.fail(where, "\"special_tokens\" must be an object");
      const json& single = ctx.get(j, "single", where);
      if (!single.is_array()) ctx.fail(where, "\"single\" must be a list");
      for (const json& item : single) {
        if (item.is_object() && item.contains("Sequence")) {
          p.single.push_back({-1});
        } else if (item.is_object() && item.contains("SpecialToken")) {
          std::string id = ctx.str(item.at("SpecialToken"), "id", where + ".single");
          if (!specials.contains(id))
            ctx.fail(where, "special token \"" + id + "\" of the template is not in special_tokens");
          const json& ids = ctx.get(specials.at(id), "ids", where + ".special_tokens");
          std::vector<int64_t> v;
          for (const json& x : ids) {
            if (!x.is_number_integer()) ctx.fail(where, "special_tokens ids must be integers");
            v.push_back(x.get<int64_t>());
          }
          p.single.push_back(v);
        } else {
          ctx.fail(where, "template items must be {\"Sequence\": ...} or {\"SpecialToken\": ...}, got " +
                              item.dump());
        }
      }
    } else {
      ctx.fail(where, "post-processor type \"" + t +
                          "\" is not supported (supported: TemplateProcessing, RobertaProcessing, "
                          "BertProcessing, ByteLevel, Sequence)");
    }
    return p;
  }
};

// ---------------------------------------------------------------- BPE

std::atomic<uint64_t> g_instance{0};
constexpr size_t kCacheCapacity = 10000;
constexpr size_t kCacheMaxLength = 256;

struct Bpe final : TokenizerModel {
  std::unordered_map<std::string, int64_t> vocab;
  std::vector<std::string> tokens;  // id -> token, "" for holes
  std::unordered_map<uint64_t, std::pair<uint32_t, int64_t>> merges;  // (a, b) -> (rank, new id)
  std::optional<std::string> unk_token;
  std::optional<int64_t> unk_id;
  std::optional<std::string> prefix, suffix;
  bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
  std::array<int64_t, 256> byte_ids{};  // <0xHH> ids, -1 when absent
  uint64_t instance = 0;

  static uint64_t key(int64_t a, int64_t b) {
    return (static_cast<uint64_t>(a) << 32) | static_cast<uint64_t>(b);
  }

  const std::vector<std::string>& id_to_token() const override { return tokens; }
  const char* type() const override { return "BPE"; }

  std::optional<int64_t> lookup(const std::string& s) const override {
    auto it = vocab.find(s);
    if (it == vocab.end()) return std::nullopt;
    return it->second;
  }

  struct Symbol {
    int64_t c;
    int64_t prev, next;
    size_t len;
  };
  struct Merge {
    size_t pos;
    uint32_t rank;
    int64_t new_id;
    bool operator<(const Merge& o) const {  // max-heap: smallest rank, then smallest pos on top
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };

  void merge_word(const std::string& w, std::vector<int64_t>* out) const {
    std::vector<Symbol> sym;
    sym.reserve(w.size());
    auto add = [&](int64_t id, size_t len) {
      int64_t n = static_cast<int64_t>(sym.size());
      sym.push_back({id, n - 1, -1, len});
      if (n > 0) sym[n - 1].next = n;
    };
    bool has_unk = false;  // a pending unk (fused over consecutive unknown characters)
    int64_t unk_c = 0;
    size_t unk_len = 0;
    std::string s;
    for (size_t i = 0, len = 0; i < w.size(); i += len) {
      decode_utf8(w, i, &len);
      const bool first = i == 0, last = i + len >= w.size();
      s.assign(w, i, len);
      if (!first && prefix) s = *prefix + s;
      if (last && suffix) s += *suffix;
      if (auto id = lookup(s)) {
        if (has_unk) {
          add(unk_c, unk_len);
          has_unk = false;
        }
        add(*id, len);
        continue;
      }
      if (byte_fallback) {
        bool all = true;
        for (unsigned char b : s) all = all && byte_ids[b] >= 0;
        if (all) {
          for (unsigned char b : s) add(byte_ids[b], 1);
          continue;
        }
      }
      if (unk_token) {
        ALPACA_CHECK(unk_id, "the BPE unk_token '" << *unk_token << "' is not in the vocabulary");
        if (has_unk && fuse_unk) {
          unk_len += len;
        } else {
          if (has_unk) add(unk_c, unk_len);
          has_unk = true;
          unk_c = *unk_id;
          unk_len = len;
        }
      }
    }
    if (has_unk) add(unk_c, unk_len);

    std::priority_queue<Merge> queue;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      auto it = merges.find(key(sym[i].c, sym[i + 1].c));
      if (it != merges.end()) queue.push({i, it->second.first, it->second.second});
    }
    while (!queue.empty()) {
      Merge top = queue.top();
      queue.pop();
      Symbol& cur = sym[top.pos];
      if (cur.len == 0 || cur.next == -1) continue;
      const size_t next_pos = static_cast<size_t>(cur.next);
      const Symbol right = sym[next_pos];
      auto it = merges.find(key(cur.c, right.c));
      if (it == merges.end() || it->second.second != top.new_id) continue;
      cur.c = top.new_id;
      cur.len += right.len;
      cur.next = right.next;
      sym[next_pos].len = 0;
      if (right.next > -1 && static_cast<size_t>(right.next) < sym.size())
        sym[static_cast<size_t>(right.next)].prev = static_cast<int64_t>(top.pos);
      if (cur.prev >= 0) {
        auto p = merges.find(key(sym[static_cast<size_t>(cur.prev)].c, cur.c));
        if (p != merges.end())
          queue.push({static_cast<size_t>(cur.prev), p->second.first, p->second.second});
      }
      if (cur.next >= 0 && static_cast<size_t>(cur.next) < sym.size()) {
        auto n = merges.find(key(cur.c, sym[static_cast<size_t>(cur.next)].c));
        if (n != merges.end()) queue.push({top.pos, n->second.first, n->second.second});
      }
    }
    for (const auto& x : sym)
      if (x.len != 0) out->push_back(x.c);
  }

  void tokenize(const std::string& s, std::vector<int64_t>* out) const override {
    if (s.empty()) return;
    if (ignore_merges) {
      if (auto id = lookup(s)) {
        out->push_back(*id);
        return;
      }
    }
    // Per-thread word cache, as the library's (capacity 10,000 words shorter than 256 bytes).
    thread_local std::unordered_map<uint64_t, std::unordered_map<std::string, std::vector<int64_t>>> caches;
    if (caches.size() > 8 && !caches.count(instance)) caches.clear();  // tokenizers come and go
    auto& cache = caches[instance];
    auto hit = cache.find(s);
    if (hit != cache.end()) {
      out->insert(out->end(), hit->second.begin(), hit->second.end());
      return;
    }
    const size_t before = out->size();
    merge_word(s, out);
    if (s.size() < kCacheMaxLength && cache.size() < kCacheCapacity)
      cache.emplace(s, std::vector<int64_t>(out->begin() + static_cast<std::ptrdiff_t>(before), out->end()));
  }

  static std::unique_ptr<Bpe> parse(const json& j, const Ctx& ctx) {
    const std::string where = "model";
    auto owned = std::make_unique<Bpe>();
    Bpe& m = *owned;
    m.instance = ++g_instance;
    if (j.contains("dropout") && !j.at("dropout").is_null()) {
      const json& d = j.at("dropout");
      if (!d.is_number() || d.get<double>() != 0.0)
        ctx.fail(where, "BPE dropout " + d.dump() + " is not supported (supported: null or 0)");
    }
    const json& vocab = ctx.get(j, "vocab", where);
    if (!vocab.is_object()) ctx.fail(where, "\"vocab\" must map token -> id");
    m.vocab.reserve(vocab.size());
    int64_t max_id = -1;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0)
        ctx.fail(where, "vocab id of " + json(it.key()).dump() + " must be a non-negative integer");
      int64_t id = it.value().get<int64_t>();
      m.vocab[it.key()] = id;
      max_id = std::max(max_id, id);
    }
    if (max_id >= static_cast<int64_t>(vocab.size()) + kMaxVocabHoles)
      ctx.fail(where, "vocab id " + std::to_string(max_id) + " is far beyond the vocabulary's " +
                          std::to_string(vocab.size()) + " entries (a corrupt id?)");
    m.tokens.assign(static_cast<size_t>(max_id + 1), std::string());
    for (const auto& [tok, id] : m.vocab) m.tokens[static_cast<size_t>(id)] = tok;
    m.unk_token = ctx.opt_str(j, "unk_token", where);
    if (m.unk_token) m.unk_id = m.lookup(*m.unk_token);
    m.prefix = ctx.opt_str(j, "continuing_subword_prefix", where);
    m.suffix = ctx.opt_str(j, "end_of_word_suffix", where);
    m.fuse_unk = ctx.boolean(j, "fuse_unk", false, where);
    m.byte_fallback = ctx.boolean(j, "byte_fallback", false, where);
    m.ignore_merges = ctx.boolean(j, "ignore_merges", false, where);
    for (int b = 0; b < 256; ++b) {
      char code[8];
      std::snprintf(code, sizeof code, "<0x%02X>", b);
      m.byte_ids[b] = m.lookup(code).value_or(-1);
    }
    const json& merges = ctx.get(j, "merges", where);
    if (!merges.is_array()) ctx.fail(where, "\"merges\" must be a list");
    const size_t prefix_len = m.prefix ? m.prefix->size() : 0;
    m.merges.reserve(merges.size());
    uint32_t rank = 0;
    for (const json& x : merges) {
      std::string a, b;
      if (x.is_string()) {
        const std::string s = x.get<std::string>();
        size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          ctx.fail(where, "merge " + x.dump() + " must be two tokens separated by one space");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (x.is_array() && x.size() == 2 && x[0].is_string() && x[1].is_string()) {
        a = x[0].get<std::string>();
        b = x[1].get<std::string>();
      } else {
        ctx.fail(where, "merge " + x.dump() + " must be \"a b\" or [\"a\", \"b\"]");
      }
      auto ia = m.lookup(a), ib = m.lookup(b);
      if (!ia || !ib) ctx.fail(where, "merge " + x.dump() + " uses a token that is not in the vocab");
      const std::string merged = a + (b.size() >= prefix_len ? b.substr(prefix_len) : std::string());
      auto in = m.lookup(merged);
      if (!in) ctx.fail(where, "merge " + x.dump() + " makes " + json(merged).dump() +
                                   ", which is not in the vocab");
      m.merges[key(*ia, *ib)] = {rank++, *in};
    }
    return owned;
  }
};

// The tokenizer.json "model": BPE here, Unigram (unigram.cpp), WordPiece (wordpiece.cpp). A model
// without "type" (old files) is read as the library guesses it from its fields.
std::unique_ptr<TokenizerModel> parse_model(const json& j, const Ctx& ctx) {
  if (!j.is_object()) ctx.fail("model", "must be a JSON object");
  std::string t = j.contains("type") ? ctx.str(j, "type", "model") : "";
  if (t.empty()) t = j.contains("merges") ? "BPE" : j.contains("max_input_chars_per_word") ? "WordPiece" : "Unigram";
  if (t == "BPE") return Bpe::parse(j, ctx);
  if (t == "Unigram") return parse_unigram(j, ctx.file());
  if (t == "WordPiece") return parse_wordpiece(j, ctx.file());
  ctx.fail("model", "model type \"" + t + "\" is not supported (supported: BPE, Unigram, WordPiece)");
}

}  // namespace

// ---------------------------------------------------------------- the tokenizer

struct HfTokenizer::Impl {
  std::string source;
  json doc;  // the document as read; to_json() refreshes its added_tokens
  std::unique_ptr<TokenizerModel> model;  // BPE, Unigram or WordPiece
  std::optional<Normalizer> normalizer;
  std::optional<PreTokenizer> pre_tokenizer;
  std::optional<PostProcessor> post_processor;
  std::optional<Decoder> decoder;
  std::vector<AddedToken> added;                         // id order
  std::unordered_map<std::string, size_t> added_index;   // content -> index in `added`
  std::unordered_map<int64_t, size_t> added_by_id;
  std::unordered_map<int64_t, std::string> normalized_form;  // normalized tokens whose form differs
  // Matching: per first byte, candidate (pattern, index) sorted longest first.
  std::array<std::vector<std::pair<std::string, size_t>>, 256> raw_first, norm_first;
  // token_bytes of every id, made on first use (masking asks it for every token of every row);
  // dropped when the added tokens change. Read and set with std::atomic_load/atomic_store.
  std::shared_ptr<const std::vector<std::string>> bytes_by_id;

  void rebuild() {
    std::atomic_store(&bytes_by_id, std::shared_ptr<const std::vector<std::string>>());
    std::sort(added.begin(), added.end(),
              [](const AddedToken& a, const AddedToken& b) { return a.id < b.id; });
    added_index.clear();
    added_by_id.clear();
    normalized_form.clear();
    for (auto& v : raw_first) v.clear();
    for (auto& v : norm_first) v.clear();
    for (size_t i = 0; i < added.size(); ++i) {
      const AddedToken& t = added[i];
      added_index[t.content] = i;
      added_by_id[t.id] = i;
      std::string pattern = t.content;
      if (t.normalized && normalizer) {
        normalizer->normalize(pattern);
        if (pattern != t.content) normalized_form[t.id] = pattern;
      }
      if (pattern.empty()) continue;
      auto& table = t.normalized ? norm_first : raw_first;
      table[static_cast<unsigned char>(pattern[0])].emplace_back(pattern, i);
    }
    for (auto* table : {&raw_first, &norm_first})
      for (auto& v : *table)
        std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
          return a.first.size() > b.first.size();
        });
  }

  // AddedVocabulary::find_matches + split_with_indices on one piece.
  void split_added(const Piece& p, bool normalized_set, std::vector<Piece>& sub) const {
    const auto& table = normalized_set ? norm_first : raw_first;
    const std::string& s = p.s;
    struct M {
      size_t start, stop, index;
    };
    std::vector<M> matches;
    for (size_t i = 0; i < s.size();) {
      const auto& cands = table[static_cast<unsigned char>(s[i])];
      const std::pair<std::string, size_t>* best = nullptr;
      for (const auto& c : cands)
        if (s.compare(i, c.first.size(), c.first) == 0) {
          best = &c;
          break;
        }
      if (!best) {
        ++i;
        continue;
      }
      matches.push_back({i, i + best->first.size(), best->second});
      i += best->first.size();
    }
    if (matches.empty()) {
      sub.push_back(p);
      return;
    }
    size_t start_offset = 0;
    for (const auto& m : matches) {
      const AddedToken& t = added[m.index];
      size_t start = m.start, stop = m.stop;
      if (t.single_word) {
        bool start_space = start == 0 || !is_word_char(last_code_point(s, start));
        size_t len = 0;
        bool stop_space = stop == s.size() || !is_word_char(decode_utf8(s, stop, &len));
        if (!start_space || !stop_space) continue;
      }
      if (t.lstrip) {
        size_t ns = start;
        while (ns > 0) {
          size_t i = ns - 1;
          while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
          size_t len = 0;
          if (!is_white_space(decode_utf8(s, i, &len))) break;
          ns = i;
        }
        start = std::max(ns, start_offset);
      }
      if (t.rstrip) {
        for (size_t len = 0; stop < s.size(); stop += len)
          if (!is_white_space(decode_utf8(s, stop, &len))) break;
      }
      if (start_offset < start)
        sub.push_back(Piece{s.substr(start_offset, start - start_offset), -1,
                            p.at_origin && start_offset == 0});
      sub.push_back(Piece{s.substr(start, stop - start), t.id, false});
      start_offset = stop;
    }
    if (start_offset != s.size())
      sub.push_back(Piece{s.substr(start_offset), -1, p.at_origin && start_offset == 0});
  }

  std::vector<int64_t> encode(const std::string& text, bool add_special) const {
    std::vector<Piece> pieces{Piece{text, -1, true}};
    split_pieces(pieces, [&](Piece& p, std::vector<Piece>& sub) { split_added(p, false, sub); });
    split_pieces(pieces, [&](Piece& p, std::vector<Piece>& sub) {
      if (normalizer) normalizer->normalize(p.s);
      split_added(p, true, sub);
    });
    if (pre_tokenizer) pre_tokenizer->apply(pieces);
    std::vector<int64_t> ids;
    ids.reserve(text.size() / 3 + 4);
    for (const auto& p : pieces) {
      if (p.id >= 0) {
        ids.push_back(p.id);
      } else {
        model->tokenize(p.s, &ids);
      }
    }
    if (add_special && post_processor) post_processor->apply(ids);
    return ids;
  }

  std::optional<int64_t> token_to_id(const std::string& t) const {
    auto it = added_index.find(t);
    if (it != added_index.end()) return added[it->second].id;
    return model->lookup(t);
  }

  int64_t size() const {
    int64_t n = static_cast<int64_t>(model->id_to_token().size());
    if (!added.empty()) n = std::max(n, added.back().id + 1);
    return n;
  }

  void parse_added(const Ctx& ctx) {
    if (!doc.contains("added_tokens") || doc.at("added_tokens").is_null()) return;
    const json& list = doc.at("added_tokens");
    if (!list.is_array()) ctx.fail("added_tokens", "must be a list");
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string where = "added_tokens[" + std::to_string(i) + "]";
      const json& t = list[i];
      AddedToken a;
      a.content = ctx.str(t, "content", where);
      a.id = ctx.integer(t, "id", -1, where);
      if (a.id < 0) ctx.fail(where, "\"id\" must be a non-negative integer");
      a.special = ctx.boolean(t, "special", false, where);
      a.lstrip = ctx.boolean(t, "lstrip", false, where);
      a.rstrip = ctx.boolean(t, "rstrip", false, where);
      a.single_word = ctx.boolean(t, "single_word", false, where);
      a.normalized = ctx.boolean(t, "normalized", !a.special, where);
      if (a.content.empty()) continue;
      auto same = std::find_if(added.begin(), added.end(),
                               [&](const AddedToken& x) { return x.id == a.id; });
      if (same != added.end()) ctx.fail(where, "id " + std::to_string(a.id) + " is used twice");
      added.push_back(a);
    }
  }
};

HfTokenizer::HfTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HfTokenizer::~HfTokenizer() = default;

std::unique_ptr<HfTokenizer> HfTokenizer::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  ALPACA_CHECK(in.good(), "cannot open " << path << " for reading; check the path and permissions");
  std::ostringstream ss;
  ss << in.rdbuf();
  return from_json_string(ss.str(), path);
}

std::unique_ptr<HfTokenizer> HfTokenizer::from_json_string(const std::string& text,
                                                           const std::string& source) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    ALPACA_FAIL(source << ": not valid JSON (" << e.what()
                       << "); a tokenizer.json as written by the `tokenizers` library is expected");
  }
  return from_json(std::move(doc), source);
}

std::unique_ptr<HfTokenizer> HfTokenizer::from_json(json doc, const std::string& source) {
  auto impl = std::make_unique<Impl>();
  impl->source = source;
  Ctx ctx(source);
  impl->doc = std::move(doc);
  const json& d = impl->doc;
  ALPACA_CHECK(d.is_object() && d.contains("model"),
               source << ": not a tokenizer.json (a JSON object with \"model\", \"added_tokens\", "
                         "\"normalizer\", \"pre_tokenizer\", \"post_processor\", \"decoder\")");
  for (const char* k : {"truncation", "padding"})
    if (d.contains(k) && !d.at(k).is_null())
      ctx.fail(k, "is not supported in tokenizer.json (expected null; transformers sets these per call)");
  impl->model = parse_model(d.at("model"), ctx);
  if (d.contains("normalizer") && !d.at("normalizer").is_null())
    impl->normalizer = Normalizer::parse(d.at("normalizer"), ctx, "normalizer");
  if (d.contains("pre_tokenizer") && !d.at("pre_tokenizer").is_null())
    impl->pre_tokenizer = PreTokenizer::parse(d.at("pre_tokenizer"), ctx, "pre_tokenizer");
  if (d.contains("post_processor") && !d.at("post_processor").is_null())
    impl->post_processor = PostProcessor::parse(d.at("post_processor"), ctx, "post_processor");
  if (d.contains("decoder") && !d.at("decoder").is_null())
    impl->decoder = Decoder::parse(d.at("decoder"), ctx, "decoder");
  impl->parse_added(ctx);
  impl->rebuild();
  return std::unique_ptr<HfTokenizer>(new HfTokenizer(std::move(impl)));
}

std::unique_ptr<HfTokenizer> HfTokenizer::clone() const {
  return from_json_string(to_json(), impl_->source);
}

void HfTokenizer::set_post_processor(const json& processor) {
  impl_->post_processor = PostProcessor::parse(processor, Ctx(impl_->source), "post_processor");
  impl_->doc["post_processor"] = processor;
}

const std::string& HfTokenizer::source() const { return impl_->source; }
const json& HfTokenizer::document() const { return impl_->doc; }

std::vector<int64_t> HfTokenizer::encode(const std::string& text, bool add_special_tokens) const {
  return impl_->encode(text, add_special_tokens);
}

std::string HfTokenizer::decode(const std::vector<int64_t>& ids, bool skip_special) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  const int64_t n = size();
  for (int64_t id : ids) {
    ALPACA_CHECK(id >= 0 && id < n, "token id " << id << " is outside the vocabulary [0, " << n << ")");
    auto it = impl_->added_by_id.find(id);
    if (it != impl_->added_by_id.end()) {
      const AddedToken& t = impl_->added[it->second];
      if (skip_special && t.special) continue;
      auto nf = impl_->normalized_form.find(id);
      tokens.push_back(nf != impl_->normalized_form.end() ? nf->second : t.content);
      continue;
    }
    if (static_cast<size_t>(id) >= impl_->model->id_to_token().size() ||
        impl_->model->id_to_token()[static_cast<size_t>(id)].empty())
      continue;  // a hole in the vocabulary: the library skips it
    tokens.push_back(impl_->model->id_to_token()[static_cast<size_t>(id)]);
  }
  if (!impl_->decoder) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  impl_->decoder->decode_chain(tokens);
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

std::string sentencepiece_piece_bytes(const std::string& piece) {
  if (piece.size() == 6 && piece.compare(0, 3, "<0x") == 0 && piece[5] == '>' &&
      std::isxdigit(static_cast<unsigned char>(piece[3])) && std::isxdigit(static_cast<unsigned char>(piece[4])))
    return std::string(1, static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16)));
  static const std::string kUnderline = "\xE2\x96\x81";  // "▁"
  std::string out;
  for (size_t i = 0; i < piece.size();) {
    if (piece.compare(i, kUnderline.size(), kUnderline) == 0) {
      out.push_back(' ');
      i += kUnderline.size();
    } else {
      out.push_back(piece[i++]);
    }
  }
  return out;
}

namespace {
bool has_decoder(const Decoder& d, Decoder::Kind kind) {
  if (d.kind == kind) return true;
  for (const auto& c : d.children)
    if (has_decoder(c, kind)) return true;
  return false;
}
}  // namespace

std::string HfTokenizer::token_bytes(int64_t id) const {
  ALPACA_CHECK(id >= 0 && id < size(), "token id " << id << " is outside the vocabulary [0, " << size() << ")");
  auto table = std::atomic_load(&impl_->bytes_by_id);
  if (!table) {  // two threads may both make it: the same table either way
    auto made = std::make_shared<std::vector<std::string>>(static_cast<size_t>(size()));
    for (int64_t i = 0; i < size(); ++i) (*made)[static_cast<size_t>(i)] = compute_token_bytes(i);
    table = made;
    std::atomic_store(&impl_->bytes_by_id, table);
  }
  return (*table)[static_cast<size_t>(id)];
}

std::string HfTokenizer::compute_token_bytes(int64_t id) const {
  auto it = impl_->added_by_id.find(id);
  if (it != impl_->added_by_id.end()) return impl_->added[it->second].content;
  if (static_cast<size_t>(id) >= impl_->model->id_to_token().size()) return {};
  const std::string& piece = impl_->model->id_to_token()[static_cast<size_t>(id)];
  if (impl_->decoder && has_decoder(*impl_->decoder, Decoder::kByteLevel)) {
    const auto& table = char_to_byte();
    std::string bytes;
    for (size_t i = 0, len = 0; i < piece.size(); i += len) {
      auto b = table.find(decode_utf8(piece, i, &len));
      if (b == table.end()) return piece;  // not a byte-level piece: as written
      bytes.push_back(static_cast<char>(b->second));
    }
    return bytes;
  }
  if (std::string(impl_->model->type()) == "WordPiece")  // a word's text; "##" (the prefix) marks a continuation
    return piece.compare(0, 2, "##") == 0 ? piece.substr(2) : piece;
  return sentencepiece_piece_bytes(piece);
}

int64_t HfTokenizer::size() const { return impl_->size(); }
const char* HfTokenizer::model_type() const { return impl_->model->type(); }
int64_t HfTokenizer::model_size() const {
  return static_cast<int64_t>(impl_->model->id_to_token().size());
}

std::optional<int64_t> HfTokenizer::token_to_id(const std::string& token) const {
  return impl_->token_to_id(token);
}

std::optional<std::string> HfTokenizer::id_to_token(int64_t id) const {
  auto it = impl_->added_by_id.find(id);
  if (it != impl_->added_by_id.end()) return impl_->added[it->second].content;
  if (id >= 0 && static_cast<size_t>(id) < impl_->model->id_to_token().size() &&
      !impl_->model->id_to_token()[static_cast<size_t>(id)].empty())
    return impl_->model->id_to_token()[static_cast<size_t>(id)];
  return std::nullopt;
}

bool HfTokenizer::is_special(int64_t id) const {
  auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && impl_->added[it->second].special;
}

const std::vector<AddedToken>& HfTokenizer::added_tokens() const { return impl_->added; }

int64_t HfTokenizer::add_token(const std::string& content, bool special, bool lstrip) {
  ALPACA_CHECK(!content.empty(), "cannot add an empty token to the tokenizer");
  auto it = impl_->added_index.find(content);
  if (it != impl_->added_index.end()) {
    AddedToken& t = impl_->added[it->second];
    if (special && !t.special) {  // re-adding with other properties replaces them
      t.special = true;
      t.normalized = false;
      impl_->rebuild();
    }
    return t.id;
  }
  AddedToken t;
  t.content = content;
  t.special = special;
  t.normalized = !special;
  t.lstrip = lstrip;
  t.id = impl_->model->lookup(content).value_or(impl_->size());
  impl_->added.push_back(t);
  impl_->rebuild();
  return t.id;
}

std::vector<int64_t> HfTokenizer::template_prefix() const {
  std::vector<int64_t> pre, post;
  if (impl_->post_processor) impl_->post_processor->affixes(&pre, &post);
  return pre;
}

std::vector<int64_t> HfTokenizer::template_suffix() const {
  std::vector<int64_t> pre, post;
  if (impl_->post_processor) impl_->post_processor->affixes(&pre, &post);
  return post;
}

std::string HfTokenizer::to_json() const {
  json doc = impl_->doc;
  json list = json::array();
  for (const auto& t : impl_->added) {
    json o = json::object();
    o["id"] = t.id;
    o["content"] = t.content;
    o["single_word"] = t.single_word;
    o["lstrip"] = t.lstrip;
    o["rstrip"] = t.rstrip;
    o["normalized"] = t.normalized;
    o["special"] = t.special;
    list.push_back(o);
  }
  doc["added_tokens"] = list;
  return doc.dump(-1, ' ', false, json::error_handler_t::strict) + "\n";
}

}  // namespace alpaca::tokenizer::detail
