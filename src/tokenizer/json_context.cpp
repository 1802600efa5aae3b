// JsonContext's field readers (json_context.h).
#include "json_context.h"

#include "alpaca/util/error.h"

namespace alpaca::tokenizer::detail {

void JsonContext::fail(const std::string& where, const std::string& what) const {
  ALPACA_FAIL(file_ << ": " << where << ": " << what);
}

void JsonContext::unsupported(const std::string& where, const char* kind, const std::string& name,
                              const char* supported) const {
  fail(where, std::string(kind) + " \"" + name + "\" is not supported (supported: " + supported + ")");
}

const json& JsonContext::get(const json& obj, const char* key, const std::string& where) const {
  if (!obj.is_object() || !obj.contains(key))
    fail(where, std::string("required field \"") + key + "\" is missing");
  return obj.at(key);
}

std::string JsonContext::str(const json& obj, const char* key, const std::string& where) const {
  const json& v = get(obj, key, where);
  if (!v.is_string()) fail(where, std::string("field \"") + key + "\" must be a string");
  return v.get<std::string>();
}

std::optional<std::string> JsonContext::opt_str(const json& obj, const char* key, const std::string& where) const {
  if (!obj.contains(key) || obj.at(key).is_null()) return std::nullopt;
  return str(obj, key, where);
}

bool JsonContext::boolean(const json& obj, const char* key, bool fallback, const std::string& where) const {
  if (!obj.contains(key) || obj.at(key).is_null()) return fallback;
  const json& v = obj.at(key);
  if (!v.is_boolean()) fail(where, std::string("field \"") + key + "\" must be true or false");
  return v.get<bool>();
}

int64_t JsonContext::integer(const json& obj, const char* key, int64_t fallback, const std::string& where) const {
  if (!obj.contains(key) || obj.at(key).is_null()) return fallback;
  const json& v = obj.at(key);
  if (!v.is_number_integer()) fail(where, std::string("field \"") + key + "\" must be an integer");
  return v.get<int64_t>();
}

std::string JsonContext::type(const json& obj, const std::string& where) const {
  if (!obj.is_object()) fail(where, "must be a JSON object or null");
  return str(obj, "type", where);
}

Pattern JsonContext::pattern(const json& obj, const char* key, const std::string& where) const {
  const json& p = get(obj, key, where);
  Pattern out;
  if (p.is_object() && p.contains("String") && p.at("String").is_string()) {
    out.literal = p.at("String").get<std::string>();
  } else if (p.is_object() && p.contains("Regex") && p.at("Regex").is_string()) {
    out.regex = std::make_shared<Regex>(p.at("Regex").get<std::string>(), file_ + ": " + where);
  } else {
    fail(where, std::string("field \"") + key +
                    "\" must be {\"String\": ...} or {\"Regex\": ...}, got " + p.dump());
  }
  return out;
}

}  // namespace alpaca::tokenizer::detail
