// Private to src/tokenizer: reading a tokenizer.json with the file and the field path in every
// error ("tokenizer.json: pre_tokenizer.pretokenizers[1]: ..."), shared by every component's parser.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "regex.h"

namespace alpaca::tokenizer::detail {

using nlohmann::json;

class JsonContext {
 public:
  explicit JsonContext(std::string file) : file_(std::move(file)) {}
  const std::string& file() const { return file_; }

  // Throws alpaca::Error "<file>: <where>: <what>".
  [[noreturn]] void fail(const std::string& where, const std::string& what) const;
  // obj[key]; a missing key is an error.
  const json& get(const json& obj, const char* key, const std::string& where) const;
  // obj[key] as a string / bool / integer: a missing or null optional field gives `fallback`
  // (nullopt), a field of another JSON type is an error.
  std::string str(const json& obj, const char* key, const std::string& where) const;
  std::optional<std::string> opt_str(const json& obj, const char* key, const std::string& where) const;
  bool boolean(const json& obj, const char* key, bool fallback, const std::string& where) const;
  int64_t integer(const json& obj, const char* key, int64_t fallback, const std::string& where) const;
  // A component object's "type".
  std::string type(const json& obj, const std::string& where) const;
  // A SplitPattern: {"String": ...} or {"Regex": ...} (compiled here).
  Pattern pattern(const json& obj, const char* key, const std::string& where) const;

 private:
  std::string file_;
};

}  // namespace alpaca::tokenizer::detail
