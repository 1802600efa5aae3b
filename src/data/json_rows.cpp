// Rows of a JSON array or JSON Lines dataset file, with errors that name the record and the
// line:column (moved here from alpaca_record.cpp so every dataset format shares them).
#include <sstream>

#include "alpaca/util/error.h"
#include "dataset_rows.h"

namespace alpaca::data {
namespace {

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

std::string describe_parse_error(const Row::parse_error& e) {
  std::string what = e.what();
  if (what.find("UTF-8") != std::string::npos) return "invalid UTF-8 in a string (" + what + ")";
  return what;
}

int64_t array_rows(const std::string& text, const std::string& name,
                   const std::function<void(Row&&, int64_t)>& on_row) {
  // Count top-level elements as they start so a parse error can name its record.
  int64_t started = 0;
  Row::parser_callback_t count = [&](int depth, Row::parse_event_t event, Row&) {
    if (depth == 1 && (event == Row::parse_event_t::object_start ||
                       event == Row::parse_event_t::array_start ||
                       event == Row::parse_event_t::value))
      ++started;
    return true;
  };
  Row doc;
  try {
    doc = Row::parse(text, count);
  } catch (const Row::parse_error& e) {
    auto [line, col] = line_col(text, e.byte > 0 ? e.byte - 1 : 0);
    ALPACA_FAIL(name << ": malformed JSON at line " << line << ", column " << col
                     << " (in record " << std::max<int64_t>(started - 1, 0)
                     << "): " << describe_parse_error(e)
                     << "; fix the file or convert it to JSON Lines");
  } catch (const Row::out_of_range& e) {
    // A number too large for a double (e.g. -1e3010) is not a parse_error and has no offset.
    ALPACA_FAIL(name << ": malformed JSON (in record " << std::max<int64_t>(started - 1, 0)
                     << "): a number is out of range (" << e.what() << "); fix the file");
  }
  ALPACA_CHECK(doc.is_array(), name << ": expected a JSON array of records");
  for (size_t i = 0; i < doc.size(); ++i) on_row(std::move(doc[i]), static_cast<int64_t>(i));
  return static_cast<int64_t>(doc.size());
}

int64_t json_lines_rows(const std::string& text, const std::string& name,
                        const std::function<void(Row&&, int64_t)>& on_row) {
  std::istringstream lines(text);
  std::string line;
  int64_t line_no = 0, index = 0;
  while (std::getline(lines, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    Row v;
    try {
      v = Row::parse(line);
    } catch (const Row::parse_error& e) {
      auto col = line_col(line, e.byte > 0 ? e.byte - 1 : 0).second;
      ALPACA_FAIL(name << ": malformed JSON at line " << line_no << ", column " << col
                       << " (record " << index << " of the JSON Lines file): "
                       << describe_parse_error(e));
    } catch (const Row::out_of_range& e) {
      ALPACA_FAIL(name << ": malformed JSON at line " << line_no << " (record " << index
                       << " of the JSON Lines file): a number is out of range (" << e.what()
                       << "); fix the file");
    }
    on_row(std::move(v), index++);
  }
  return index;
}

}  // namespace

void for_each_json_row(const std::string& raw, const std::string& name,
                       const std::function<void(Row&&, int64_t)>& on_row) {
  // A UTF-8 byte order mark is not JSON but editors write it; skip it.
  size_t offset = raw.rfind("\xEF\xBB\xBF", 0) == 0 ? 3 : 0;
  std::string text = raw.substr(offset);
  size_t first = text.find_first_not_of(" \t\r\n");
  ALPACA_CHECK(first != std::string::npos,
               name << ": the dataset is empty; expected a JSON array of records or JSON Lines");
  const int64_t n = text[first] == '[' ? array_rows(text, name, on_row)
                                       : json_lines_rows(text, name, on_row);
  ALPACA_CHECK(n > 0, name << ": the dataset has no records");
}

}  // namespace alpaca::data
