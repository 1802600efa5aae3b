// The `tokenizers` crate's WordLevel model (models/wordlevel/{mod,serialization}.rs), tokenizers
// 0.23: each pre-tokenized piece is one vocabulary entry, or the unk token when it is not in the
// vocabulary (the pre-tokenizer does all the splitting; WordLevel never cuts a piece). "vocab" and
// "unk_token" are required, as the crate's deserializer has them.
#include <nlohmann/json.hpp>

#include "alpaca/util/error.h"
#include "tokenizer_model.h"

namespace alpaca::tokenizer::detail {
namespace {

class WordLevel final : public VocabModel {
 public:
  WordLevel(const nlohmann::json& j, const std::string& file) : file_(file) {
    for (const char* key : {"vocab", "unk_token"})
      ALPACA_CHECK(j.contains(key), file << ": model: a WordLevel model needs \"" << key << "\"");
    ALPACA_CHECK(j.at("unk_token").is_string(), file << ": model: WordLevel \"unk_token\" must be a string");
    unk_ = j.at("unk_token").get<std::string>();
    read_vocab(j.at("vocab"), file, "WordLevel");
    unk_id_ = lookup(unk_);
  }

  void tokenize(const std::string& piece, std::vector<int64_t>* out) const override {
    if (auto id = lookup(piece)) return out->push_back(*id);
    // The crate checks the unk only when a piece is unknown: a file without it loads and encodes
    // known words, then fails on the first unknown one.
    ALPACA_CHECK(unk_id_, file_ << ": the WordLevel unk_token \"" << unk_ << "\" is not in the vocabulary, so the "
                                << "unknown word " << nlohmann::json(piece).dump() << " has no id (the tokenizers "
                                << "library fails the same way); add the unk token to model.vocab");
    out->push_back(*unk_id_);
  }
  const char* type() const override { return "WordLevel"; }

 private:
  std::string file_, unk_;
  std::optional<int64_t> unk_id_;
};

}  // namespace

std::unique_ptr<TokenizerModel> parse_wordlevel(const nlohmann::json& model, const std::string& file) {
  return std::make_unique<WordLevel>(model, file);
}

}  // namespace alpaca::tokenizer::detail
