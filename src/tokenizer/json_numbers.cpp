#include "json_numbers.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

namespace alpaca::tokenizer::detail {
namespace {

// serde_json's POW10: the f64 literals 1e0 .. 1e308, each correctly rounded (as rustc and strtod read them).
const std::array<double, 309>& pow10_table() {
  static const std::array<double, 309> table = [] {
    std::array<double, 309> t{};
    for (int i = 0; i <= 308; ++i) t[static_cast<size_t>(i)] = std::strtod(("1e" + std::to_string(i)).c_str(), nullptr);
    return t;
  }();
  return table;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// serde_json's overflow!(a * 10 + b, u64::MAX): whether the next digit would not fit.
bool would_overflow(uint64_t a, uint64_t b) {
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  return a >= kMax / 10 && (a > kMax / 10 || b > kMax % 10);
}

// f64_from_parts without float_roundtrip; false where serde_json reports NumberOutOfRange.
bool f64_from_parts(bool positive, uint64_t significand, int64_t exponent, double* out) {
  const auto& pow10 = pow10_table();
  double f = static_cast<double>(significand);  // round to nearest, as `significand as f64`
  for (;;) {
    const uint64_t index = exponent < 0 ? static_cast<uint64_t>(-exponent) : static_cast<uint64_t>(exponent);
    if (index < pow10.size()) {
      if (exponent >= 0) {
        f *= pow10[index];
        if (std::isinf(f)) return false;
      } else {
        f /= pow10[index];
      }
      break;
    }
    if (f == 0.0) break;
    if (exponent >= 0) return false;
    f /= 1e308;
    exponent += 308;
  }
  *out = positive ? f : -f;
  return true;
}

}  // namespace

double serde_json_f64(std::string_view s, double fallback) {
  size_t i = 0;
  const bool positive = !(i < s.size() && s[i] == '-');
  if (!positive) ++i;
  uint64_t significand = 0;
  int64_t exponent = 0;
  // Integer part: parse_integer, then parse_long_integer once a digit does not fit (that digit and
  // every later integer digit only scale by ten).
  if (i < s.size() && s[i] == '0') {
    ++i;
  } else {
    bool long_integer = false;
    for (; i < s.size() && is_digit(s[i]); ++i) {
      const auto digit = static_cast<uint64_t>(s[i] - '0');
      if (!long_integer && would_overflow(significand, digit)) long_integer = true;
      if (long_integer) {
        ++exponent;
      } else {
        significand = significand * 10 + digit;
      }
    }
  }
  // Fraction: parse_decimal; from the first digit that does not fit on (parse_decimal_overflow),
  // the rest are ignored.
  if (i < s.size() && s[i] == '.') {
    ++i;
    bool dropped = false;
    for (; i < s.size() && is_digit(s[i]); ++i) {
      const auto digit = static_cast<uint64_t>(s[i] - '0');
      if (!dropped && would_overflow(significand, digit)) dropped = true;
      if (dropped) continue;
      significand = significand * 10 + digit;
      --exponent;
    }
  }
  // Exponent: parse_exponent (saturating; an i32 overflow is parse_exponent_overflow).
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    bool positive_exp = true;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) positive_exp = s[i++] == '+';
    int64_t e = 0;
    for (; i < s.size() && is_digit(s[i]); ++i) {
      e = e * 10 + (s[i] - '0');
      if (e > std::numeric_limits<int32_t>::max()) {
        if (significand != 0 && positive_exp) return fallback;  // NumberOutOfRange
        return positive ? 0.0 : -0.0;
      }
    }
    constexpr int64_t kMin = std::numeric_limits<int32_t>::min(), kMax = std::numeric_limits<int32_t>::max();
    exponent = std::clamp<int64_t>(positive_exp ? exponent + e : exponent - e, kMin, kMax);
  }
  double out = 0;
  return f64_from_parts(positive, significand, exponent, &out) ? out : fallback;
}

namespace {

// nlohmann's DOM builder with serde_json's numbers (sax_parse calls the hiding member).
class SerdeNumbersDomParser : public nlohmann::detail::json_sax_dom_parser<nlohmann::json> {
 public:
  using json_sax_dom_parser::json_sax_dom_parser;
  bool number_float(double strtod_value, const std::string& text) {
    return json_sax_dom_parser::number_float(serde_json_f64(text, strtod_value), text);
  }
};

}  // namespace

nlohmann::json parse_json_as_serde(const std::string& text) {
  nlohmann::json doc;
  SerdeNumbersDomParser sax(doc, /*allow_exceptions=*/true);
  nlohmann::json::sax_parse(text, &sax);
  return doc;
}

}  // namespace alpaca::tokenizer::detail
