// Shared by the token-exact tests of tests/tokenizer/ against a Python fixture: the edge-case list
// (ids, and both decodes of the reference ids), a case_reference() case (roles; ids with and
// without special tokens, both decodes) and train.py's examples (input ids and labels).
#pragma once

#include <algorithm>
#include <iostream>

#include <gtest/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
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

// Role ids as AutoTokenizer reports them (null when the role is None).
inline void expect_roles(const Tokenizer& tok, const nlohmann::json& roles) {
  using nlohmann::json;
  auto id_of = [&](const json& r) { return r[1].is_null() ? std::optional<int64_t>() : r[1].get<int64_t>(); };
  if (!roles["eos"][0].is_null()) {
    EXPECT_EQ(tok.eos_token(), roles["eos"][0].get<std::string>());
    EXPECT_EQ(tok.eos_id(), *id_of(roles["eos"]));
  }
  if (roles["bos"][0].is_null()) {
    EXPECT_EQ(tok.bos_token(), "");
  } else {
    EXPECT_EQ(tok.bos_token(), roles["bos"][0].get<std::string>());
    EXPECT_EQ(tok.bos_id(), *id_of(roles["bos"]));
  }
  EXPECT_EQ(tok.pad_id(), id_of(roles["pad"]));
  for (const char* r : {"sep", "cls", "mask", "unk"})
    if (!roles[r][0].is_null()) {
      EXPECT_EQ(tok.token_to_id(roles[r][0].get<std::string>()), id_of(roles[r])) << r;
    }
}

// Ours and the reference hold the same pieces in another order and decode to the same text: two
// segmentations with the same summed score in exact arithmetic (a Unigram lattice tie such as
// "0"+"000" vs "000"+"0" on "0000"). The library breaks such ties by 1-ulp differences in the scores
// as it parses them (serde_json's default float parsing is not correctly rounded; ours, strtod, is),
// and tokenizers' UnigramTrainer is not reproducible, so a fixture's vocabulary may or may not hold
// one: a tie is reported, not counted as a difference.
inline bool is_reordered_tie(const Tokenizer& tok, std::vector<int64_t> a, std::vector<int64_t> b) {
  if (a == b) return true;
  if (tok.decode(a, false) != tok.decode(b, false)) return false;
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  return a == b;
}

// A case of tokenizer_classes_reference.py's case_reference (ref: "texts", "ids", "ids_plain",
// "decoded", "decoded_skip"): counts the texts whose ids with / without the special tokens or whose
// decodes differ, reporting the first few.
inline size_t compare_texts(const Tokenizer& tok, const nlohmann::json& ref) {
  using nlohmann::json;
  const auto& texts = ref["texts"];
  size_t bad = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string text = texts[i].get<std::string>();
    const auto want = ref["ids"][i].get<std::vector<int64_t>>();
    const auto got = tok.encode(text, true);
    const auto got_plain = tok.encode(text, false);
    const std::string dec = tok.decode(want, false), dec_skip = tok.decode(want, true);
    const bool same = got == want && got_plain == ref["ids_plain"][i].get<std::vector<int64_t>>() &&
                      dec == ref["decoded"][i].get<std::string>() && dec_skip == ref["decoded_skip"][i].get<std::string>();
    if (!same && is_reordered_tie(tok, got, want) &&
        is_reordered_tie(tok, got_plain, ref["ids_plain"][i].get<std::vector<int64_t>>()) &&
        dec == ref["decoded"][i].get<std::string>() && dec_skip == ref["decoded_skip"][i].get<std::string>()) {
      std::cout << "  text " << i << ": the same pieces in another order (an exact Viterbi tie, e.g. \"0\"+\"000\" vs "
                   "\"000\"+\"0\", which the library breaks by 1-ulp differences in the scores it parses): "
                << json(got).dump() << " vs " << json(want).dump() << "\n";
      continue;
    }
    if (!same && ++bad <= 3)
      ADD_FAILURE() << "text " << i << " "
                    << json(text.substr(0, 80)).dump(-1, ' ', false, json::error_handler_t::replace)  // may cut a character
                    << ": ours " << json(got).dump() << " / " << json(got_plain).dump() << " " << json(dec).dump()
                    << " " << json(dec_skip).dump()
                    << "\nreference " << ref["ids"][i].dump() << " / " << ref["ids_plain"][i].dump() << " "
                    << ref["decoded"][i].dump() << " " << ref["decoded_skip"][i].dump();
  }
  return bad;
}

// Whether a reference line {"input_ids": [...], "labels": [...]} is our example.
inline bool same_example(const nlohmann::json& line, const data::Example& ex) {
  return line["input_ids"].get<std::vector<int64_t>>() == ex.input_ids &&
         line["labels"].get<std::vector<int64_t>>() == ex.labels;
}

}  // namespace alpaca::tokenizer::parity
