// Private to src/tokenizer: the `tokenizers` crate's AddedVocabulary (tokenizer/added_vocabulary.rs):
// the added tokens of a tokenizer.json, matched in the raw text (normalized=false) and in each
// normalized piece (normalized=true) before the pre-tokenizer runs, leftmost-longest, with
// lstrip / rstrip / single_word.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "alpaca/tokenizer/tokenizer.h"
#include "json_context.h"
#include "pre_tokenized.h"

namespace alpaca::tokenizer::detail {

class Normalizer;

struct AddedVocabulary {
  std::vector<AddedToken> tokens;                         // id order (after rebuild)
  std::unordered_map<std::string, size_t> index;          // content -> index in `tokens`
  std::unordered_map<int64_t, size_t> by_id;              // id -> index in `tokens`
  std::unordered_map<int64_t, std::string> normalized_form;  // normalized tokens whose form differs
  // Matching: per first byte, candidate (pattern, index) sorted longest first.
  std::array<std::vector<std::pair<std::string, size_t>>, 256> raw_first, norm_first;

  // Appends the document's "added_tokens" (errors name the entry; an id used twice is one).
  void parse(const json& doc, const JsonContext& ctx);
  // Sorts `tokens` by id and rebuilds the indexes; `normalizer` (null: none) gives the
  // normalized=true tokens the form they are matched in.
  void rebuild(const Normalizer* normalizer);
  // AddedVocabulary::find_matches + split_with_indices on one piece: the tokens of the raw set
  // (normalized_set false) or the normalized set found in `p`, and the text between them.
  void split(const Piece& p, bool normalized_set, std::vector<Piece>& sub) const;
};

}  // namespace alpaca::tokenizer::detail
