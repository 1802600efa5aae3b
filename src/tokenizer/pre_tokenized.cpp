// NormalizedString::split's behaviours (pre_tokenized.h).
#include "pre_tokenized.h"

#include <algorithm>

namespace alpaca::tokenizer::detail {

// NormalizedString::split: the kept [start, end) ranges for `matches` under `behavior`.
std::vector<std::pair<size_t, size_t>> split_ranges(std::vector<Match> matches, Behavior behavior,
                                                     bool invert) {
  if (invert)
    for (auto& m : matches) m.is_match = !m.is_match;
  std::vector<std::pair<size_t, size_t>> out;
  out.reserve(matches.size());
  // Each match extends the range before it when `joins(is_match, the previous is_match)`, else
  // starts a range of its own.
  auto merge_forward = [&](auto joins) {
    bool prev = false;
    for (const auto& m : matches) {
      if (joins(m.is_match, prev) && !out.empty()) {
        out.back().second = m.end;
      } else {
        out.emplace_back(m.start, m.end);
      }
      prev = m.is_match;
    }
  };
  switch (behavior) {
    case Behavior::kIsolated:
      for (const auto& m : matches) out.emplace_back(m.start, m.end);
      break;
    case Behavior::kRemoved:
      for (const auto& m : matches)
        if (!m.is_match) out.emplace_back(m.start, m.end);
      break;
    case Behavior::kContiguous:  // runs of matches and runs of non-matches
      merge_forward([](bool match, bool prev) { return match == prev; });
      break;
    case Behavior::kMergedWithPrevious:  // a match joins the non-match before it
      merge_forward([](bool match, bool prev) { return match && !prev; });
      break;
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

// Sub-pieces of `p` for the kept ranges; the one at offset 0 keeps p's origin flag.
void slice_into(const Piece& p, const std::vector<std::pair<size_t, size_t>>& ranges,
                std::vector<Piece>& sub) {
  for (const auto& r : ranges)
    sub.push_back(Piece{p.s.substr(r.first, r.second - r.first), -1, p.at_origin && r.first == 0});
}

}  // namespace alpaca::tokenizer::detail
