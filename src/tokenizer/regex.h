// Private to src/tokenizer: the `tokenizers` crate's regex and SplitPattern (utils/pattern.rs),
// run on PCRE2 with UTF + UCP (the crate uses onig; every pattern a supported tokenizer.json
// carries means the same in both). PCRE2 itself stays inside regex.cpp.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace alpaca::tokenizer::detail {

// One range of Pattern::find_matches: [start, end) and whether the pattern matched it.
struct Match {
  size_t start, end;
  bool is_match;
};

class Regex {
 public:
  // Compiles `pattern`; an error names `where` and the offset PCRE2 stopped at.
  Regex(const std::string& pattern, const std::string& where);

  // The library's Pattern::find_matches: the whole of `s` as alternating non-match / match
  // ranges; an empty `s` gives one empty non-match.
  void find_matches(const std::string& s, std::vector<Match>* out) const;

 private:
  std::shared_ptr<void> code_;  // pcre2_code (shared: components are copied freely)
};

// A SplitPattern / Replace pattern: {"String": "..."} (literal) or {"Regex": "..."}.
struct Pattern {
  std::string literal;
  std::shared_ptr<Regex> regex;

  void find_matches(const std::string& s, std::vector<Match>* out) const;
  // Every match replaced by `content`.
  std::string replace_all(const std::string& s, const std::string& content) const;
};

}  // namespace alpaca::tokenizer::detail
