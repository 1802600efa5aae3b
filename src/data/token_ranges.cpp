// Tokens laid back onto the text they were encoded from (see conversation_example.h).
#include <cctype>

#include "alpaca/data/conversation_example.h"
#include "alpaca/util/error.h"

namespace alpaca::data {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

bool matches_at(const std::string& text, size_t pos, const std::string& bytes) {
  return pos + bytes.size() <= text.size() && text.compare(pos, bytes.size(), bytes) == 0;
}

// Where token bytes `b` begin and end in `text` at `pos`, or false. Tried in order: the bytes as
// they are; without a leading space the tokenizer inserted (SentencePiece's prefix "▁", which then
// covers nothing of the text); after whitespace an lstrip/rstrip token swallowed (which then
// joins this token).
bool place(const std::string& text, size_t pos, const std::string& b, size_t* end) {
  if (matches_at(text, pos, b)) {
    *end = pos + b.size();
    return true;
  }
  if (!b.empty() && b[0] == ' ' && matches_at(text, pos, b.substr(1))) {
    *end = pos + b.size() - 1;
    return true;
  }
  size_t q = pos;
  while (q < text.size() && is_space(text[q])) ++q;
  if (q > pos && matches_at(text, q, b)) {
    *end = q + b.size();
    return true;
  }
  return false;
}

}  // namespace

std::vector<std::pair<size_t, size_t>> token_byte_ranges(const tokenizer::Tokenizer& tokenizer, const std::string& text,
                                                         const std::vector<int64_t>& ids) {
  std::vector<std::pair<size_t, size_t>> out;
  out.reserve(ids.size());
  size_t pos = 0;
  for (size_t k = 0; k < ids.size(); ++k) {
    const std::string bytes = tokenizer.token_bytes(ids[k]);
    size_t end = 0;
    ALPACA_CHECK(place(text, pos, bytes, &end),
                 "token " << k << " (" << tokenizer.describe_ids({ids[k]}) << ") does not spell the text at byte "
                          << pos << "; the tokenizer (" << tokenizer.source()
                          << ") rewrites the text (a normalizer), so its tokens cannot be matched to the "
                             "assistant spans of the chat template");
    out.emplace_back(pos, end);
    pos = end;
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
