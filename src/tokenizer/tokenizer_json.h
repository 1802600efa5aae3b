// Private to src/tokenizer: builds the `tokenizers` library's tokenizer.json for a SentencePiece BPE
// model, so transformers 5 (whose LlamaTokenizer is tokenizers-backed and which needs protobuf
// to convert a bare tokenizer.model) loads a saved tokenizer directory with the same ids.
#pragma once

#include <string>
#include <vector>

#include "alpaca/tokenizer/tokenizer.h"

namespace alpaca::tokenizer::detail {

struct TokenizerJsonSpec {
  std::vector<std::string> pieces;  // SentencePiece pieces by id
  std::vector<float> scores;        // their scores (merge priority)
  std::vector<AddedToken> added;    // sorted by id
  std::string unk_token, bos_token, eos_token;
  int64_t bos_id = 1, eos_id = 2;
  bool add_bos = true, add_eos = false, legacy = true;
};

// The serialized tokenizer.json. Merges follow transformers' generate_merges (the order its
// SentencePiece converter produces).
std::string make_tokenizer_json(const TokenizerJsonSpec& spec);

}  // namespace alpaca::tokenizer::detail
