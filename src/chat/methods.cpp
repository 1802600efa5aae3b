// Methods templates call on values (Python's str and dict methods the sandbox allows), and the
// globals transformers adds: raise_exception, strftime_now, namespace, dict, range.
#include <ctime>

#include "alpaca/chat/chat_template.h"
#include "evaluator.h"
#include "strings.h"

namespace alpaca::chat {

namespace {

std::optional<std::string> opt_str(const Value& v) {
  if (v.is_undefined() || v.is_none()) return std::nullopt;
  return v.str();
}

List strings(std::vector<std::string> parts) {
  List out;
  out.reserve(parts.size());
  for (auto& p : parts) out.push_back(Value::string(std::move(p)));
  return out;
}

// startswith/endswith take a string or a tuple of strings.
bool affix(Evaluator& ev, const std::string& s, const Value& arg, bool prefix, int line) {
  auto one = [&](const Value& x) {
    if (!x.is_string()) ev.fail(line, std::string(prefix ? "startswith" : "endswith") + " first arg must be str or a tuple of str");
    const std::string& a = x.str();
    return a.size() <= s.size() && (prefix ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0);
  };
  if (arg.is_list()) {
    for (const Value& x : arg.items())
      if (one(x)) return true;
    return false;
  }
  return one(arg);
}

long maxsplit_arg(const CallArgs& a) {
  Value m = a.get(1, "maxsplit");
  return m.is_int() ? static_cast<long>(m.as_int()) : -1;
}

Value string_method(Evaluator& ev, const Value& obj, const std::string& name, const CallArgs& a, int line) {
  const std::string& s = obj.str();
  if (name == "strip" || name == "lstrip" || name == "rstrip")
    return Value::string(py_strip(s, opt_str(a.get(0, "chars")), name != "rstrip", name != "lstrip"));
  if (name == "split" || name == "rsplit") {
    std::optional<std::string> sep = opt_str(a.get(0, "sep"));
    if (sep && sep->empty()) ev.fail(line, "empty separator");
    return Value::list(strings(name == "split" ? py_split(s, sep, maxsplit_arg(a)) : py_rsplit(s, sep, maxsplit_arg(a))));
  }
  if (name == "splitlines") return Value::list(strings(py_splitlines(s, a.get(0, "keepends").truthy())));
  if (name == "startswith" || name == "endswith") return Value::boolean(affix(ev, s, a.get(0, "prefix"), name == "startswith", line));
  if (name == "upper") return Value::string(py_upper(s));
  if (name == "lower") return Value::string(py_lower(s));
  if (name == "title") return Value::string(py_title(s));
  if (name == "capitalize") return Value::string(py_capitalize(s));
  if (name == "replace") {
    Value count = a.get(2, "count");
    return Value::string(py_replace(s, to_str(a.get(0, "old")), to_str(a.get(1, "new")), count.is_int() ? static_cast<long>(count.as_int()) : -1));
  }
  if (name == "find" || name == "rfind" || name == "count") {
    std::string sub = to_str(a.get(0, "sub"));
    if (name == "count") return Value::integer(static_cast<int64_t>(py_count(s, sub)));
    size_t q = name == "find" ? s.find(sub) : s.rfind(sub);
    return Value::integer(q == std::string::npos ? -1 : static_cast<int64_t>(utf8_length(std::string_view(s).substr(0, q))));
  }
  if (name == "join") {
    std::string out;
    bool first = true;
    for (const Value& x : ev.iterate(a.get(0, "iterable"), line)) {
      if (!x.is_string()) ev.fail(line, "sequence item: expected str instance, " + x.type_name() + " found");
      out += (first ? "" : s) + x.str();
      first = false;
    }
    return Value::string(std::move(out));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    std::string x = to_str(a.get(0, "prefix"));
    bool hit = affix(ev, s, Value::string(x), name == "removeprefix", line);
    if (!hit) return obj;
    return Value::string(name == "removeprefix" ? s.substr(x.size()) : s.substr(0, s.size() - x.size()));
  }
  if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isalnum" || name == "isupper" || name == "islower") {
    if (s.empty()) return Value::boolean(false);
    if (name == "isupper") return Value::boolean(py_upper(s) == s && py_lower(s) != s);
    if (name == "islower") return Value::boolean(py_lower(s) == s && py_upper(s) != s);
    for (unsigned char c : s) {
      bool ok = name == "isdigit" ? std::isdigit(c) : name == "isspace" ? std::isspace(c) : name == "isalpha" ? std::isalpha(c) : std::isalnum(c);
      if (!ok) return Value::boolean(false);
    }
    return Value::boolean(true);
  }
  ev.fail(line, "the str method '" + name + "' is not supported by alpaca-train's chat template engine");
}

Value dict_method(Evaluator& ev, const Value& obj, const std::string& name, const CallArgs& a, int line) {
  const Dict& d = obj.entries();
  if (name == "get") {
    Value key = a.get(0, "key");
    const Value* v = key.is_string() ? d.find(key.str()) : nullptr;
    if (v) return *v;
    return a.positional.size() > 1 ? a.positional[1] : Value::none();
  }
  List out;
  if (name == "items") {
    for (const auto& [k, v] : d.entries) out.push_back(Value::tuple({Value::string(k), v}));
  } else if (name == "keys") {
    for (const auto& [k, v] : d.entries) out.push_back(Value::string(k));
  } else if (name == "values") {
    for (const auto& [k, v] : d.entries) out.push_back(v);
  } else if (name == "copy") {
    return Value::dict(d);
  } else {
    ev.fail(line, "the dict method '" + name + "' is not supported (the sandbox makes dicts immutable)");
  }
  return Value::list(std::move(out));
}

}  // namespace

Value call_method(Evaluator& ev, const Value& obj, const std::string& name, const CallArgs& args, int line) {
  if (obj.is_string()) return string_method(ev, obj, name, args, line);
  if (obj.is_dict() && !obj.is_namespace()) return dict_method(ev, obj, name, args, line);
  if (obj.is_list() && (name == "index" || name == "count")) {
    Value x = args.get(0, "value");
    int64_t n = 0;
    for (size_t i = 0; i < obj.items().size(); ++i) {
      if (!equals(obj.items()[i], x)) continue;
      if (name == "index") return Value::integer(static_cast<int64_t>(i));
      ++n;
    }
    if (name == "index") ev.fail(line, repr(x) + " is not in list");
    return Value::integer(n);
  }
  ev.fail(line, "'" + obj.type_name() + " object' has no method '" + name +
                    "' here (lists and dicts are immutable in transformers' sandbox)");
}

namespace {

std::shared_ptr<Function> make_fn(std::string name, std::function<Value(Evaluator&, const CallArgs&)> f) {
  auto fn = std::make_shared<Function>();
  fn->name = std::move(name);
  fn->call = std::move(f);
  return fn;
}

Value range_fn(Evaluator& ev, const CallArgs& a) {
  for (const Value& x : a.positional)
    if (!x.is_int() && !x.is_bool()) ev.fail(0, "range() takes integers, not " + x.type_name());
  int64_t start = 0, stop = 0, step = 1;
  if (a.positional.size() == 1) stop = a.positional[0].as_int();
  else if (a.positional.size() >= 2) start = a.positional[0].as_int(), stop = a.positional[1].as_int();
  if (a.positional.size() >= 3) step = a.positional[2].as_int();
  if (step == 0) ev.fail(0, "range() arg 3 must not be zero");
  List out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    ev.count_iterations(1, 0);  // range(10**9) is as much a runaway as a loop
    out.push_back(Value::integer(i));
    if ((step > 0 && i > INT64_MAX - step) || (step < 0 && i < INT64_MIN - step)) break;
  }
  return Value::list(std::move(out));
}

Value strftime_fn(Evaluator& ev, const CallArgs& a) {
  std::string fmt = to_str(a.get(0, "format"));
  std::time_t now = ev.options().now_unix ? static_cast<std::time_t>(*ev.options().now_unix) : std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  if (fmt.empty()) return Value::string("");
  std::string buf(256 + fmt.size() * 8, '\0');
  size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
  buf.resize(n);
  return Value::string(std::move(buf));
}

Value namespace_fn(Evaluator& ev, const CallArgs& a, bool is_namespace) {
  Dict d;
  for (const Value& p : a.positional) {
    if (!p.is_dict()) ev.fail(0, "namespace()/dict() take a mapping or keyword arguments");
    for (const auto& [k, v] : p.entries().entries) d.set(k, v);
  }
  for (const auto& [k, v] : a.keywords) d.set(k, v);
  if (is_namespace)
    for (const auto& [k, v] : d.entries)
      if (!k.empty() && k[0] == '_') ev.fail(0, "chat templates cannot store underscore-prefixed attributes on a namespace");
  return is_namespace ? Value::namespace_(std::move(d)) : Value::dict(std::move(d));
}

}  // namespace

std::unordered_map<std::string, Value> builtin_globals() {
  std::unordered_map<std::string, Value> g;
  g["raise_exception"] = Value::function(make_fn("raise_exception", [](Evaluator&, const CallArgs& a) -> Value {
    throw TemplateRaised(__FILE__, __LINE__, to_str(a.get(0, "message")));
  }));
  g["strftime_now"] = Value::function(make_fn("strftime_now", strftime_fn));
  g["range"] = Value::function(make_fn("range", range_fn));
  g["namespace"] = Value::function(make_fn("namespace", [](Evaluator& ev, const CallArgs& a) { return namespace_fn(ev, a, true); }));
  g["dict"] = Value::function(make_fn("dict", [](Evaluator& ev, const CallArgs& a) { return namespace_fn(ev, a, false); }));
  return g;
}

}  // namespace alpaca::chat
