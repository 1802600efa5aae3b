// Jinja parser: tokens -> Template, after jinja2.parser.Parser. Statements it does not support
// (extends, block, include, import, from, with, ...) are errors naming the statement and line.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "ast.h"

namespace alpaca::chat {

std::unique_ptr<Template> parse_template(std::string source, std::string origin);

}  // namespace alpaca::chat
