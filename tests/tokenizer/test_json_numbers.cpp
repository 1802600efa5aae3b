// tokenizer.json's numbers as the `tokenizers` library reads them (src/tokenizer/json_numbers.h:
// serde_json without float_roundtrip), against the pinned library's own values
// (tests/reference/json_numbers_reference.py: 9.5k number texts, about one in eight read other
// than correctly rounded): every value bit for bit, directly and through the parsed document.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

// src/tokenizer is not on the include path: its regex.h would shadow the system <regex.h> gtest includes.
#include "../../src/tokenizer/json_numbers.h"
#include "test_util.h"

namespace test_json_numbers {

using alpaca::tokenizer::detail::parse_json_as_serde;

namespace {

uint64_t bits(double x) {
  uint64_t b = 0;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// What the document gets: serde_json's value, strtod's (nlohmann's) where serde_json fails.
double serde_json_f64(const std::string& text) {
  return alpaca::tokenizer::detail::serde_json_f64(text, std::strtod(text.c_str(), nullptr));
}

std::filesystem::path fixture() { return std::filesystem::path(alpaca::testing::binary_dir()) / "fixtures/json_numbers"; }

}  // namespace

TEST(JsonNumbers, SerdeJsonValuesBitForBit) {
  const auto path = fixture() / "numbers.json";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " not written (no tokenizers?)";
  const auto ref = nlohmann::json::parse(std::ifstream(path));
  const auto& texts = ref["texts"];
  const auto& parsed = ref["parsed"];
  ASSERT_EQ(texts.size(), parsed.size());
  int differ = 0, not_strtod = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string t = texts[i].get<std::string>();
    const double want = std::strtod(parsed[i].get<std::string>().c_str(), nullptr);  // float.hex: exact
    const double got = serde_json_f64(t);
    if (bits(got) != bits(want) && ++differ <= 10)
      ADD_FAILURE() << t << ": ours " << got << " (" << std::hexfloat << got << "), the library's " << want
                    << std::defaultfloat;
    not_strtod += bits(want) != bits(std::strtod(t.c_str(), nullptr));
  }
  EXPECT_EQ(differ, 0);
  // The check bites: strtod (correctly rounded) would miss these.
  EXPECT_GT(not_strtod, 100);
  // Through the document: the Unigram scores as the loader sees them.
  std::ifstream in(ref["tokenizer"].get<std::string>());
  std::stringstream ss;
  ss << in.rdbuf();
  const nlohmann::json doc = parse_json_as_serde(ss.str());
  const auto& vocab = doc["model"]["vocab"];
  ASSERT_EQ(vocab.size(), texts.size() + 1);
  int doc_differ = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const double want = std::strtod(parsed[i].get<std::string>().c_str(), nullptr);
    const double got = vocab[i + 1][1].get<double>();
    doc_differ += !(bits(got) == bits(want) || (got == 0 && want == 0));  // "-0" is an integer to nlohmann
  }
  EXPECT_EQ(doc_differ, 0);
  std::cout << "[json numbers] " << texts.size() << " numbers, all as the library reads them; " << not_strtod
            << " of them not strtod's value\n";
}

TEST(JsonNumbers, EdgesAndErrorsAsSerdeJson) {
  EXPECT_EQ(bits(serde_json_f64("-0")), bits(-0.0));
  EXPECT_EQ(serde_json_f64("1e5"), 1e5);
  EXPECT_EQ(serde_json_f64("-2.5E-3"), -2.5 / 1000);
  EXPECT_EQ(serde_json_f64("1e-400"), 0.0);          // underflows to zero, as 1e-400 / 1e308 / ...
  EXPECT_EQ(serde_json_f64("0e99999999999"), 0.0);   // exponent past i32 with a zero significand
  EXPECT_EQ(serde_json_f64("1e400"), HUGE_VAL);      // serde_json: out of range; strtod's value kept
  // Digits past the u64 significand are dropped, not rounded: of 20 nines, 19 are kept and the last scales by ten.
  EXPECT_EQ(serde_json_f64("99999999999999999999"), 9999999999999999999.0 * 10);
  EXPECT_THROW(parse_json_as_serde("{\"a\": 1.}"), nlohmann::json::parse_error);
}

}  // namespace test_json_numbers
