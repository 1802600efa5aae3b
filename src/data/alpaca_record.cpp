// Strict loading of Alpaca records from a JSON array or JSON Lines file.
#include "alpaca/data/alpaca_record.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "alpaca/util/error.h"

namespace alpaca::data {
namespace {

using nlohmann::json;

// 1-based line and column of byte offset `pos` (0-based) in `text`.
std::pair<int64_t, int64_t> line_col(const std::string& text, size_t pos) {
  int64_t line = 1, col = 1;
  for (size_t i = 0; i < pos && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return {line, col};
}

std::string describe_parse_error(const json::parse_error& e) {
  std::string what = e.what();
  if (what.find("UTF-8") != std::string::npos) return "invalid UTF-8 in a string (" + what + ")";
  return what;
}

AlpacaRecord to_record(const json& v, const std::string& name, int64_t index) {
  ALPACA_CHECK(v.is_object(), name << ": record " << index << " is a " << v.type_name()
                                   << ", expected an object with instruction/input/output");
  auto field = [&](const char* key, bool required) -> std::string {
    auto it = v.find(key);
    if (it == v.end()) {
      ALPACA_CHECK(!required, name << ": record " << index << " has no \"" << key
                                   << "\" field; every record needs instruction and output");
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

}  // namespace

std::vector<AlpacaRecord> parse_alpaca_records(const std::string& raw, const std::string& name) {
  // A UTF-8 byte order mark is not JSON but editors write it; skip it.
  size_t offset = raw.rfind("\xEF\xBB\xBF", 0) == 0 ? 3 : 0;
  std::string text = raw.substr(offset);
  size_t first = text.find_first_not_of(" \t\r\n");
  ALPACA_CHECK(first != std::string::npos,
               name << ": the dataset is empty; expected a JSON array of records or JSON Lines");

  std::vector<AlpacaRecord> records;
  if (text[first] == '[') {
    // Count top-level elements as they start so a parse error can name its record.
    int64_t started = 0;
    json::parser_callback_t count = [&](int depth, json::parse_event_t event, json&) {
      if (depth == 1 && (event == json::parse_event_t::object_start ||
                         event == json::parse_event_t::array_start ||
                         event == json::parse_event_t::value))
        ++started;
      return true;
    };
    json doc;
    try {
      doc = json::parse(text, count);
    } catch (const json::parse_error& e) {
      auto [line, col] = line_col(text, e.byte > 0 ? e.byte - 1 : 0);
      ALPACA_FAIL(name << ": malformed JSON at line " << line << ", column " << col
                       << " (in record " << std::max<int64_t>(started - 1, 0)
                       << "): " << describe_parse_error(e)
                       << "; fix the file or convert it to JSON Lines");
    } catch (const json::out_of_range& e) {
      // A number too large for a double (e.g. -1e3010) is not a parse_error and has no offset.
      ALPACA_FAIL(name << ": malformed JSON (in record " << std::max<int64_t>(started - 1, 0)
                       << "): a number is out of range (" << e.what() << "); fix the file");
    }
    ALPACA_CHECK(doc.is_array(), name << ": expected a JSON array of records");
    records.reserve(doc.size());
    for (size_t i = 0; i < doc.size(); ++i)
      records.push_back(to_record(doc[i], name, static_cast<int64_t>(i)));
  } else {
    std::istringstream lines(text);
    std::string line;
    int64_t line_no = 0;
    while (std::getline(lines, line)) {
      ++line_no;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const int64_t index = static_cast<int64_t>(records.size());
      json v;
      try {
        v = json::parse(line);
      } catch (const json::parse_error& e) {
        auto [l, col] = line_col(line, e.byte > 0 ? e.byte - 1 : 0);
        (void)l;
        ALPACA_FAIL(name << ": malformed JSON at line " << line_no << ", column " << col
                         << " (record " << index << " of the JSON Lines file): "
                         << describe_parse_error(e));
      } catch (const json::out_of_range& e) {
        ALPACA_FAIL(name << ": malformed JSON at line " << line_no << " (record " << index
                         << " of the JSON Lines file): a number is out of range (" << e.what()
                         << "); fix the file");
      }
      records.push_back(to_record(v, name, index));
    }
  }
  ALPACA_CHECK(!records.empty(), name << ": the dataset has no records");
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
