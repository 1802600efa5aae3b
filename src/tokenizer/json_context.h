// Private to src/tokenizer: reading a tokenizer.json with the file and the field path in every
// error ("tokenizer.json: pre_tokenizer.pretokenizers[1]: ..."), shared by every component's parser.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "regex.h"

namespace alpaca::tokenizer::detail {

using nlohmann::json;

class JsonContext {
 public:
  explicit JsonContext(std::string file) : file_(std::move(file)) {}
  const std::string& file() const { return file_; }

  // Throws alpaca::Error "<file>: <where>: <what>".
  [[noreturn]] void fail(const std::string& where, const std::string& what) const;
  // fail() for a name this reader does not know: "<kind> "<name>" is not supported (supported:
  // <supported>)", e.g. kind "decoder type".
  [[noreturn]] void unsupported(const std::string& where, const char* kind, const std::string& name,
                                const char* supported) const;
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

// The parse of a pipeline component (normalizer, pre-tokenizer, decoder, post-processor) as the
// crate's tree: a "Sequence" lists its steps in j[list_key] (each parsed the same way, so
// sequences nest), any other type is one step, Node::parse_step(type, j, ctx, where).
template <class Node>
Node parse_component(const json& j, const JsonContext& ctx, const std::string& where, const char* list_key) {
  const std::string t = ctx.type(j, where);
  if (t != "Sequence") return Node::parse_step(t, j, ctx, where);
  Node n{};
  n.kind = Node::kSequence;
  const json& list = ctx.get(j, list_key, where);
  if (!list.is_array()) ctx.fail(where, "\"" + std::string(list_key) + "\" must be a list");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string at = where + "." + list_key + "[" + std::to_string(i) + "]";
    n.children.push_back(parse_component<Node>(list[i], ctx, at, list_key));
  }
  return n;
}

}  // namespace alpaca::tokenizer::detail
