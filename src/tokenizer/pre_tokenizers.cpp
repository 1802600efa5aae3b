// The pre-tokenizers of pre_tokenizers.h, each as the `tokenizers` crate splits a piece.
#include "pre_tokenizers.h"

#include <utf8proc.h>

#include <cctype>
#include <optional>

#include "unicode_scripts.h"
#include "utf8.h"

namespace alpaca::tokenizer::detail {

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

namespace {

const Regex& gpt2_regex() {
  static const Regex re(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
                        "ByteLevel pre-tokenizer");
  return re;
}

// Whitespace's regex \w+|[^\w\s]+ with the regex crate's Unicode classes spelled out: \w is
// Alphabetic (which has letters outside \p{L}, e.g. circled Ⓐ), marks, Nd, Pc and the joiners;
// \s is White_Space. PCRE2's own \w under UCP is only \p{L}\p{N}_ (no marks), so it is not used.
const std::shared_ptr<Regex>& whitespace_regex() {
  static const auto re = std::make_shared<Regex>(
      R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}]+|[^\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}\p{White_Space}]+)",
      "Whitespace pre-tokenizer");
  return re;
}

// The crate's Pattern for a char predicate (pattern.rs): every accepted character is a match of
// its own (Contiguous merges neighbours later), with the text between them as non-matches.
template <typename Pred>
void find_char_matches(const std::string& s, Pred&& accept, std::vector<Match>* out) {
  out->clear();
  size_t last = 0;
  for (size_t i = 0, len = 0; i < s.size(); i += len) {
    if (!accept(decode_utf8(s, i, &len))) continue;
    if (last < i) out->push_back({last, i, false});
    out->push_back({i, i + len, true});
    last = i + len;
  }
  if (last < s.size() || s.empty()) out->push_back({last, s.size(), false});
}

// The crate's is_punc (BertPreTokenizer, Punctuation): ASCII punctuation or a Unicode P* category.
bool is_punctuation(uint32_t c) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return (c < 0x80 && std::ispunct(static_cast<int>(c))) || (cat >= UTF8PROC_CATEGORY_PC && cat <= UTF8PROC_CATEGORY_PO);
}

}  // namespace

PrependScheme parse_prepend_scheme(const json& j, const JsonContext& ctx, const std::string& where) {
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

struct PreTokenizer::Node {
  // Whitespace is a kSplit on whitespace_regex(); Punctuation and CharDelimiterSplit split at
  // single characters (kCharSplit: is_punctuation, or `delimiter`).
  enum Kind { kSequence, kByteLevel, kSplit, kMetaspace, kDigits, kBert, kWhitespaceSplit, kCharSplit, kScripts } kind;
  std::vector<Node> children;
  bool add_prefix_space = false, use_regex = true;  // ByteLevel
  Pattern pattern;                                  // Split; Digits (\p{N} or \p{N}+); Whitespace
  Behavior behavior = Behavior::kIsolated;          // Split, Punctuation, CharDelimiterSplit
  std::optional<uint32_t> delimiter;                // CharDelimiterSplit; none: Punctuation
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
      case kCharSplit:
        split_pieces(pieces, [&](Piece& p, std::vector<Piece>& sub) {
          if (delimiter) {
            find_char_matches(p.s, [&](uint32_t c) { return c == *delimiter; }, &m);
          } else {
            find_char_matches(p.s, is_punctuation, &m);
          }
          slice_into(p, split_ranges(m, behavior, false), sub);
        });
        break;
      case kScripts:
        split_pieces(pieces, [&](Piece& p, std::vector<Piece>& sub) { split_scripts(p, sub); });
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
      if (punctuation && is_punctuation(c)) {
        flush(i);
        sub.push_back(Piece{s.substr(i, len), -1, p.at_origin && i == 0});
        start = i + len;
      }
    }
    flush(s.size());
  }

  // UnicodeScripts (unicode_scripts/pre_tokenizer.rs): a cut before every character whose script
  // differs from the last one seen. script_of() gives kAnyScript (never cuts, never "seen") to
  // spaces and to the code points the crate's table leaves out; the first cut is at the first
  // character of another script, so leading kAnyScript characters are dropped (as the crate does).
  static void split_scripts(const Piece& p, std::vector<Piece>& sub) {
    const std::string& s = p.s;
    std::vector<size_t> cuts;
    int last = -1;  // none seen yet
    for (size_t i = 0, len = 0; i < s.size(); i += len) {
      const int script = script_of(decode_utf8(s, i, &len));
      if (script == kAnyScript) continue;
      if (script != last) cuts.push_back(i);
      last = script;
    }
    cuts.push_back(s.size());
    std::vector<std::pair<size_t, size_t>> ranges;
    for (size_t k = 0; k + 1 < cuts.size(); ++k) ranges.emplace_back(cuts[k], cuts[k + 1]);
    slice_into(p, ranges, sub);
  }

  static Behavior parse_behavior(const json& j, const JsonContext& ctx, const std::string& where) {
    if (!j.contains("behavior") || j.at("behavior").is_null()) return Behavior::kIsolated;  // Punctuation's default
    std::string b = ctx.str(j, "behavior", where);
    if (b == "Removed") return Behavior::kRemoved;
    if (b == "Isolated") return Behavior::kIsolated;
    if (b == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
    if (b == "MergedWithNext") return Behavior::kMergedWithNext;
    if (b == "Contiguous") return Behavior::kContiguous;
    ctx.unsupported(where, "split behavior", b, "Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
  }

  // One step of the type `t` (json_context.h's parse_component reads a Sequence).
  static Node parse_step(const std::string& t, const json& j, const JsonContext& ctx, const std::string& where) {
    Node p{};
    if (t == "ByteLevel") {
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
    } else if (t == "Whitespace") {  // the regex's matches kept, the rest (whitespace) removed
      p.kind = kSplit;
      p.pattern.regex = whitespace_regex();
      p.behavior = Behavior::kRemoved;
      p.invert = true;
    } else if (t == "Punctuation") {
      p.kind = kCharSplit;
      p.behavior = parse_behavior(j, ctx, where);
    } else if (t == "CharDelimiterSplit") {
      p.kind = kCharSplit;
      p.behavior = Behavior::kRemoved;
      const std::string d = ctx.str(j, "delimiter", where);
      size_t len = 0;
      if (d.empty() || (decode_utf8(d, 0, &len), len != d.size()))
        ctx.fail(where, "\"delimiter\" must be a single character (the crate's CharDelimiterSplit takes a char)");
      p.delimiter = decode_utf8(d, 0, &len);
    } else if (t == "UnicodeScripts") {
      p.kind = kScripts;
    } else {
      ctx.unsupported(where, "pre-tokenizer type", t,
                      "ByteLevel, Split, Metaspace, Digits, BertPreTokenizer, WhitespaceSplit, Whitespace, "
                      "Punctuation, CharDelimiterSplit, UnicodeScripts, Sequence");
    }
    return p;
  }
};

PreTokenizer PreTokenizer::parse(const json& j, const JsonContext& ctx, const std::string& where) {
  return PreTokenizer(std::make_shared<const Node>(parse_component<Node>(j, ctx, where, "pretokenizers")));
}

void PreTokenizer::apply(std::vector<Piece>& pieces) const { root_->apply(pieces); }

}  // namespace alpaca::tokenizer::detail
