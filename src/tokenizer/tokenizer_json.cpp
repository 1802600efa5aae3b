// tokenizer.json writer for SentencePiece BPE models (see tokenizer_json.h).
#include "tokenizer_json.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "alpaca/util/error.h"

namespace alpaca::tokenizer::detail {
namespace {

using nlohmann::ordered_json;

// Byte offsets of the UTF-8 code point boundaries of `s` (excluding 0 and s.size()).
std::vector<size_t> char_boundaries(const std::string& s) {
  std::vector<size_t> out;
  for (size_t i = 1; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) out.push_back(i);
  return out;
}

int64_t num_chars(const std::string& s) {
  return static_cast<int64_t>(char_boundaries(s).size()) + (s.empty() ? 0 : 1);
}

struct Merge {
  const std::string* left;
  const std::string* right;
  float score;
  int64_t left_chars, right_chars;
};


// Every split of every piece into two pieces, per piece ordered by (id left, id right), then all
// merges stably sorted by (score, len(left), len(right)) descending.
std::vector<Merge> generate_merges(const TokenizerJsonSpec& spec) {
  ALPACA_CHECK(spec.pieces.size() == spec.scores.size(), "tokenizer.json: pieces/scores differ");
  std::unordered_map<std::string, int64_t> vocab;
  for (size_t i = 0; i < spec.pieces.size(); ++i) vocab.emplace(spec.pieces[i], i);

  // transformers.tokenization_utils_base.generate_merges(vocab, vocab_scores).
  std::vector<Merge> merges;
  for (size_t i = 0; i < spec.pieces.size(); ++i) {
    const std::string& piece = spec.pieces[i];
    std::vector<Merge> local;
    for (size_t cut : char_boundaries(piece)) {
      auto l = vocab.find(piece.substr(0, cut));
      auto r = vocab.find(piece.substr(cut));
      if (l == vocab.end() || r == vocab.end()) continue;
      local.push_back({&spec.pieces[l->second], &spec.pieces[r->second], spec.scores[i],
                       num_chars(l->first), num_chars(r->first)});
    }
    std::stable_sort(local.begin(), local.end(), [&](const Merge& a, const Merge& b) {
      int64_t al = vocab[*a.left], bl = vocab[*b.left];
      return al != bl ? al < bl : vocab[*a.right] < vocab[*b.right];
    });
    merges.insert(merges.end(), local.begin(), local.end());
  }
  std::stable_sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.left_chars != b.left_chars) return a.left_chars > b.left_chars;
    return a.right_chars > b.right_chars;
  });
  return merges;
}

ordered_json added_tokens_json(const TokenizerJsonSpec& spec) {
  ordered_json added = ordered_json::array();
  for (const auto& t : spec.added)
    added.push_back({{"id", t.id},         {"content", t.content}, {"single_word", false},
                     {"lstrip", t.lstrip}, {"rstrip", t.rstrip},   {"normalized", !t.special},
                     {"special", t.special}});
  return added;
}

// The TemplateProcessing post-processor: BOS / EOS around $A (and $B) as the flags say.
ordered_json post_processor_json(const TokenizerJsonSpec& spec) {
  auto special = [](const std::string& tok, int type_id) {
    return ordered_json{{"SpecialToken", {{"id", tok}, {"type_id", type_id}}}};
  };
  auto seq = [](const char* id, int type_id) {
    return ordered_json{{"Sequence", {{"id", id}, {"type_id", type_id}}}};
  };
  ordered_json single = ordered_json::array(), pair = ordered_json::array();
  ordered_json specials = ordered_json::object();
  if (spec.add_bos) {
    single.push_back(special(spec.bos_token, 0));
    specials[spec.bos_token] = {
        {"id", spec.bos_token}, {"ids", {spec.bos_id}}, {"tokens", {spec.bos_token}}};
  }
  single.push_back(seq("A", 0));
  if (spec.add_eos) {
    single.push_back(special(spec.eos_token, 0));
    specials[spec.eos_token] = {
        {"id", spec.eos_token}, {"ids", {spec.eos_id}}, {"tokens", {spec.eos_token}}};
  }
  for (const auto& item : single) pair.push_back(item);
  if (spec.add_bos) pair.push_back(special(spec.bos_token, 1));
  pair.push_back(seq("B", 1));
  if (spec.add_eos) pair.push_back(special(spec.eos_token, 1));
  return {{"type", "TemplateProcessing"}, {"single", single}, {"pair", pair}, {"special_tokens", specials}};
}

ordered_json vocab_json(const TokenizerJsonSpec& spec) {
  ordered_json vocab = ordered_json::object();
  {
    // ordered_json's operator[] searches linearly (quadratic over 32k pieces: a second per save);
    // append to its underlying vector instead, keeping Python dict semantics for a repeated piece
    // (first position, last value).
    auto& obj = vocab.get_ref<ordered_json::object_t&>();
    auto& rows = static_cast<std::vector<ordered_json::object_t::value_type>&>(obj);
    std::unordered_map<std::string, size_t> position;
    position.reserve(spec.pieces.size());
    for (size_t i = 0; i < spec.pieces.size(); ++i) {
      auto [it, fresh] = position.emplace(spec.pieces[i], rows.size());
      if (fresh) {
        rows.emplace_back(spec.pieces[i], i);
      } else {
        rows[it->second].second = i;
      }
    }
  }
  return vocab;
}

}  // namespace

std::string make_tokenizer_json(const TokenizerJsonSpec& spec) {
  const std::vector<Merge> merges = generate_merges(spec);
  // Legacy = SentencePiece's own behaviour: every chunk between added tokens gets the "▁"
  // dummy prefix. Non-legacy: only the start of the text (Metaspace "first").
  ordered_json normalizer = nullptr, pre_tokenizer = nullptr;
  if (spec.legacy) {
    normalizer = {{"type", "Sequence"},
                  {"normalizers",
                   {{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
                    {{"type", "Replace"},
                     {"pattern", {{"String", " "}}},
                     {"content", "\xE2\x96\x81"}}}}};
  } else {
    pre_tokenizer = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"},
                     {"prepend_scheme", "first"}, {"split", false}};
  }

  ordered_json merges_json = ordered_json::array();
  for (const auto& m : merges) merges_json.push_back({*m.left, *m.right});

  ordered_json doc = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added_tokens_json(spec)},
      {"normalizer", normalizer},
      {"pre_tokenizer", pre_tokenizer},
      {"post_processor", post_processor_json(spec)},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}},
          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", spec.unk_token},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", true},
        {"byte_fallback", true},
        {"ignore_merges", false},
        {"vocab", vocab_json(spec)},
        {"merges", merges_json}}},
  };
  return doc.dump(-1, ' ', false, ordered_json::error_handler_t::strict) + "\n";
}

}  // namespace alpaca::tokenizer::detail
