// Jinja lexer: a transcription of jinja2.lexer.Lexer.tokeniter for the default delimiters with
// trim_blocks=True, lstrip_blocks=True (what transformers' chat template environment uses).
#include "lexer.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "alpaca/util/error.h"

namespace alpaca::chat {

bool is_py_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); }

namespace {

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Lexer {
 public:
  Lexer(std::string source, std::string_view origin) : src_(std::move(source)), origin_(origin) {}
  std::vector<Token> run();

 private:
  [[noreturn]] void fail(size_t at, const std::string& what) const {
    ALPACA_FAIL(origin_ << " line " << line_at(at) << ": " << what);
  }
  // Tokens come in source order, so counting resumes from the last position asked about.
  int line_at(size_t at) const {
    at = std::min(at, src_.size());
    if (at < line_pos_) line_pos_ = 0, line_no_ = 1;
    for (; line_pos_ < at; ++line_pos_) line_no_ += src_[line_pos_] == '\n';
    return line_no_;
  }
  void emit(Tok t, std::string text, size_t at) { out_.push_back({t, std::move(text), line_at(at)}); }
  void data_before_tag(std::string text, char sign, bool is_variable, size_t at);
  size_t lex_tag(size_t pos, bool is_block);
  size_t lex_comment(size_t pos);
  size_t raw_begin(size_t open) const;
  size_t lex_raw(size_t open, size_t body);
  size_t tag_end_len(size_t pos, bool is_block) const;
  size_t lex_string(size_t pos);
  size_t lex_number(size_t pos);

  std::string src_;
  std::string_view origin_;
  std::vector<Token> out_;
  bool line_starting_ = true;
  mutable size_t line_pos_ = 0;
  mutable int line_no_ = 1;
};

// The text before a tag, with `{%-` stripping or lstrip_blocks applied (OptionalLStrip).
void Lexer::data_before_tag(std::string text, char sign, bool is_variable, size_t at) {
  if (sign == '-') {
    size_t n = text.size();
    while (n > 0 && is_py_space(static_cast<unsigned char>(text[n - 1]))) --n;
    text.resize(n);
  } else if (sign != '+' && !is_variable) {
    size_t l_pos = text.rfind('\n');
    l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
    if (l_pos > 0 || line_starting_) {
      bool all_space = l_pos < text.size();
      for (size_t i = l_pos; i < text.size() && all_space; ++i) all_space = is_py_space(static_cast<unsigned char>(text[i]));
      if (all_space) text.resize(l_pos);
    }
  }
  if (!text.empty()) emit(Tok::kData, std::move(text), at);
}

std::vector<Token> Lexer::run() {
  size_t pos = 0;
  while (pos < src_.size()) {
    size_t open = src_.find('{', pos);
    while (open != std::string::npos && open + 1 < src_.size() &&
           std::strchr("%{#", src_[open + 1]) == nullptr)
      open = src_.find('{', open + 1);
    if (open == std::string::npos || open + 1 >= src_.size()) {
      emit(Tok::kData, src_.substr(pos), pos);
      break;
    }
    char kind = src_[open + 1];
    char sign = open + 2 < src_.size() && (src_[open + 2] == '-' || src_[open + 2] == '+') ? src_[open + 2] : 0;
    std::string text = src_.substr(pos, open - pos);
    size_t raw_body = kind == '%' ? raw_begin(open) : 0;
    if (raw_body) {
      data_before_tag(std::move(text), sign, false, pos);
      pos = lex_raw(open, raw_body);
      continue;
    }
    data_before_tag(std::move(text), sign, kind == '{', pos);
    line_starting_ = false;
    size_t body = open + 2 + (sign ? 1 : 0);
    if (kind == '#') {
      pos = lex_comment(body);
    } else {
      emit(kind == '%' ? Tok::kBlockBegin : Tok::kVarBegin, "", open);
      pos = lex_tag(body, kind == '%');
    }
  }
  emit(Tok::kEof, "", src_.size());
  return std::move(out_);
}

// Length of the tag end at `pos` (with what it swallows: -%} whitespace, %} one newline), or 0.
size_t Lexer::tag_end_len(size_t pos, bool is_block) const {
  const char* close = is_block ? "%}" : "}}";
  auto at = [&](size_t p) { return src_.compare(p, 2, close) == 0; };
  size_t n = 0;
  if (is_block && src_[pos] == '+' && at(pos + 1)) return 3;
  if (src_[pos] == '-' && at(pos + 1)) {
    n = pos + 3;
    while (n < src_.size() && is_py_space(static_cast<unsigned char>(src_[n]))) ++n;
    return n - pos;
  }
  if (at(pos)) return (is_block && pos + 2 < src_.size() && src_[pos + 2] == '\n') ? 3 : 2;
  return 0;
}

size_t Lexer::lex_comment(size_t pos) {
  size_t q = src_.find("#}", pos);
  if (q == std::string::npos) fail(pos, "missing end of comment tag");
  size_t end = q + 2;
  if (q > pos && src_[q - 1] == '-') {
    while (end < src_.size() && is_py_space(static_cast<unsigned char>(src_[end]))) ++end;
  } else if (!(q > pos && src_[q - 1] == '+') && end < src_.size() && src_[end] == '\n') {
    ++end;  // trim_blocks
  }
  line_starting_ = src_[end - 1] == '\n';
  return end;
}

// `{% raw %}`: where its body starts, or 0 when the tag at `open` is not a raw tag.
size_t Lexer::raw_begin(size_t open) const {
  size_t p = open + 2;
  if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
  while (p < src_.size() && is_py_space(static_cast<unsigned char>(src_[p]))) ++p;
  if (src_.compare(p, 3, "raw") != 0) return 0;
  p += 3;
  while (p < src_.size() && is_py_space(static_cast<unsigned char>(src_[p]))) ++p;
  if (p < src_.size() && src_[p] == '-' && src_.compare(p + 1, 2, "%}") == 0) {
    p += 3;
    while (p < src_.size() && is_py_space(static_cast<unsigned char>(src_[p]))) ++p;
    return p;
  }
  return src_.compare(p, 2, "%}") == 0 ? p + 2 : 0;
}

// The raw body up to `{% endraw %}` is data, as written (the endraw tag's own - and lstrip apply).
size_t Lexer::lex_raw(size_t open, size_t body) {
  line_starting_ = src_[body - 1] == '\n';
  for (size_t q = src_.find("{%", body); q != std::string::npos; q = src_.find("{%", q + 2)) {
    size_t r = q + 2;
    char sign = r < src_.size() && (src_[r] == '-' || src_[r] == '+') ? src_[r] : 0;
    if (sign) ++r;
    while (r < src_.size() && is_py_space(static_cast<unsigned char>(src_[r]))) ++r;
    if (src_.compare(r, 6, "endraw") != 0) continue;
    r += 6;
    while (r < src_.size() && is_py_space(static_cast<unsigned char>(src_[r]))) ++r;
    size_t n = r < src_.size() ? tag_end_len(r, true) : 0;
    if (n == 0) continue;
    data_before_tag(src_.substr(body, q - body), sign, false, body);
    line_starting_ = src_[r + n - 1] == '\n';
    return r + n;
  }
  fail(open, "missing end of raw directive");
}

size_t Lexer::lex_string(size_t pos) {
  char q = src_[pos];
  std::string raw;
  size_t p = pos + 1;
  while (p < src_.size() && src_[p] != q) {
    if (src_[p] == '\\' && p + 1 < src_.size()) raw += src_[p++];
    raw += src_[p++];
  }
  if (p >= src_.size()) fail(pos, "unterminated string literal");
  // Python's unicode-escape decoding, which jinja2 applies to string literals.
  std::string out;
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] != '\\' || i + 1 >= raw.size()) {
      out += raw[i];
      continue;
    }
    char c = raw[++i];
    switch (c) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'v': out += '\v'; break;
      case '\\': case '\'': case '"': out += c; break;
      case '\n': break;  // line continuation
      case 'x': case 'u': case 'U': {
        size_t n = c == 'x' ? 2 : c == 'u' ? 4 : 8;
        uint32_t cp = 0;
        for (size_t k = 0; k < n; ++k) {
          int d = i + 1 + k < raw.size() ? hex_digit(raw[i + 1 + k]) : -1;
          if (d < 0) fail(pos, std::string("truncated \\") + c + " escape in a string literal");
          cp = cp * 16 + static_cast<uint32_t>(d);
        }
        if (cp > 0x10ffff) fail(pos, "illegal Unicode character in a string literal");
        append_utf8(out, cp);
        i += n;
        break;
      }
      default:
        if (c >= '0' && c <= '7') {
          uint32_t cp = static_cast<uint32_t>(c - '0');
          for (int k = 0; k < 2 && i + 1 < raw.size() && raw[i + 1] >= '0' && raw[i + 1] <= '7'; ++k)
            cp = cp * 8 + static_cast<uint32_t>(raw[++i] - '0');
          append_utf8(out, cp);
        } else {
          out += '\\';
          out += c;
        }
    }
  }
  emit(Tok::kString, std::move(out), pos);
  return p + 1;
}

size_t Lexer::lex_number(size_t pos) {
  size_t p = pos;
  auto digits = [&] {
    while (p < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[p])) ||
                               (src_[p] == '_' && p + 1 < src_.size() && std::isdigit(static_cast<unsigned char>(src_[p + 1])))))
      ++p;
  };
  digits();
  bool is_float = false;
  if (p + 1 < src_.size() && src_[p] == '.' && std::isdigit(static_cast<unsigned char>(src_[p + 1]))) {
    ++p;
    digits();
    is_float = true;
  }
  if (p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
    size_t q = p + 1;
    if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
    if (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) {
      p = q;
      digits();
      is_float = true;
    }
  }
  std::string text;
  for (size_t i = pos; i < p; ++i)
    if (src_[i] != '_') text += src_[i];
  emit(is_float ? Tok::kFloat : Tok::kInt, std::move(text), pos);
  return p;
}

size_t Lexer::lex_tag(size_t pos, bool is_block) {
  std::string balance;
  static const char* kOps2[] = {"//", "**", "==", "!=", ">=", "<="};
  while (true) {
    if (pos >= src_.size()) fail(pos, is_block ? "missing end of block tag '%}'" : "missing end of variable tag '}}'");
    if (balance.empty()) {
      if (size_t n = tag_end_len(pos, is_block)) {
        emit(is_block ? Tok::kBlockEnd : Tok::kVarEnd, "", pos);
        line_starting_ = src_[pos + n - 1] == '\n';
        return pos + n;
      }
    }
    unsigned char c = static_cast<unsigned char>(src_[pos]);
    if (is_py_space(c)) {
      ++pos;
    } else if (std::isdigit(c)) {
      pos = lex_number(pos);
    } else if (std::isalpha(c) || c == '_') {
      size_t e = pos;
      while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
      emit(Tok::kName, src_.substr(pos, e - pos), pos);
      pos = e;
    } else if (c == '\'' || c == '"') {
      pos = lex_string(pos);
    } else {
      std::string op(1, static_cast<char>(c));
      for (const char* o : kOps2)
        if (src_.compare(pos, 2, o) == 0) op = o;
      if (op.size() == 1 && std::strchr("+-/*%~[](){}=<>.:|,;", c) == nullptr)
        fail(pos, std::string("unexpected character '") + static_cast<char>(c) + "' inside a tag");
      if (op == "(" || op == "[" || op == "{") balance += op == "(" ? ')' : op == "[" ? ']' : '}';
      if (op == ")" || op == "]" || op == "}") {
        if (balance.empty()) fail(pos, "unexpected '" + op + "'");
        if (balance.back() != op[0]) fail(pos, "unexpected '" + op + "', expected '" + balance.back() + "'");
        balance.pop_back();
      }
      emit(Tok::kOp, op, pos);
      pos += op.size();
    }
  }
}

// jinja2 splits the source on \r\n, \r and \n and joins it with "\n"; with keep_trailing_newline
// off, one final newline goes.
std::string normalise_newlines(std::string_view source) {
  std::string s;
  s.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      s += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      s += source[i];
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

}  // namespace

std::vector<Token> lex(std::string_view source, std::string_view origin) {
  return Lexer(normalise_newlines(source), origin).run();
}

}  // namespace alpaca::chat
