// PCRE2 behind regex.h: compiled once per pattern (JIT when available), matched as the
// `tokenizers` crate's find_matches walks a string.
#include "regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

#include "alpaca/util/error.h"
#include "utf8.h"

namespace alpaca::tokenizer::detail {

Regex::Regex(const std::string& pattern, const std::string& where) {
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
  if (!code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof buf);
    ALPACA_FAIL(where << ": regex " << nlohmann::json(pattern).dump() << " does not compile at offset "
                      << off << ": " << reinterpret_cast<const char*>(buf));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional speed-up; falls back to the interpreter
  code_.reset(code, pcre2_code_free);
}

void Regex::find_matches(const std::string& s, std::vector<Match>* out) const {
  out->clear();
  if (s.empty()) {
    out->push_back({0, 0, false});
    return;
  }
  auto* code = static_cast<pcre2_code*>(code_.get());
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  ALPACA_CHECK(md, "out of memory allocating PCRE2 match data");
  size_t prev = 0, pos = 0;
  uint32_t opts = 0;  // the first call checks the UTF-8, the rest skip it
  while (pos <= s.size()) {
    int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos, opts, md, nullptr);
    opts = PCRE2_NO_UTF_CHECK;
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      pcre2_match_data_free(md);
      ALPACA_FAIL("regex matching failed (PCRE2 error " << rc << "); is the text valid UTF-8?");
    }
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t st = ov[0], en = ov[1];
    if (prev != st) out->push_back({prev, st, false});
    out->push_back({st, en, true});
    prev = en;
    if (en == st) {  // empty match: step over one character
      if (en >= s.size()) break;
      pos = en + utf8_len(static_cast<unsigned char>(s[en]));
    } else {
      pos = en;
    }
  }
  pcre2_match_data_free(md);
  if (prev != s.size()) out->push_back({prev, s.size(), false});
}

void Pattern::find_matches(const std::string& s, std::vector<Match>* out) const {
  if (regex) return regex->find_matches(s, out);
  out->clear();
  if (s.empty()) {
    out->push_back({0, 0, false});
    return;
  }
  size_t prev = 0;
  if (!literal.empty()) {
    for (size_t at = s.find(literal); at != std::string::npos; at = s.find(literal, prev)) {
      if (prev != at) out->push_back({prev, at, false});
      out->push_back({at, at + literal.size(), true});
      prev = at + literal.size();
    }
  }
  if (prev != s.size()) out->push_back({prev, s.size(), false});
}

std::string Pattern::replace_all(const std::string& s, const std::string& content) const {
  std::vector<Match> m;
  find_matches(s, &m);
  std::string out;
  for (const auto& x : m) out += x.is_match ? content : s.substr(x.start, x.end - x.start);
  return out;
}

}  // namespace alpaca::tokenizer::detail
