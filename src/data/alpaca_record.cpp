// Strict loading of Alpaca records from a JSON array or JSON Lines file.
#include "alpaca/data/alpaca_record.h"

#include <fstream>
#include <sstream>

#include "alpaca/util/error.h"
#include "dataset_rows.h"

namespace alpaca::data {

AlpacaRecord alpaca_record_from_row(const Row& v, const std::string& name, int64_t index) {
  ALPACA_CHECK(v.is_object(), name << ": record " << index << " is a " << v.type_name()
                                   << ", expected an object with instruction/input/output");
  auto field = [&](const char* key, bool required) -> std::string {
    auto it = v.find(key);
    if (it == v.end() || it->is_null()) {  // null is absent, as in a Parquet or Arrow row (dataset_rows.h)
      if (required) {
        std::string fields;  // what the record has (a CSV header's " output" shows its space)
        for (const auto& [k, value] : v.items())
          if (!value.is_null()) fields += (fields.empty() ? "\"" : ", \"") + k + "\"";
        ALPACA_FAIL(name << ": record " << index << " has no \"" << key << "\" field (its fields: "
                         << (fields.empty() ? "none" : fields) << "); every record needs instruction and output");
      }
      return "";
    }
    ALPACA_CHECK(it->is_string(), name << ": field \"" << key << "\" of record " << index
                                       << " is a " << it->type_name()
                                       << ", expected a string");
    return it->get<std::string>();
  };
  AlpacaRecord r;
  r.instruction = field("instruction", true);
  r.input = field("input", false);
  r.output = field("output", true);
  return r;
}

std::vector<AlpacaRecord> parse_alpaca_records(const std::string& text, const std::string& name) {
  std::vector<AlpacaRecord> records;
  for_each_json_row(text, name, [&](Row&& row, int64_t index) {
    records.push_back(alpaca_record_from_row(row, name, index));
  });
  return records;
}

std::vector<AlpacaRecord> load_alpaca_records(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  ALPACA_CHECK(in.good(), "cannot open dataset " << path << "; check --data_path");
  std::ostringstream ss;
  ss << in.rdbuf();
  return parse_alpaca_records(ss.str(), path);
}

}  // namespace alpaca::data
