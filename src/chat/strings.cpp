// Python's str methods over UTF-8: characters are code points wherever Python counts them.
#include "strings.h"

#include <utf8proc.h>

#include "lexer.h"
#include "value.h"

namespace alpaca::chat {

namespace {

bool is_space_at(std::string_view s, size_t i, size_t* len) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  *len = 1;
  if (is_py_space(c)) return true;
  // U+0085, U+00A0 (2 bytes) and U+2028/U+2029/U+3000/U+2000-200A/U+202F/U+205F/U+1680 (3 bytes)
  if (c == 0xc2 && i + 1 < s.size() && (static_cast<unsigned char>(s[i + 1]) == 0x85 || static_cast<unsigned char>(s[i + 1]) == 0xa0)) {
    *len = 2;
    return true;
  }
  if (i + 2 < s.size()) {
    unsigned char d = static_cast<unsigned char>(s[i + 1]), e = static_cast<unsigned char>(s[i + 2]);
    bool ws = (c == 0xe2 && d == 0x80 && (e <= 0x8a || e == 0xa8 || e == 0xa9 || e == 0xaf)) ||
              (c == 0xe2 && d == 0x81 && e == 0x9f) || (c == 0xe3 && d == 0x80 && e == 0x80) ||
              (c == 0xe1 && d == 0x9a && e == 0x80);
    if (ws) {
      *len = 3;
      return true;
    }
  }
  return false;
}

}  // namespace

std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  std::vector<std::string_view> cs = utf8_chars(s);
  std::vector<std::string_view> set;
  if (chars) set = utf8_chars(*chars);
  auto strip_it = [&](std::string_view c) {
    if (!chars) {
      size_t len = 0;
      return is_space_at(c, 0, &len) && len == c.size();
    }
    for (std::string_view x : set)
      if (x == c) return true;
    return false;
  };
  size_t lo = 0, hi = cs.size();
  if (left)
    while (lo < hi && strip_it(cs[lo])) ++lo;
  if (right)
    while (hi > lo && strip_it(cs[hi - 1])) --hi;
  std::string out;
  for (size_t i = lo; i < hi; ++i) out += cs[i];
  return out;
}

namespace {

// Maps each code point of `s` through utf8proc's simple case mapping; `first` maps the first one.
template <typename F, typename G>
std::string map_case(std::string_view s, F first, G rest) {
  std::string out;
  out.reserve(s.size());
  bool at_first = true;
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  utf8proc_ssize_t left = static_cast<utf8proc_ssize_t>(s.size());
  while (left > 0) {
    utf8proc_int32_t cp = 0;
    utf8proc_ssize_t n = utf8proc_iterate(p, left, &cp);
    if (n <= 0) {  // not UTF-8: the byte passes through
      out += static_cast<char>(*p);
      ++p;
      --left;
      at_first = false;
      continue;
    }
    utf8proc_uint8_t buf[4];
    utf8proc_ssize_t m = utf8proc_encode_char(at_first ? first(cp) : rest(cp), buf);
    out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(m));
    p += n;
    left -= n;
    at_first = false;
  }
  return out;
}

bool is_cased(utf8proc_int32_t cp) {
  auto c = utf8proc_category(cp);
  return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
}

}  // namespace

std::string py_upper(std::string_view s) { return map_case(s, utf8proc_toupper, utf8proc_toupper); }
std::string py_lower(std::string_view s) { return map_case(s, utf8proc_tolower, utf8proc_tolower); }
std::string py_capitalize(std::string_view s) { return map_case(s, utf8proc_totitle, utf8proc_tolower); }

// str.title(): a cased character after a cased one is lowered, any other is title-cased.
std::string py_title(std::string_view s) {
  bool prev_cased = false;
  auto step = [&prev_cased](utf8proc_int32_t cp) {
    utf8proc_int32_t r = prev_cased ? utf8proc_tolower(cp) : utf8proc_totitle(cp);
    prev_cased = is_cased(cp);
    return r;
  };
  return map_case(s, step, step);
}

// jinja2: "".join(w[0].upper() + w[1:].lower() for w in re.split(r"([-\s({\[<]+)", s) if w)
std::string jinja_title(std::string_view s) {
  std::string out;
  bool word_start = true;
  for (std::string_view c : utf8_chars(s)) {
    size_t len = 0;
    bool sep = (is_space_at(c, 0, &len) && len == c.size()) || c == "-" || c == "(" || c == "{" || c == "[" || c == "<";
    out += sep ? std::string(c) : word_start ? py_upper(c) : py_lower(c);
    word_start = sep;
  }
  return out;
}

std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep, long maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<long>(out.size()) < maxsplit) {
      size_t q = s.find(*sep, pos);
      if (q == std::string_view::npos) break;
      out.emplace_back(s.substr(pos, q - pos));
      pos = q + sep->size();
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  size_t i = 0, len = 0;
  while (true) {
    while (i < s.size() && is_space_at(s, i, &len)) i += len;
    if (i >= s.size()) break;
    if (maxsplit >= 0 && static_cast<long>(out.size()) >= maxsplit) {
      std::string rest(s.substr(i));
      out.push_back(py_strip(rest, std::nullopt, false, true));
      break;
    }
    size_t j = i;
    while (j < s.size() && !is_space_at(s, j, &len)) j += len;
    out.emplace_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

std::vector<std::string> py_rsplit(std::string_view s, const std::optional<std::string>& sep, long maxsplit) {
  if (maxsplit < 0 || !sep) return py_split(s, sep, maxsplit);
  std::vector<std::string> out;
  size_t end = s.size();
  while (static_cast<long>(out.size()) < maxsplit) {
    if (end < sep->size()) break;
    size_t q = s.rfind(*sep, end - sep->size());
    if (q == std::string_view::npos) break;
    out.emplace_back(s.substr(q + sep->size(), end - q - sep->size()));
    end = q;
  }
  out.emplace_back(s.substr(0, end));
  return {out.rbegin(), out.rend()};
}

std::vector<std::string> py_splitlines(std::string_view s, bool keepends) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    size_t brk = 0;
    if (c == '\r' && i + 1 < s.size() && s[i + 1] == '\n') brk = 2;
    else if (c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1e)) brk = 1;
    if (!brk) continue;
    out.emplace_back(s.substr(start, (keepends ? i + brk : i) - start));
    i += brk - 1;
    start = i + 1;
  }
  if (start < s.size()) out.emplace_back(s.substr(start));
  return out;
}

std::string py_replace(std::string_view s, std::string_view old, std::string_view repl, long count) {
  std::string out;
  if (old.empty()) {  // Python inserts `repl` around every character
    std::vector<std::string_view> cs = utf8_chars(s);
    long n = 0;
    for (size_t i = 0; i <= cs.size(); ++i) {
      if (count < 0 || n < count) {
        out += repl;
        ++n;
      }
      if (i < cs.size()) out += cs[i];
    }
    return out;
  }
  size_t pos = 0;
  long n = 0;
  while (count < 0 || n < count) {
    size_t q = s.find(old, pos);
    if (q == std::string_view::npos) break;
    out.append(s.substr(pos, q - pos));
    out.append(repl);
    pos = q + old.size();
    ++n;
  }
  out.append(s.substr(pos));
  return out;
}

size_t py_count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return utf8_length(s) + 1;
  size_t n = 0;
  for (size_t q = s.find(sub); q != std::string_view::npos; q = s.find(sub, q + sub.size())) ++n;
  return n;
}

}  // namespace alpaca::chat
