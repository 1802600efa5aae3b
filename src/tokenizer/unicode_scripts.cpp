// script_of (unicode_scripts.h) over a table read off the pinned `tokenizers` library's behaviour
// by tests/reference/unicode_scripts_table.py, which regenerates unicode_scripts_table.inc.
#include "unicode_scripts.h"

#include <algorithm>
#include <iterator>

namespace alpaca::tokenizer::detail {
namespace {

struct ScriptRange {
  uint32_t first, last;
  uint8_t script;
};

constexpr ScriptRange kScriptRanges[] = {
#include "unicode_scripts_table.inc"
};

}  // namespace

int script_of(uint32_t c) {
  // The last range starting at or before c, if it reaches c.
  const auto* it = std::upper_bound(std::begin(kScriptRanges), std::end(kScriptRanges), c,
                                    [](uint32_t v, const ScriptRange& r) { return v < r.first; });
  if (it == std::begin(kScriptRanges)) return kAnyScript;
  --it;
  return c <= it->last ? it->script : kAnyScript;
}

}  // namespace alpaca::tokenizer::detail
