// Jinja lexer, configured as transformers configures jinja2 for chat templates: trim_blocks and
// lstrip_blocks on, `{%-`/`-%}` whitespace control, `{% raw %}`, comments dropped, newlines
// normalised to "\n" and one trailing newline of the source removed (keep_trailing_newline off).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace alpaca::chat {

enum class Tok : uint8_t { kData, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };

struct Token {
  Tok type;
  std::string text;  // data text, name, decoded string literal, number text or operator
  int line;          // 1-based line of the template where the token starts
};

// Throws alpaca::Error naming the line on an unterminated tag, comment, string or a stray
// character inside a tag. `origin` names the template in messages.
std::vector<Token> lex(std::string_view source, std::string_view origin);

// Python's str.rstrip()/lstrip() whitespace (ASCII subset: \t \n \v \f \r, \x1c-\x1f, space).
bool is_py_space(unsigned char c);

}  // namespace alpaca::chat
