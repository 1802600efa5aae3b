// The normalizers of normalizers.h, each as the `tokenizers` crate runs it on a whole string.
#include "normalizers.h"

#include <utf8proc.h>

#include <cstdlib>
#include <map>

#include "alpaca/util/error.h"
#include "pre_tokenizers.h"
#include "precompiled.h"
#include "utf8.h"

namespace alpaca::tokenizer::detail {

namespace {
// The Unicode normalization forms by their tokenizer.json name, as utf8proc's options.
const std::map<std::string, int> kUnicodeForms = {{"NFC", UTF8PROC_COMPOSE},
                                                  {"NFKC", UTF8PROC_COMPOSE | UTF8PROC_COMPAT},
                                                  {"NFD", UTF8PROC_DECOMPOSE},
                                                  {"NFKD", UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT}};
}  // namespace

struct Normalizer::Node {
  enum Kind { kSequence, kPrepend, kReplace, kUnicode, kLowercase, kStrip, kBert, kPrecompiled, kStripAccents,
              kByteLevel } kind;
  std::vector<Node> children;
  std::string text;  // Prepend: prepend; Replace: content
  Pattern pattern;
  bool left = false, right = false;
  int unicode_options = 0;  // NFC, NFKC, NFD, NFKD: utf8proc's options for the form
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
        const bool tnr = c == '\t' || c == '\n' || c == '\r', ws = tnr || is_white_space(c);
        const auto cat = category(c);
        // The crate's is_control (every C category but \t \n \r) is checked first: a control character
        // that is also whitespace (\v, \f, U+0085) is removed, not made a space.
        const bool control = !tnr && (cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF ||
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
      case kUnicode:
        s = unicode(s, unicode_options);
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
      case kByteLevel: {  // every byte as ByteLevel's printable character (normalizers/byte_level.rs)
        const auto& table = byte_to_char();
        std::string out;
        out.reserve(s.size() * 2);
        for (unsigned char c : s) out += table[c];
        s = std::move(out);
        break;
      }
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

  // One step of the type `t` (json_context.h's parse_component reads a Sequence).
  static Node parse_step(const std::string& t, const json& j, const JsonContext& ctx, const std::string& where) {
    Node n{};
    if (t == "Prepend") {
      n.kind = kPrepend;
      n.text = ctx.str(j, "prepend", where);
    } else if (t == "Replace") {
      n.kind = kReplace;
      n.pattern = ctx.pattern(j, "pattern", where);
      n.text = ctx.str(j, "content", where);
    } else if (kUnicodeForms.count(t)) {
      n.kind = kUnicode;
      n.unicode_options = kUnicodeForms.at(t);
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
    } else if (t == "ByteLevel") {
      n.kind = kByteLevel;
    } else if (t == "Precompiled") {
      n.kind = kPrecompiled;
      n.charsmap = std::make_shared<Precompiled>(ctx.str(j, "precompiled_charsmap", where), ctx.file() + ": " + where);
    } else {
      ctx.unsupported(where, "normalizer type", t,
                      "Sequence, Prepend, Replace, NFC, NFKC, NFD, NFKD, Lowercase, Strip, StripAccents, "
                      "BertNormalizer, Precompiled, ByteLevel");
    }
    return n;
  }
};

Normalizer Normalizer::parse(const json& j, const JsonContext& ctx, const std::string& where) {
  return Normalizer(std::make_shared<const Node>(parse_component<Node>(j, ctx, where, "normalizers")));
}

void Normalizer::normalize(std::string& s) const { root_->normalize(s); }

}  // namespace alpaca::tokenizer::detail
