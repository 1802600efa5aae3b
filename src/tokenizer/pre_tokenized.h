// Private to src/tokenizer: the text of an encode call while the pipeline cuts it up (the
// `tokenizers` crate's PreTokenizedString / NormalizedString::split): a list of pieces, some
// already tokens (added tokens split out first), the rest split further by the pre-tokenizers.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "regex.h"

namespace alpaca::tokenizer::detail {

struct Piece {
  std::string s;
  int64_t id = -1;         // >= 0: already a token (an added token)
  bool at_origin = false;  // starts at offset 0 of the original text (Metaspace "first")
};

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// NormalizedString::split: the kept [start, end) ranges for `matches` under `behavior`.
std::vector<std::pair<size_t, size_t>> split_ranges(std::vector<Match> matches, Behavior behavior,
                                                     bool invert);

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
                std::vector<Piece>& sub);

}  // namespace alpaca::tokenizer::detail
