// Python str operations on UTF-8 text, as chat templates call them (methods and filters).
// Case mapping is Unicode's simple mapping (utf8proc): Python's full mappings that change the
// length ('ß'.upper() == 'SS') are not reproduced.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace alpaca::chat {

// str.strip/lstrip/rstrip: whitespace when `chars` is empty-optional, else any of its characters.
std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);
std::string py_capitalize(std::string_view s);
std::string jinja_title(std::string_view s);  // jinja2's `title` filter
std::string py_title(std::string_view s);     // str.title()
// str.split(sep, maxsplit): whitespace runs when `sep` is nullopt.
std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep, long maxsplit);
std::vector<std::string> py_rsplit(std::string_view s, const std::optional<std::string>& sep, long maxsplit);
std::vector<std::string> py_splitlines(std::string_view s, bool keepends);
std::string py_replace(std::string_view s, std::string_view old, std::string_view repl, long count);
size_t py_count(std::string_view s, std::string_view sub);

}  // namespace alpaca::chat
