// JSON in and out of Values: JSON text -> Value (objects keep their key order, as Python's json
// does) and Value -> text exactly as Python's json.dumps(ensure_ascii=False) writes it, which is
// what transformers' `tojson` filter calls.
#include <nlohmann/json.hpp>

#include "alpaca/util/error.h"
#include "value.h"
#include "value_json.h"

namespace alpaca::chat {

namespace {

void json_string(std::string& out, std::string_view s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

struct JsonWriter {
  int indent;
  std::string_view item_sep, key_sep;
  bool sort_keys;
  std::string out;
  int depth = 0;

  void newline(int level) {
    out += '\n';
    out.append(static_cast<size_t>(indent * level), ' ');
  }
  void write(const Value& v) {
    ALPACA_CHECK(depth < 512, "chat template: tojson nests deeper than 512 levels");
    switch (v.kind()) {
      case Value::Kind::kNone: out += "null"; return;
      case Value::Kind::kBool: out += v.as_bool() ? "true" : "false"; return;
      case Value::Kind::kInt: out += std::to_string(v.as_int()); return;
      case Value::Kind::kFloat: {
        double f = v.as_double();
        out += std::isnan(f) ? "NaN" : std::isinf(f) ? (f < 0 ? "-Infinity" : "Infinity") : float_repr(f);
        return;
      }
      case Value::Kind::kString: json_string(out, v.str()); return;
      case Value::Kind::kList: write_list(v.items()); return;
      case Value::Kind::kDict:
        if (!v.is_namespace()) {
          write_dict(v.entries());
          return;
        }
        [[fallthrough]];
      default:
        ALPACA_FAIL("chat template: tojson: Object of type " << v.type_name() << " is not JSON serializable");
    }
  }
  void write_list(const List& items) {
    if (items.empty()) {
      out += "[]";
      return;
    }
    out += '[';
    ++depth;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += item_sep;
      if (indent >= 0) newline(depth);
      write(items[i]);
    }
    --depth;
    if (indent >= 0) newline(depth);
    out += ']';
  }
  void write_dict(const Dict& d) {
    if (d.entries.empty()) {
      out += "{}";
      return;
    }
    std::vector<const std::pair<std::string, Value>*> order;
    for (const auto& e : d.entries) order.push_back(&e);
    if (sort_keys)
      std::stable_sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->first < b->first; });
    out += '{';
    ++depth;
    for (size_t i = 0; i < order.size(); ++i) {
      if (i) out += item_sep;
      if (indent >= 0) newline(depth);
      json_string(out, order[i]->first);
      out += key_sep;
      write(order[i]->second);
    }
    --depth;
    if (indent >= 0) newline(depth);
    out += '}';
  }
};

Value from_json(const nlohmann::ordered_json& j, int depth) {
  ALPACA_CHECK(depth < 512, "chat template context: JSON nests deeper than 512 levels");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value::integer(static_cast<int64_t>(u));
      return Value::number(static_cast<double>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::number(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& x : j) items.push_back(from_json(x, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      d.entries.reserve(j.size());
      for (const auto& [k, x] : j.items()) d.set(k, from_json(x, depth + 1));
      return Value::dict(std::move(d));
    }
    default: ALPACA_FAIL("chat template context: binary JSON values are not supported");
  }
}

}  // namespace

std::string to_json(const Value& v, int indent, std::string_view item_sep, std::string_view key_sep,
                    bool sort_keys) {
  JsonWriter w{indent, item_sep, key_sep, sort_keys, {}};
  w.write(v);
  return std::move(w.out);
}

Value parse_json_value(std::string_view text) {
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    ALPACA_FAIL("chat template context is not valid JSON: " << e.what());
  }
  return from_json(j, 0);
}

}  // namespace alpaca::chat
