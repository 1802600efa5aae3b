// Shared by the token-exact tests of tests/tokenizer/ against a Python fixture: the edge-case list
// (ids, and both decodes of the reference ids) and train.py's examples (input ids and labels).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "alpaca/data/alpaca_example.h"
#include "alpaca/tokenizer/tokenizer.h"

namespace alpaca::tokenizer::parity {

// Encodes texts[i] with the special tokens and compares with edge[i]["ids"]; the reference ids
// decoded with and without special tokens must give edge[i]["decoded"] / ["decoded_skip"].
// Returns how many encodings differ (the first five are reported, prefixed by `label`).
inline size_t count_edge_differences(const Tokenizer& tok, const nlohmann::json& texts, const nlohmann::json& edge,
                                     const std::string& label) {
  using nlohmann::json;
  size_t bad = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string text = texts[i].get<std::string>();
    const json& e = edge[i];
    const auto want = e["ids"].get<std::vector<int64_t>>();
    const auto got = tok.encode(text);
    if (got != want && ++bad <= 5)
      ADD_FAILURE() << label << " edge case " << i << " " << json(text).dump() << ": ours " << json(got).dump()
                    << " reference " << json(want).dump();
    EXPECT_EQ(tok.decode(want, false), e["decoded"].get<std::string>()) << label << " " << json(text).dump();
    EXPECT_EQ(tok.decode(want, true), e["decoded_skip"].get<std::string>()) << label << " " << json(text).dump();
  }
  return bad;
}

// Whether a reference line {"input_ids": [...], "labels": [...]} is our example.
inline bool same_example(const nlohmann::json& line, const data::Example& ex) {
  return line["input_ids"].get<std::vector<int64_t>>() == ex.input_ids &&
         line["labels"].get<std::vector<int64_t>>() == ex.labels;
}

}  // namespace alpaca::tokenizer::parity
