// Private to src/tokenizer: the model step of a tokenizer.json pipeline (the `tokenizers` crate's
// `Model` trait): one pre-tokenized piece in, ids out. Implementations, each in the file named
// after the crate's module: BPE (bpe.cpp), Unigram (unigram.cpp), WordPiece (wordpiece.cpp),
// WordLevel (wordlevel.cpp). The
// normalizer a SentencePiece tokenizer.json carries (Precompiled) is in precompiled.h.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace alpaca::tokenizer::detail {

class TokenizerModel {
 public:
  virtual ~TokenizerModel() = default;
  // Model::tokenize on one piece (non-empty), its ids appended to `out`. Throws where the library
  // returns an error (an unknown character without an unk token).
  virtual void tokenize(const std::string& piece, std::vector<int64_t>* out) const = 0;
  virtual std::optional<int64_t> lookup(const std::string& token) const = 0;
  // id -> token for every id below the vocabulary size ("" for a hole in the ids).
  virtual const std::vector<std::string>& id_to_token() const = 0;
  virtual const char* type() const = 0;  // "BPE", "Unigram", "WordPiece", "WordLevel"
};

// A model over one token <-> id table (Unigram, WordPiece, WordLevel): lookup() and id_to_token()
// read the table its constructor fills.
class VocabModel : public TokenizerModel {
 public:
  std::optional<int64_t> lookup(const std::string& token) const override {
    auto it = ids_.find(token);
    return it == ids_.end() ? std::nullopt : std::optional<int64_t>(it->second);
  }
  const std::vector<std::string>& id_to_token() const override { return tokens_; }

 protected:
  // Fills the table from a {token: id} object (WordPiece's and WordLevel's "vocab"; defined in
  // wordpiece.cpp); errors name `file` and `model`.
  void read_vocab(const nlohmann::json& vocab, const std::string& file, const char* model);
  std::unordered_map<std::string, int64_t> ids_;  // token -> id
  std::vector<std::string> tokens_;               // id -> token
};

// Ids are dense here (id -> token vectors): a vocabulary may leave holes, but its largest id may
// exceed its size by at most this many (a corrupt id would otherwise allocate without bound).
constexpr int64_t kMaxVocabHoles = 1 << 20;

// The tokenizer.json "model" object of each type; errors name `file` and the field.
std::unique_ptr<TokenizerModel> parse_bpe(const nlohmann::json& model, const std::string& file);
std::unique_ptr<TokenizerModel> parse_unigram(const nlohmann::json& model, const std::string& file);
std::unique_ptr<TokenizerModel> parse_wordpiece(const nlohmann::json& model, const std::string& file);
std::unique_ptr<TokenizerModel> parse_wordlevel(const nlohmann::json& model, const std::string& file);

// decoders::WordPiece: every token but the first loses `prefix` or gets a leading space; with
// `cleanup` the library's cleanup() (" ." -> ".", " n't" -> "n't", " do not" -> " don't", ...).
void wordpiece_decode(std::vector<std::string>& tokens, const std::string& prefix, bool cleanup);

// A SentencePiece-style piece as text bytes: "<0xNN>" (byte fallback) is that byte, every "▁" a
// space. Shared by both backends' token_bytes() (defined in hf_tokenizer.cpp).
std::string sentencepiece_piece_bytes(const std::string& piece);

// transformers' PreTrainedTokenizerBase.clean_up_tokenization (the decode-time clean-up a
// tokenizer_config.json's clean_up_tokenization_spaces asks for, non-BPE models only).
std::string clean_up_tokenization(std::string text);

}  // namespace alpaca::tokenizer::detail
