// Tokens laid back onto the text they were encoded from (see conversation_example.h).
#include <algorithm>
#include <cctype>
#include <optional>
#include <string>
#include <vector>

#include "alpaca/data/conversation_example.h"
#include "alpaca/util/error.h"

namespace alpaca::data {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

bool is_continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }  // of a UTF-8 character

bool matches_at(const std::string& text, size_t pos, const std::string& bytes) {
  return pos + bytes.size() <= text.size() && text.compare(pos, bytes.size(), bytes) == 0;
}

// Where token bytes `b` placed at `pos` of `text` end (`end`) and where the next token begins
// (`next`, = end but for a lone inserted space), or false. Tried in order: the bytes as they are;
// without a leading space the tokenizer inserted (a Metaspace / SentencePiece prefix "▁", which
// covers nothing of the text; a lone "▁" token holds, as its offsets in transformers do, the
// character it was prepended to, which the next token holds too); after whitespace an
// lstrip/rstrip token swallowed (which then joins this token).
bool place(const std::string& text, size_t pos, const std::string& b, size_t* end, size_t* next) {
  if (matches_at(text, pos, b)) {
    *end = *next = pos + b.size();
    return true;
  }
  if (!b.empty() && b[0] == ' ' && matches_at(text, pos, b.substr(1))) {
    *end = *next = pos + b.size() - 1;
    if (b.size() == 1 && pos < text.size()) {
      *end = pos + 1;
      while (*end < text.size() && is_continuation(text[*end])) ++*end;
    }
    return true;
  }
  size_t q = pos;
  while (q < text.size() && is_space(text[q])) ++q;
  if (q > pos && matches_at(text, q, b)) {
    *end = *next = q + b.size();
    return true;
  }
  return false;
}

// Where the alignment picks up again after a token that does not spell the text where the previous
// one ended: a token the tokenizer produced for text it rewrote (an <unk> for characters outside its
// vocabulary; a normalizer's NFC "é" for the text's "e" + U+0301; a byte-fallback token registered as an
// added "<0x..>" string), or text it dropped (a Split delimiter "Removed"). transformers' offsets map such
// tokens back onto the characters they came from; here the next tokens that do spell the text again mark
// where: the nearest text position from which kConfirm tokens in a row (or all that remain) place.
constexpr size_t kConfirm = 3;          // tokens in a row that must place for a resynchronisation
constexpr size_t kMaxSkippedTokens = 16;  // tokens that may cover rewritten text before it resumes
constexpr size_t kMaxRewrittenBytes = 1024;  // text they may cover (an <unk> of a run of unknown characters)
constexpr size_t kMaxDroppedBytes = 16;  // text no token covers (removed delimiters)

struct Resync {
  size_t token;  // the first token that places again (== ids.size(): none remain)
  size_t at;     // where it begins in the text
};

// Whether tokens j.. place one after another from text byte q: kConfirm of them, or all that remain
// (and then only whitespace is left of the text).
bool places_from(const std::string& text, const std::vector<std::string>& bytes, size_t j, size_t q) {
  const size_t stop = std::min(bytes.size(), j + kConfirm);
  size_t p = q;
  for (size_t t = j; t < stop; ++t) {
    size_t end = 0;
    if (!place(text, p, bytes[t], &end, &p)) return false;
  }
  if (stop < bytes.size()) return true;
  while (p < text.size() && is_space(text[p])) ++p;
  return p == text.size();
}

std::optional<Resync> resync(const std::string& text, const std::vector<std::string>& bytes, size_t k, size_t pos) {
  const size_t last_at = std::min(text.size(), pos + kMaxRewrittenBytes);
  const size_t last_token = std::min(bytes.size(), k + kMaxSkippedTokens);
  for (size_t q = pos; q <= last_at; ++q) {
    if (q < text.size() && is_continuation(text[q])) continue;  // inside a character
    for (size_t j = k; j <= last_token; ++j) {
      if (j == k && q - pos > kMaxDroppedBytes) continue;  // token k itself, after text nothing covers
      if (places_from(text, bytes, j, q)) return Resync{j, q};
    }
  }
  return std::nullopt;
}

}  // namespace

std::vector<std::pair<size_t, size_t>> token_byte_ranges(const tokenizer::Tokenizer& tokenizer, const std::string& text,
                                                         const std::vector<int64_t>& ids) {
  std::vector<std::string> bytes;
  bytes.reserve(ids.size());
  for (int64_t id : ids) bytes.push_back(tokenizer.token_bytes(id));
  std::vector<std::pair<size_t, size_t>> out;
  out.reserve(ids.size());
  size_t pos = 0;
  for (size_t k = 0; k < ids.size(); ++k) {
    size_t end = 0, next = 0;
    if (place(text, pos, bytes[k], &end, &next)) {
      out.emplace_back(pos, end);
      pos = next;
      continue;
    }
    const std::optional<Resync> r = resync(text, bytes, k, pos);
    ALPACA_CHECK(r, "token " << k << " (" << tokenizer.describe_ids({ids[k]}) << ") does not spell the text at byte "
                             << pos << " and the tokens after it do not resume within " << kMaxRewrittenBytes
                             << " bytes; the tokenizer (" << tokenizer.source()
                             << ") rewrites the text (a normalizer), so its tokens cannot be matched to the "
                                "assistant spans of the chat template");
    if (r->token == k) {  // text nothing covers: token k, placed after it, takes it along
      place(text, r->at, bytes[k], &end, &next);
      out.emplace_back(pos, end);
      pos = next;
      continue;
    }
    // Tokens k .. r->token - 1 stand for text [pos, r->at): the first holds it, the others nothing.
    out.emplace_back(pos, r->at);
    for (size_t t = k + 1; t < r->token; ++t) out.emplace_back(r->at, r->at);
    pos = r->at;
    k = r->token - 1;  // the loop's ++k moves on to r->token
  }
  // Trailing whitespace a final rstrip token swallowed belongs to it.
  size_t rest = pos;
  while (rest < text.size() && is_space(text[rest])) ++rest;
  ALPACA_CHECK(rest == text.size(), "the tokens of the text end at byte " << pos << " of " << text.size()
                                                                           << "; the tokenizer (" << tokenizer.source()
                                                                           << ") does not spell the whole text");
  if (!out.empty()) out.back().second = text.size();
  return out;
}

}  // namespace alpaca::data
