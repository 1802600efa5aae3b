// The decoders of decoders.h, each as the `tokenizers` crate rewrites the token list.
#include "decoders.h"

#include <cctype>

#include "pre_tokenizers.h"
#include "tokenizer_model.h"
#include "utf8.h"

namespace alpaca::tokenizer::detail {
namespace {

// ByteLevel: every token's characters back to the bytes they stand for (a token with a character
// outside the alphabet stays as written), all joined into one lossily decoded string.
void byte_level_decode(std::vector<std::string>& tokens) {
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
}

// Metaspace: the replacement character becomes a space, except at the start of the first token
// unless the prepend scheme is "never".
void metaspace_decode(std::vector<std::string>& tokens, uint32_t replacement_cp, PrependScheme scheme) {
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
}

// ByteFallback: runs of <0xNN> tokens become their bytes when those are valid UTF-8, else one
// U+FFFD per byte token.
void byte_fallback_decode(std::vector<std::string>& tokens) {
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
}

// Strip: up to `start` leading and `stop` trailing `content_cp` characters off every token.
void strip_decode(std::vector<std::string>& tokens, uint32_t content_cp, int64_t start, int64_t stop) {
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
}

}  // namespace

struct Decoder::Node {
  enum Kind { kSequence, kByteLevel, kMetaspace, kByteFallback, kFuse, kStrip, kReplace, kBpe, kWordPiece } kind;
  std::vector<Node> children;
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
      case kByteLevel:
        byte_level_decode(tokens);
        break;
      case kMetaspace:
        metaspace_decode(tokens, replacement_cp, scheme);
        break;
      case kByteFallback:
        byte_fallback_decode(tokens);
        break;
      case kFuse: {
        std::string all;
        for (const auto& t : tokens) all += t;
        tokens.assign(1, all);
        break;
      }
      case kStrip:
        strip_decode(tokens, content_cp, start, stop);
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

  bool has(Kind k) const {
    if (kind == k) return true;
    for (const auto& c : children)
      if (c.has(k)) return true;
    return false;
  }

  static uint32_t single_char(const std::string& s, const JsonContext& ctx, const std::string& where,
                              const char* field) {
    size_t len = 0;
    if (s.empty() || (decode_utf8(s, 0, &len), len != s.size()))
      ctx.fail(where, std::string("\"") + field + "\" must be a single character");
    return decode_utf8(s, 0, &len);
  }

  // One step of the type `t` (json_context.h's parse_component reads a Sequence).
  static Node parse_step(const std::string& t, const json& j, const JsonContext& ctx, const std::string& where) {
    Node d{};
    if (t == "ByteLevel") {
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
      ctx.unsupported(where, "decoder type", t,
                      "ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, BPEDecoder, WordPiece, Sequence");
    }
    return d;
  }
};

Decoder Decoder::parse(const json& j, const JsonContext& ctx, const std::string& where) {
  return Decoder(std::make_shared<const Node>(parse_component<Node>(j, ctx, where, "decoders")));
}

void Decoder::decode_chain(std::vector<std::string>& tokens) const { root_->decode_chain(tokens); }

bool Decoder::has_byte_level() const { return root_->has(Node::kByteLevel); }

}  // namespace alpaca::tokenizer::detail
