// Private to src/data: the dataset files as rows of JSON, whatever the file format, before they
// become Alpaca records or conversations (conversation.h). JSON arrays and JSON Lines are parsed
// here (json_rows.cpp, with the line:column and record errors Alpaca loading always had); Parquet
// and Arrow IPC go through the Arrow C++ library of the pyarrow wheel (arrow_rows.cpp, the only
// file that includes Arrow). Rows are nlohmann::ordered_json so message keys keep their order
// (a chat template's `tojson` prints them in the order Python's dict would).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>  // defines: nlohmann::ordered_json
#include <string>
#include <vector>

#include "alpaca/data/alpaca_record.h"

namespace alpaca::data {

using Row = nlohmann::ordered_json;

// JSON array of rows or JSON Lines (one row per non-blank line), chosen by the first character;
// a UTF-8 BOM is skipped. Errors name `name`, the record and line:column of malformed JSON.
// `on_row(row, index)` is called for every row in order (JSON Lines: as each line parses, so a
// bad record is reported before a later malformed line, as Alpaca loading always did).
void for_each_json_row(const std::string& text, const std::string& name,
                       const std::function<void(Row&&, int64_t)>& on_row);

// stanford_alpaca's record from one row: instruction and output required, input "" when absent.
// A null member is an absent one (the same row read from Parquet has no such member); any other
// non-string value is an error.
AlpacaRecord alpaca_record_from_row(const Row& v, const std::string& name, int64_t index);

// Every row of a Parquet file / an Arrow IPC file or stream (save_to_disk's data-*.arrow), one
// object per table row with the columns as members. Null columns and null struct fields are left
// out at every level: Arrow has no "absent", a column or struct holds null where a JSON object
// had no key (pyarrow and `datasets` fill the union of the keys they saw).
std::vector<Row> read_parquet_rows(const std::string& path);
std::vector<Row> read_arrow_rows(const std::string& path);
// Every row of a CSV file with a header row, split as `datasets.load_dataset("csv")` (pandas'
// read_csv) splits it: quoted fields with commas, doubled quotes and newlines, blank lines skipped,
// a UTF-8 BOM dropped. Every cell is the text it is, as Python's csv module reads it: pandas makes
// an empty cell and words like "NA", "None", "null" missing (None: "None" in the prompt of
// train.py's f-string, an error in TRL) and a column whose every cell is a number numbers ("3.50"
// -> 3.5), neither of which an instruction dataset wants; here an empty cell is "" (an empty
// input: the no-input prompt).
std::vector<Row> read_csv_rows(const std::string& path);

}  // namespace alpaca::data
