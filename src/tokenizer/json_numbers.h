// Private to src/tokenizer: reading tokenizer.json's numbers as the `tokenizers` library reads them.
//
// The library parses tokenizer.json with serde_json built without its `float_roundtrip` feature,
// whose number parse is not correctly rounded: the decimal digits become one u64 (digits past its
// range are dropped) that is converted to f64 and then multiplied or divided by a power of ten, two
// roundings. A Unigram score with 17 significant digits (every float32 score sentencepiece wrote,
// printed as f64) comes out 1 ulp away from strtod's value about one time in ten; the Viterbi
// lattice breaks its exact ties ("0" + "000" against "000" + "0") by those last bits, so the scores
// must be the library's, not the correctly rounded ones. nlohmann's parser hands each number's text
// to its SAX events; the whole document is built with those numbers read by serde_json's algorithm.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace alpaca::tokenizer::detail {

// A JSON number (the grammar nlohmann's lexer accepted) as serde_json 1.x reads it into an f64
// (de.rs: parse_integer / parse_decimal / parse_exponent, f64_from_parts without float_roundtrip).
// Where serde_json fails (out of range) this returns `fallback` (the document keeps nlohmann's
// strtod value: such a tokenizer.json does not load in the library at all).
double serde_json_f64(std::string_view text, double fallback);

// nlohmann::json::parse(text) with every floating-point number read by serde_json_f64; throws
// json::parse_error as parse does.
nlohmann::json parse_json_as_serde(const std::string& text);

}  // namespace alpaca::tokenizer::detail
