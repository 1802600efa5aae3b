// Text helpers; see include/alpaca/util/text.h.
#include "alpaca/util/text.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
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

ByteSize parse_byte_size(const std::string& text) {
  const size_t first = text.find_first_not_of(" \t\n\r");
  const std::string s = first == std::string::npos ? "" : text.substr(first, text.find_last_not_of(" \t\n\r") - first + 1);
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0 || std::count(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(i), '.') > 1)
    return {0, "is not a size; use e.g. 5GB, 500MB or a byte count"};
  const std::string unit = s.substr(i);
  const std::string upper = [&] {
    std::string u = unit;
    std::transform(u.begin(), u.end(), u.begin(), [](unsigned char c) { return std::toupper(c); });
    return u;
  }();
  static const std::map<std::string, double> scales = {{"", 1},         {"B", 1},
                                                       {"KB", 1e3},     {"MB", 1e6},
                                                       {"GB", 1e9},     {"KIB", 1024.0},
                                                       {"MIB", 1048576.0}, {"GIB", 1073741824.0}};
  const auto it = scales.find(upper);
  if (it == scales.end()) return {0, "has an unknown unit '" + unit + "'; use B, KB, MB, GB, KiB, MiB or GiB"};
  // transformers: "Gb", "Mb", "Kb" (a lower-case b after a decimal unit) count bits.
  const bool bits = upper.size() == 2 && unit.back() == 'b';
  const double exact = std::strtod(s.substr(0, i).c_str(), nullptr) * it->second / (bits ? 8 : 1);
  // Compare before the cast: a double at or above 2^63 (or inf) has no integer value.
  if (!(exact < 9.2e18)) return {0, "is larger than any file; use e.g. 5GB"};
  const auto bytes = static_cast<long long>(exact);
  if (bytes <= 0) return {0, "must be more than 0 bytes"};
  return {bytes, ""};
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
