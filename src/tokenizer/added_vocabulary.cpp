// The added-token matching of added_vocabulary.h.
#include "added_vocabulary.h"

#include <algorithm>

#include "normalizers.h"
#include "utf8.h"

namespace alpaca::tokenizer::detail {

void AddedVocabulary::rebuild(const Normalizer* normalizer) {
  std::sort(tokens.begin(), tokens.end(),
            [](const AddedToken& a, const AddedToken& b) { return a.id < b.id; });
  index.clear();
  by_id.clear();
  normalized_form.clear();
  for (auto& v : raw_first) v.clear();
  for (auto& v : norm_first) v.clear();
  for (size_t i = 0; i < tokens.size(); ++i) {
    const AddedToken& t = tokens[i];
    index[t.content] = i;
    by_id[t.id] = i;
    std::string pattern = t.content;
    if (t.normalized && normalizer) {
      normalizer->normalize(pattern);
      if (pattern != t.content) normalized_form[t.id] = pattern;
    }
    if (pattern.empty()) continue;
    auto& table = t.normalized ? norm_first : raw_first;
    table[static_cast<unsigned char>(pattern[0])].emplace_back(pattern, i);
  }
  for (auto* table : {&raw_first, &norm_first})
    for (auto& v : *table)
      std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
        return a.first.size() > b.first.size();
      });
}

void AddedVocabulary::split(const Piece& p, bool normalized_set, std::vector<Piece>& sub) const {
  const auto& table = normalized_set ? norm_first : raw_first;
  const std::string& s = p.s;
  struct M {
    size_t start, stop, index;
  };
  std::vector<M> matches;
  for (size_t i = 0; i < s.size();) {
    const auto& cands = table[static_cast<unsigned char>(s[i])];
    const std::pair<std::string, size_t>* best = nullptr;
    for (const auto& c : cands)
      if (s.compare(i, c.first.size(), c.first) == 0) {
        best = &c;
        break;
      }
    if (!best) {
      ++i;
      continue;
    }
    matches.push_back({i, i + best->first.size(), best->second});
    i += best->first.size();
  }
  if (matches.empty()) {
    sub.push_back(p);
    return;
  }
  size_t start_offset = 0;
  for (const auto& m : matches) {
    const AddedToken& t = tokens[m.index];
    size_t start = m.start, stop = m.stop;
    if (t.single_word) {
      bool start_space = start == 0 || !is_word_char(last_code_point(s, start));
      size_t len = 0;
      bool stop_space = stop == s.size() || !is_word_char(decode_utf8(s, stop, &len));
      if (!start_space || !stop_space) continue;
    }
    if (t.lstrip) {
      size_t ns = start;
      while (ns > 0) {
        const size_t i = utf8_prev(s, ns);
        size_t len = 0;
        if (!is_white_space(decode_utf8(s, i, &len))) break;
        ns = i;
      }
      start = std::max(ns, start_offset);
    }
    if (t.rstrip) {
      for (size_t len = 0; stop < s.size(); stop += len)
        if (!is_white_space(decode_utf8(s, stop, &len))) break;
    }
    if (start_offset < start)
      sub.push_back(Piece{s.substr(start_offset, start - start_offset), -1,
                          p.at_origin && start_offset == 0});
    sub.push_back(Piece{s.substr(start, stop - start), t.id, false});
    start_offset = stop;
  }
  if (start_offset != s.size())
    sub.push_back(Piece{s.substr(start_offset), -1, p.at_origin && start_offset == 0});
}

void AddedVocabulary::parse(const json& doc, const JsonContext& ctx) {
  if (!doc.contains("added_tokens") || doc.at("added_tokens").is_null()) return;
  const json& list = doc.at("added_tokens");
  if (!list.is_array()) ctx.fail("added_tokens", "must be a list");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string where = "added_tokens[" + std::to_string(i) + "]";
    const json& t = list[i];
    AddedToken a;
    a.content = ctx.str(t, "content", where);
    a.id = ctx.integer(t, "id", -1, where);
    if (a.id < 0) ctx.fail(where, "\"id\" must be a non-negative integer");
    a.special = ctx.boolean(t, "special", false, where);
    a.lstrip = ctx.boolean(t, "lstrip", false, where);
    a.rstrip = ctx.boolean(t, "rstrip", false, where);
    a.single_word = ctx.boolean(t, "single_word", false, where);
    a.normalized = ctx.boolean(t, "normalized", !a.special, where);
    if (a.content.empty()) continue;
    auto same = std::find_if(tokens.begin(), tokens.end(),
                             [&](const AddedToken& x) { return x.id == a.id; });
    if (same != tokens.end()) ctx.fail(where, "id " + std::to_string(a.id) + " is used twice");
    tokens.push_back(a);
  }
}

}  // namespace alpaca::tokenizer::detail
