// The `tokenizers` crate's Unigram model (models/unigram/{model,trie}.rs, tokenizers 0.23):
// Unigram::encode_optimized, SentencePiece's Viterbi over the vocabulary's log-probabilities
// (the crate's default path: no sampling, is_optimized), then Model::tokenize's piece -> id with
// byte_fallback and the unk. Details kept as the crate has them:
//   - every character without a one-character piece gets an unk node scored min_score - 10; no
//     unk_id then is an error even where another path would avoid it (MissingUnkId);
//   - a candidate replaces the best path ending at a position only when strictly better, the
//     earliest start winning ties;
//   - consecutive unk pieces are fused into one (fuse_unk is always on), and a piece is mapped to
//     its id by its text: a fused run that happens to be in the vocabulary is that token,
//     otherwise its bytes as <0xNN> (byte_fallback, when all exist) or the unk id.
#include <algorithm>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "alpaca/util/error.h"
#include "tokenizer_model.h"

namespace alpaca::tokenizer::detail {
namespace {

using nlohmann::json;

constexpr double kUnkPenalty = 10.0;

// Byte trie over the vocabulary (trie.rs): common_prefix_search yields every vocabulary piece
// that is a prefix of the text from a position, shortest first.
class ByteTrie {
 public:
  void push(const std::string& s) {
    uint32_t node = 0;
    for (unsigned char c : s) {
      auto [it, fresh] = children_.try_emplace(key(node, c), static_cast<uint32_t>(leaf_.size()));
      if (fresh) leaf_.push_back(false);
      node = it->second;
    }
    leaf_[node] = true;
  }
  // Calls fn(length) for every piece that is a prefix of s[begin..].
  template <typename Fn>
  void common_prefixes(const std::string& s, size_t begin, Fn&& fn) const {
    uint32_t node = 0;
    for (size_t i = begin; i < s.size(); ++i) {
      auto it = children_.find(key(node, static_cast<unsigned char>(s[i])));
      if (it == children_.end()) return;
      node = it->second;
      if (leaf_[node]) fn(i + 1 - begin);
    }
  }

 private:
  static uint64_t key(uint32_t node, unsigned char c) { return (static_cast<uint64_t>(node) << 8) | c; }
  std::unordered_map<uint64_t, uint32_t> children_;
  std::vector<bool> leaf_{false};  // node 0 is the root
};

size_t utf8_char_len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

class Unigram final : public VocabModel {
 public:
  Unigram(const json& j, const std::string& file);

  void tokenize(const std::string& s, std::vector<int64_t>* out) const override {
    for (const std::string& piece : encode(s)) {
      if (auto id = lookup(piece)) {
        out->push_back(*id);
        continue;
      }
      if (byte_fallback_ && append_bytes(piece, out)) continue;
      out->push_back(require_unk());
    }
  }
  const char* type() const override { return "Unigram"; }

 private:
  struct Best {
    int64_t id = 0;
    double score = 0;
    int64_t starts_at = -1;  // -1: no path ends here yet
  };

  int64_t require_unk() const {
    ALPACA_CHECK(unk_id_, file_ << ": the Unigram model met a character it has no piece for, and the model has "
                                   "no unk_id (the tokenizers library fails the same way: MissingUnkId)");
    return *unk_id_;
  }

  bool append_bytes(const std::string& piece, std::vector<int64_t>* out) const {
    std::vector<int64_t> ids;
    char code[8];
    for (unsigned char b : piece) {
      std::snprintf(code, sizeof code, "<0x%02X>", b);
      auto id = lookup(code);
      if (!id) return false;
      ids.push_back(*id);
    }
    out->insert(out->end(), ids.begin(), ids.end());
    return true;
  }

  static void relax(Best& node, double score, size_t starts_at, int64_t id) {
    if (node.starts_at < 0 || score > node.score) node = {id, score, static_cast<int64_t>(starts_at)};
  }

  // encode_optimized: the pieces of the best path, consecutive unk pieces fused.
  std::vector<std::string> encode(const std::string& s) const;


  std::string file_;
  std::vector<double> scores_;
  ByteTrie trie_;
  double unk_score_ = 0;
  std::optional<int64_t> unk_id_;
  bool byte_fallback_ = false;
};

Unigram::Unigram(const json& j, const std::string& file) : file_(file) {
  const json& vocab = j.contains("vocab") ? j.at("vocab") : json();
  ALPACA_CHECK(vocab.is_array(), file << ": model: a Unigram model needs \"vocab\": [[piece, score], ...]");
  double min_score = std::numeric_limits<double>::infinity();
  for (size_t id = 0; id < vocab.size(); ++id) {
    const json& item = vocab[id];
    ALPACA_CHECK(item.is_array() && item.size() == 2 && item[0].is_string() && item[1].is_number(),
                 file << ": model: vocab[" << id << "] must be [piece, score], got " << item.dump());
    tokens_.push_back(item[0].get<std::string>());
    scores_.push_back(item[1].get<double>());
    ids_[tokens_.back()] = static_cast<int64_t>(id);  // a repeated piece: the last id (as the crate)
    trie_.push(tokens_.back());
    min_score = std::min(min_score, scores_.back());
  }
  unk_score_ = min_score - kUnkPenalty;
  if (j.contains("unk_id") && !j.at("unk_id").is_null()) {
    ALPACA_CHECK(j.at("unk_id").is_number_integer() && j.at("unk_id").get<int64_t>() >= 0, file << ": model: \"unk_id\" must be a non-negative integer");
    unk_id_ = j.at("unk_id").get<int64_t>();
    ALPACA_CHECK(!tokens_.empty(), file << ": model: the Unigram vocabulary is empty but at least <unk> is needed");
    ALPACA_CHECK(*unk_id_ < static_cast<int64_t>(tokens_.size()),
                 file << ": model: unk_id " << *unk_id_ << " is outside the vocabulary of " << tokens_.size());
  }
  if (j.contains("byte_fallback") && !j.at("byte_fallback").is_null()) {
    ALPACA_CHECK(j.at("byte_fallback").is_boolean(), file << ": model: \"byte_fallback\" must be true or false");
    byte_fallback_ = j.at("byte_fallback").get<bool>();
  }
}
// encode_optimized: the pieces of the best path, consecutive unk pieces fused.
std::vector<std::string> Unigram::encode(const std::string& s) const {
  std::vector<Best> best(s.size() + 1);
  for (size_t start = 0; start < s.size();) {
    const double here = best[start].score;
    const size_t mblen = std::min(utf8_char_len(static_cast<unsigned char>(s[start])), s.size() - start);
    bool single = false;
    trie_.common_prefixes(s, start, [&](size_t len) {
      const int64_t id = ids_.at(s.substr(start, len));
      relax(best[start + len], scores_[static_cast<size_t>(id)] + here, start, id);
      single = single || len == mblen;
    });
    Best& after = best[start + mblen];
    if (!single && (after.starts_at < 0 || unk_score_ + here > after.score))  // no unk_id: fails only here
      after = {require_unk(), unk_score_ + here, static_cast<int64_t>(start)};
    start += mblen;
  }
  std::vector<std::string> pieces;
  std::string unk_run;  // reversed order: pieces are collected from the end
  for (size_t end = s.size(); end > 0;) {
    const Best& node = best[end];
    const size_t start = static_cast<size_t>(node.starts_at);
    if (unk_id_ && node.id == *unk_id_) {
      unk_run.insert(0, s, start, end - start);
    } else {
      if (!unk_run.empty()) pieces.push_back(std::move(unk_run)), unk_run.clear();
      pieces.push_back(s.substr(start, end - start));
    }
    end = start;
  }
  if (!unk_run.empty()) pieces.push_back(std::move(unk_run));
  return {pieces.rbegin(), pieces.rend()};
}
}  // namespace

std::unique_ptr<TokenizerModel> parse_unigram(const json& model, const std::string& file) {
  return std::make_unique<Unigram>(model, file);
}

}  // namespace alpaca::tokenizer::detail
