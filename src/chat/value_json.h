// JSON text -> Value (key order kept); the other way is to_json() in value.h.
#pragma once

#include <string_view>

#include "value.h"

namespace alpaca::chat {

// Throws alpaca::Error when `text` is not JSON.
Value parse_json_value(std::string_view text);

}  // namespace alpaca::chat
