// Text helpers; see include/alpaca/util/text.h.
#include "alpaca/util/text.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <stdexcept>

namespace alpaca::text {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

std::optional<bool> parse_bool_text(const std::string& text) {
  const std::string s = lower(text);
  // HF's string_to_bool accepts these spellings.
  if (s == "true" || s == "1" || s == "yes" || s == "y" || s == "t") return true;
  if (s == "false" || s == "0" || s == "no" || s == "n" || s == "f") return false;
  return std::nullopt;
}

std::optional<long> parse_whole_long(const std::string& text) {
  size_t used = 0;
  long v = 0;
  try {
    v = std::stol(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (text.empty() || used != text.size()) return std::nullopt;
  return v;
}

double byte_unit_scale(const std::string& upper_unit) {
  static const std::map<std::string, double> scales = {{"", 1},           {"KB", 1e3},
                                                       {"MB", 1e6},       {"GB", 1e9},
                                                       {"KIB", 1024.0},   {"MIB", 1024.0 * 1024},
                                                       {"GIB", 1024.0 * 1024 * 1024}};
  auto it = scales.find(upper_unit);
  return it == scales.end() ? 0 : it->second;
}

std::string closest_name(const std::string& unknown, const std::vector<std::string>& known) {
  auto distance = [](const std::string& a, const std::string& b) {
    std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      cur[0] = i;
      for (size_t j = 1; j <= b.size(); ++j) {
        size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
        cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
      }
      std::swap(prev, cur);
    }
    return prev[b.size()];
  };
  std::string best;
  size_t best_d = static_cast<size_t>(-1);
  for (const auto& k : known) {
    size_t d = distance(unknown, k);
    if (d < best_d) best_d = d, best = k;
  }
  // Beyond about a third of the word, a "suggestion" is noise rather than the intended flag.
  size_t limit = std::max<size_t>(2, unknown.size() / 3);
  return best_d <= limit ? best : "";
}

}  // namespace alpaca::text
