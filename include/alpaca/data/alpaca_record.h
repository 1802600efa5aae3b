// Alpaca instruction records and their loader. Accepts a JSON array of objects (alpaca_data.json)
// or JSON Lines (one object per non-blank line). Strict: every problem is an alpaca::Error that
// names the file and the record index (and line/column for malformed JSON), so a bad dataset
// fails before any training starts.
#pragma once

#include <string>
#include <vector>

namespace alpaca::data {

struct AlpacaRecord {
  std::string instruction;
  std::string input;  // "" when the record has no "input" field (train.py: example.get("input", ""))
  std::string output;
};

// Loads records from `path`. Fields other than instruction/input/output are ignored.
// Errors: unreadable file, malformed JSON (line:column), invalid UTF-8, a record that is not an
// object, missing instruction/output, a non-string field, an empty dataset.
std::vector<AlpacaRecord> load_alpaca_records(const std::string& path);

// Same, from text already in memory; `name` is used in error messages.
std::vector<AlpacaRecord> parse_alpaca_records(const std::string& text, const std::string& name);

}  // namespace alpaca::data
