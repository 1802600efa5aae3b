// YAML config files; see yaml_config.h. libyaml does the parsing (Debian's
// libyaml-dev, the C library PyYAML itself binds); the resolver of plain scalars is PyYAML's
// SafeLoader's (yaml/resolver.py), which libyaml leaves to its caller.
#include "yaml_config.h"

#include <yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>  // defines: nlohmann::json

#include "alpaca/cli/usage_error.h"

namespace alpaca::cli {
namespace {

using json = nlohmann::json;

// PyYAML's implicit resolvers (Resolver.add_implicit_resolver in yaml/resolver.py), YAML 1.1.
const std::regex& bool_re() {
  static const std::regex re("yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF");
  return re;
}
const std::regex& null_re() {
  static const std::regex re("~|null|Null|NULL|");
  return re;
}
const std::regex& int_re() {
  static const std::regex re(
      "[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+|[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+");
  return re;
}
const std::regex& float_re() {
  static const std::regex re(
      "[-+]?(?:[0-9][0-9_]*)\\.[0-9_]*(?:[eE][-+][0-9]+)?|\\.[0-9_]+(?:[eE][-+][0-9]+)?"
      "|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\\.[0-9_]*|[-+]?\\.(?:inf|Inf|INF)|\\.(?:nan|NaN|NAN)");
  return re;
}

// SafeConstructor.construct_yaml_int / construct_yaml_float on a resolved scalar: underscores
// dropped, the sign taken off (returned), and base 60 ("1:30" = 90) summed digit group by group
// with `parse` reading each group.
template <class T, class Parse>
T yaml_number(std::string s, Parse parse) {
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  T sign = 1;
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) {
    if (s[0] == '-') sign = -1;
    s = s.substr(1);
  }
  T v = 0;
  size_t at = 0;
  for (size_t colon; (colon = s.find(':', at)) != std::string::npos; at = colon + 1) v = v * 60 + parse(s.substr(at, colon - at));
  return sign * (v * 60 + parse(s.substr(at)));
}

json yaml_int(const std::string& text) {
  const bool base60 = text.find(':') != std::string::npos;  // its groups are decimal ("1:09" = 69)
  return yaml_number<long long>(text, [base60](const std::string& s) -> long long {
    if (base60) return std::stoll(s);
    if (s.rfind("0b", 0) == 0) return std::stoll(s.substr(2), nullptr, 2);
    if (s.rfind("0x", 0) == 0) return std::stoll(s.substr(2), nullptr, 16);
    return std::stoll(s, nullptr, s.size() > 1 && s[0] == '0' ? 8 : 10);  // a leading 0: octal
  });
}

json yaml_float(const std::string& text) {
  return yaml_number<double>(text, [](const std::string& s) {
    std::string lower = s;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lower == ".inf") return static_cast<double>(INFINITY);
    if (lower == ".nan") return static_cast<double>(NAN);
    return std::stod(s);
  });
}

json plain_scalar(const std::string& s) {
  if (std::regex_match(s, null_re())) return nullptr;
  if (std::regex_match(s, bool_re())) {
    const char c = s[0];
    return c == 'y' || c == 'Y' || c == 't' || c == 'T' || s == "on" || s == "On" || s == "ON";
  }
  try {
    if (std::regex_match(s, int_re())) return yaml_int(s);
    if (std::regex_match(s, float_re())) return yaml_float(s);
  } catch (const std::exception&) {  // out of range: keep the text
    return s;
  }
  // C's number syntax that YAML 1.1 does not resolve ("2e-5", "1E3"): a number all the same.
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (!s.empty() && end == s.c_str() + s.size() && std::isfinite(v) && s.find_first_of("eE") != std::string::npos &&
      s.find_first_not_of("0123456789+-.eE") == std::string::npos)
    return v;
  return s;
}

struct Document {
  yaml_document_t doc;
  explicit Document(yaml_parser_t& parser, const std::string& path) {
    if (!yaml_parser_load(&parser, &doc))
      ALPACA_USAGE_FAIL("--config " << path << " is not valid YAML: " << (parser.problem ? parser.problem : "parse error")
                                    << " at line " << parser.problem_mark.line + 1 << ", column "
                                    << parser.problem_mark.column + 1);
  }
  ~Document() { yaml_document_delete(&doc); }
  Document(const Document&) = delete;
  Document& operator=(const Document&) = delete;
};

json to_json(yaml_document_t& doc, yaml_node_t* node, const std::string& path, int depth) {
  ALPACA_USAGE_CHECK(depth < 64, "--config " << path << ": the YAML nests deeper than 64 levels (a recursive alias?)");
  switch (node->type) {
    case YAML_SCALAR_NODE: {
      const std::string s(reinterpret_cast<const char*>(node->data.scalar.value), node->data.scalar.length);
      return node->data.scalar.style == YAML_PLAIN_SCALAR_STYLE ? plain_scalar(s) : json(s);
    }
    case YAML_SEQUENCE_NODE: {
      json out = json::array();
      for (yaml_node_item_t* it = node->data.sequence.items.start; it < node->data.sequence.items.top; ++it)
        out.push_back(to_json(doc, yaml_document_get_node(&doc, *it), path, depth + 1));
      return out;
    }
    case YAML_MAPPING_NODE: {
      json out = json::object();
      for (yaml_node_pair_t* p = node->data.mapping.pairs.start; p < node->data.mapping.pairs.top; ++p) {
        const json key = to_json(doc, yaml_document_get_node(&doc, p->key), path, depth + 1);
        ALPACA_USAGE_CHECK(key.is_string(), "--config " << path << ": key " << key.dump() << " is not a name");
        const std::string k = key.get<std::string>();
        ALPACA_USAGE_CHECK(!out.contains(k), "--config " << path << ": key '" << k << "' is given twice");
        out[k] = to_json(doc, yaml_document_get_node(&doc, p->value), path, depth + 1);
      }
      return out;
    }
    default:
      return nullptr;
  }
}

}  // namespace

json parse_yaml_config(const std::string& text, const std::string& path) {
  yaml_parser_t parser;
  ALPACA_USAGE_CHECK(yaml_parser_initialize(&parser), "--config " << path << ": cannot start the YAML parser");
  std::unique_ptr<yaml_parser_t, void (*)(yaml_parser_t*)> guard(&parser, yaml_parser_delete);
  yaml_parser_set_input_string(&parser, reinterpret_cast<const unsigned char*>(text.data()), text.size());
  json out;
  {
    Document first(parser, path);
    yaml_node_t* root = yaml_document_get_root_node(&first.doc);
    out = root ? to_json(first.doc, root, path, 0) : json();
  }
  Document next(parser, path);  // PyYAML's safe_load: "expected a single document in the stream"
  ALPACA_USAGE_CHECK(!yaml_document_get_root_node(&next.doc),
                     "--config " << path << " holds several YAML documents; give one");
  return out;
}

}  // namespace alpaca::cli
