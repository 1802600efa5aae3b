#include "alpaca/generate/prompt_records.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>  // defines: nlohmann::ordered_json

#include "alpaca/data/alpaca_example.h"
#include "alpaca/data/conversation.h"
#include "alpaca/util/error.h"
#include "alpaca/util/user_error.h"

namespace alpaca::generate {
namespace {

// Objects keep the file's key order, as Python dicts do: a template that writes messages or tools
// as JSON text (tool schemas, tool-call arguments) gives transformers' text, and output lines
// repeat each record's fields in its order.
using ordered_json = nlohmann::ordered_json;  // not "json": a unity batch shares this namespace with files using nlohmann::json

// An OpenAI-style conversation: a non-empty list of objects, each with a string "role" (the
// template decides what it accepts beyond that, as transformers leaves it to the template).
std::string checked_messages(const ordered_json& m, const std::string& name, int64_t index) {
  ALPACA_CHECK(m.is_array() && !m.empty(), name << ": \"messages\" of record " << index << " is a " << m.type_name()
                                                << (m.is_array() ? " that is empty" : "")
                                                << ", expected a list of {\"role\": ..., \"content\": ...} objects");
  for (size_t i = 0; i < m.size(); ++i) {
    ALPACA_CHECK(m[i].is_object() && m[i].contains("role") && m[i]["role"].is_string(),
                 name << ": message " << i << " of record " << index
                      << " is not an object with a string \"role\" (OpenAI messages: {\"role\": ..., \"content\": ...})");
  }
  return m.dump();
}

PromptRecord to_prompt(const ordered_json& v, const std::string& name, int64_t index, const PromptOptions& opts) {
  ALPACA_CHECK(v.is_object(), name << ": record " << index << " is a " << v.type_name()
                                   << ", expected an object with \"instruction\" (and optionally \"input\")"
                                   << " or with \"messages\"");
  auto str = [&](const char* key, bool required) -> std::optional<std::string> {
    auto it = v.find(key);
    if (it == v.end()) {
      ALPACA_CHECK(!required, name << ": record " << index << " has no \"" << key << "\" field"
                                   << (std::string(key) == "instruction" ? "; every record needs an instruction (or a \"messages\" list)" : ""));
      return std::nullopt;
    }
    ALPACA_CHECK(it->is_string(), name << ": field \"" << key << "\" of record " << index << " is a "
                                       << it->type_name() << ", expected a string");
    return it->get<std::string>();
  };
  PromptRecord r;
  if (v.contains("messages")) {
    r.messages = checked_messages(v["messages"], name, index);
  } else {
    const std::string instruction = *str("instruction", true);
    const std::string input = str("input", false).value_or("");
    if (opts.chat) {
      r.messages = ordered_json::array({{{"role", "user"}, {"content", chat_user_content(instruction, input)}}}).dump();
    } else {
      r.prompt = opts.raw_prompt ? instruction : alpaca_prompt(instruction, input);
    }
  }
  if (r.messages) r.template_variables = data::row_template_variables_json(v.dump(), name + ": record " + std::to_string(index));
  if (!opts.expected_field.empty()) {
    auto it = v.find(opts.expected_field);
    ALPACA_CHECK(it != v.end(), name << ": record " << index << " has no \"" << opts.expected_field
                                     << "\" field, which --expected_field asks for");
    r.expected = str(opts.expected_field.c_str(), true);
  }
  r.json = v.dump();
  return r;
}

}  // namespace

std::string alpaca_prompt(const std::string& instruction, const std::string& input) {
  data::AlpacaRecord rec;
  rec.instruction = instruction;
  rec.input = input;
  return data::format_alpaca_prompt(rec);
}

std::string chat_user_content(const std::string& instruction, const std::string& input) {
  return input.empty() ? instruction : instruction + "\n\n" + input;
}

std::vector<PromptRecord> parse_prompt_records(const std::string& raw, const std::string& name,
                                               const PromptOptions& opts) {
  const size_t offset = raw.rfind("\xEF\xBB\xBF", 0) == 0 ? 3 : 0;  // UTF-8 byte order mark
  const std::string text = raw.substr(offset);
  const size_t first = text.find_first_not_of(" \t\r\n");
  ALPACA_CHECK(first != std::string::npos,
               name << ": the prompts file is empty; give a JSON array of {\"instruction\": ...} records or JSON Lines");
  std::vector<PromptRecord> out;
  if (text[first] == '[') {
    ordered_json doc;
    try {
      doc = ordered_json::parse(text);
    } catch (const ordered_json::parse_error& e) {
      ALPACA_FAIL(name << ": malformed JSON: " << e.what());
    }
    ALPACA_CHECK(doc.is_array(), name << ": expected a JSON array of records");
    for (size_t i = 0; i < doc.size(); ++i) out.push_back(to_prompt(doc[i], name, static_cast<int64_t>(i), opts));
  } else {
    std::istringstream lines(text);
    std::string line;
    int64_t lineno = 0;
    while (std::getline(lines, line)) {
      ++lineno;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      ordered_json v;
      try {
        v = ordered_json::parse(line);
      } catch (const ordered_json::parse_error& e) {
        ALPACA_FAIL(name << ": line " << lineno << " is not valid JSON: " << e.what());
      }
      out.push_back(to_prompt(v, name + " line " + std::to_string(lineno), static_cast<int64_t>(out.size()), opts));
    }
  }
  ALPACA_CHECK(!out.empty(), name << ": no records; give at least one {\"instruction\": ...} record");
  return out;
}

std::vector<PromptRecord> load_prompt_records(const std::string& path, const PromptOptions& opts) {
  std::ifstream f(path, std::ios::binary);
  ALPACA_USER_CHECK(f, "cannot read the prompts file " << path << "; check the --prompts path");
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return parse_prompt_records(ss.str(), path, opts);
  } catch (const UserError&) {
    throw;
  } catch (const Error& e) {  // the user's file: its message (file and record), no source location
    ALPACA_USER_FAIL(e.message());
  }
}

std::string output_line(const PromptRecord& rec, const std::string& generation, const std::vector<int64_t>& ids,
                        std::optional<bool> match) {
  ordered_json v = ordered_json::parse(rec.json);
  v["generation"] = generation;
  v["generation_ids"] = ids;
  if (match) v["exact_match"] = *match;
  // Invalid UTF-8 from a byte-level tokenizer cut mid-character becomes U+FFFD rather than an error.
  return v.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

bool exact_match(const std::string& generation, const std::string& expected) {
  auto trim = [](const std::string& s) {
    const char* ws = " \t\r\n\v\f";
    const size_t b = s.find_first_not_of(ws);
    if (b == std::string::npos) return std::string();
    return s.substr(b, s.find_last_not_of(ws) - b + 1);
  };
  return trim(generation) == trim(expected);
}

}  // namespace alpaca::generate
