// The `tokenizers` crate's WordPiece model (models/wordpiece/{mod,serialization}.rs) and
// WordPiece decoder (decoders/wordpiece.rs), tokenizers 0.23: greedy longest-match-first over
// the piece, every match after the first looked up with continuing_subword_prefix; a piece of
// more than max_input_chars_per_word characters, or one with a remainder no vocabulary entry
// starts, becomes the single unk token. All four model fields are required, as the crate's
// deserializer has them.
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "alpaca/util/error.h"
#include "tokenizer_model.h"

namespace alpaca::tokenizer::detail {
namespace {

using nlohmann::json;

size_t char_count(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

class WordPiece final : public VocabModel {
 public:
  WordPiece(const json& j, const std::string& file) : file_(file) {
    for (const char* key : {"unk_token", "continuing_subword_prefix", "max_input_chars_per_word", "vocab"})
      ALPACA_CHECK(j.contains(key), file << ": model: a WordPiece model needs \"" << key << "\"");
    ALPACA_CHECK(j.at("unk_token").is_string() && j.at("continuing_subword_prefix").is_string(),
                 file << ": model: \"unk_token\" and \"continuing_subword_prefix\" must be strings");
    ALPACA_CHECK(j.at("max_input_chars_per_word").is_number_integer() && j.at("max_input_chars_per_word").get<int64_t>() >= 0,
                 file << ": model: \"max_input_chars_per_word\" must be a non-negative integer");
    unk_ = j.at("unk_token").get<std::string>();
    prefix_ = j.at("continuing_subword_prefix").get<std::string>();
    max_chars_ = j.at("max_input_chars_per_word").get<size_t>();
    read_vocab(j.at("vocab"), file, "WordPiece");
  }

  void tokenize(const std::string& s, std::vector<int64_t>* out) const override {
    if (char_count(s) > max_chars_) return out->push_back(unk_id());
    const size_t before = out->size();
    for (size_t start = 0; start < s.size();) {
      size_t end = s.size();
      std::optional<int64_t> found;
      while (start < end) {
        const std::string sub = start > 0 ? prefix_ + s.substr(start, end - start) : s.substr(start, end - start);
        if ((found = lookup(sub))) break;
        do --end; while (end > start && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80);
      }
      if (!found) {  // the whole piece becomes the unk
        out->resize(before);
        return out->push_back(unk_id());
      }
      out->push_back(*found);
      start = end;
    }
  }
  const char* type() const override { return "WordPiece"; }

 private:
  int64_t unk_id() const {
    auto id = lookup(unk_);
    ALPACA_CHECK(id, file_ << ": the WordPiece unk_token \"" << unk_ << "\" is not in the vocabulary (the "
                           << "tokenizers library fails the same way on a word it cannot split)");
    return *id;
  }

  std::string file_, unk_, prefix_;
  size_t max_chars_ = 100;
};

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
}

// The clean-up's replacements in order; decoders::wordpiece::cleanup also has " do not" -> " don't"
// (after " 'm"), transformers' clean_up_tokenization does not.
std::string clean_up(std::string text, bool do_not) {
  static const std::vector<std::pair<std::string, std::string>> kRules = {
      {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"}, {" 'm", "'m"},
      {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules)
    if (do_not || from != " do not") replace_all(text, from, to);
  return text;
}

}  // namespace

void VocabModel::read_vocab(const json& vocab, const std::string& file, const char* model) {
  ALPACA_CHECK(vocab.is_object(), file << ": model: " << model << " \"vocab\" must map token -> id");
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    ALPACA_CHECK(it.value().is_number_integer() && it.value().get<int64_t>() >= 0 && it.value().get<int64_t>() < (1ll << 31),
                 file << ": model: vocab id of " << json(it.key()).dump() << " must be a non-negative integer");
    const auto id = it.value().get<int64_t>();
    ALPACA_CHECK(id < static_cast<int64_t>(vocab.size()) + kMaxVocabHoles,
                 file << ": model: vocab id " << id << " is far beyond the vocabulary's " << vocab.size()
                      << " entries (a corrupt id?)");
    ids_[it.key()] = id;
    if (static_cast<size_t>(id) >= tokens_.size()) tokens_.resize(static_cast<size_t>(id) + 1);
    tokens_[static_cast<size_t>(id)] = it.key();
  }
}

std::unique_ptr<TokenizerModel> parse_wordpiece(const json& model, const std::string& file) {
  return std::make_unique<WordPiece>(model, file);
}

void wordpiece_decode(std::vector<std::string>& tokens, const std::string& prefix, bool cleanup) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::string& t = tokens[i];
    if (i != 0) t = t.compare(0, prefix.size(), prefix) == 0 ? t.substr(prefix.size()) : " " + t;
    if (cleanup) t = clean_up(std::move(t), true);
  }
}

std::string clean_up_tokenization(std::string text) { return clean_up(std::move(text), false); }

}  // namespace alpaca::tokenizer::detail
