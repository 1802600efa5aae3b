// jinja2's builtin filters that chat templates use, with transformers' `tojson`
// (json.dumps(ensure_ascii=False, indent=, separators=, sort_keys=)). An unknown filter is an
// error naming it.
#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "evaluator.h"
#include "strings.h"

namespace alpaca::chat {

namespace {

using FilterFn = Value (*)(Evaluator&, const Value&, const CallArgs&, int);

std::string text_of(const Value& v) { return to_str(v); }  // jinja2's soft_str

Value keep_safe(const Value& in, std::string s) { return Value::string(std::move(s), in.is_safe()); }

std::optional<std::string> opt_string(const Value& v) {
  if (v.is_undefined() || v.is_none()) return std::nullopt;
  return to_str(v);
}

Value f_trim(Evaluator&, const Value& v, const CallArgs& a, int) {
  return keep_safe(v, py_strip(text_of(v), opt_string(a.get(0, "chars")), true, true));
}
Value f_upper(Evaluator&, const Value& v, const CallArgs&, int) { return keep_safe(v, py_upper(text_of(v))); }
Value f_lower(Evaluator&, const Value& v, const CallArgs&, int) { return keep_safe(v, py_lower(text_of(v))); }
Value f_capitalize(Evaluator&, const Value& v, const CallArgs&, int) {
  return keep_safe(v, py_capitalize(text_of(v)));
}
Value f_title(Evaluator&, const Value& v, const CallArgs&, int) { return keep_safe(v, jinja_title(text_of(v))); }
Value f_string(Evaluator&, const Value& v, const CallArgs&, int) {
  return v.is_string() ? v : Value::string(text_of(v));
}
Value f_safe(Evaluator&, const Value& v, const CallArgs&, int) { return Value::string(text_of(v), true); }
Value f_escape(Evaluator&, const Value& v, const CallArgs&, int) {
  return v.is_safe() ? v : Value::string(html_escape(text_of(v)), true);
}

Value f_length(Evaluator& ev, const Value& v, const CallArgs&, int line) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return Value::integer(0);
    case Value::Kind::kString: return Value::integer(static_cast<int64_t>(utf8_length(v.str())));
    case Value::Kind::kList: return Value::integer(static_cast<int64_t>(v.items().size()));
    case Value::Kind::kDict:
      if (!v.is_namespace()) return Value::integer(static_cast<int64_t>(v.entries().entries.size()));
      [[fallthrough]];
    default: ev.fail(line, "object of type '" + v.type_name() + "' has no len()");
  }
}

Value f_replace(Evaluator&, const Value& v, const CallArgs& a, int) {
  Value count = a.get(2, "count");
  long n = count.is_int() ? static_cast<long>(count.as_int()) : -1;
  return keep_safe(v, py_replace(text_of(v), text_of(a.get(0, "old")), text_of(a.get(1, "new")), n));
}

Value f_default(Evaluator&, const Value& v, const CallArgs& a, int) {
  Value dflt = a.get(0, "default_value");
  if (dflt.is_undefined() && a.positional.empty() && !a.keyword("default_value")) dflt = Value::string("");
  bool boolean = a.get(1, "boolean").truthy();
  if (v.is_undefined() || (boolean && !v.truthy())) return dflt;
  return v;
}

// The value at a dotted attribute path ("a.b", "0"), as jinja2's make_attrgetter reads it.
Value attribute_path(Evaluator& ev, const Value& item, const std::string& path, int line) {
  Value cur = item;
  size_t start = 0;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = ev.get_item(cur, digits ? Value::integer(std::stoll(part)) : Value::string(part), line);
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur;
}

// Without autoescape jinja2 joins with str(): no Markup handling.
Value f_join(Evaluator& ev, const Value& v, const CallArgs& a, int line) {
  std::string sep = text_of(a.get(0, "d"));
  Value attr = a.get(1, "attribute");
  std::string out;
  bool first = true;
  for (const Value& item : ev.iterate(v, line)) {
    if (!first) out += sep;
    first = false;
    out += text_of(attr.is_undefined() || attr.is_none() ? item : attribute_path(ev, item, text_of(attr), line));
  }
  return Value::string(std::move(out));
}

Value f_list(Evaluator& ev, const Value& v, const CallArgs&, int line) { return Value::list(ev.iterate(v, line)); }

Value f_first(Evaluator& ev, const Value& v, const CallArgs&, int line) {
  std::vector<Value> items = ev.iterate(v, line);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value f_last(Evaluator& ev, const Value& v, const CallArgs&, int line) {
  std::vector<Value> items = ev.iterate(v, line);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

Value f_reverse(Evaluator& ev, const Value& v, const CallArgs&, int line) {
  std::vector<Value> items = ev.iterate(v, line);
  std::reverse(items.begin(), items.end());
  if (!v.is_string()) return Value::list(std::move(items));
  std::string out;
  for (const auto& c : items) out += c.str();
  return Value::string(std::move(out));
}

Value f_items(Evaluator& ev, const Value& v, const CallArgs&, int line) {
  if (v.is_undefined()) return Value::list({});
  if (!v.is_dict() || v.is_namespace()) ev.fail(line, "can only get item pairs from a mapping, not " + v.type_name());
  List out;
  for (const auto& [k, x] : v.entries().entries) out.push_back(Value::tuple({Value::string(k), x}));
  return Value::list(std::move(out));
}

Value f_dictsort(Evaluator& ev, const Value& v, const CallArgs& a, int line) {
  if (!v.is_dict() || v.is_namespace()) ev.fail(line, "dictsort expects a mapping, not " + v.type_name());
  bool case_sensitive = a.get(0, "case_sensitive").truthy();
  Value by = a.get(1, "by");
  bool by_value = by.is_string() && by.str() == "value";
  bool reverse = a.get(2, "reverse").truthy();
  std::vector<std::pair<std::string, Value>> items = v.entries().entries;
  auto key = [&](const std::pair<std::string, Value>& p) {
    Value k = by_value ? p.second : Value::string(p.first);
    return k.is_string() && !case_sensitive ? Value::string(py_lower(k.str())) : k;
  };
  std::stable_sort(items.begin(), items.end(), [&](const auto& x, const auto& y) {
    return reverse ? less_than(key(y), key(x)) : less_than(key(x), key(y));
  });
  List out;
  for (auto& [k, x] : items) out.push_back(Value::tuple({Value::string(k), x}));
  return Value::list(std::move(out));
}

// select/reject/selectattr/rejectattr: `attr` empty for select/reject.
Value select_items(Evaluator& ev, const Value& v, const CallArgs& a, int line, bool by_attr, bool keep) {
  size_t first = by_attr ? 1 : 0;
  std::string attr = by_attr ? text_of(a.get(0, "attribute")) : "";
  CallArgs test_args;
  for (size_t i = first + 1; i < a.positional.size(); ++i) test_args.positional.push_back(a.positional[i]);
  List out;
  for (const Value& item : ev.iterate(v, line)) {
    Value x = by_attr ? attribute_path(ev, item, attr, line) : item;
    bool r = a.positional.size() > first ? ev.apply_test(text_of(a.positional[first]), x, test_args, line) : x.truthy();
    if (r == keep) out.push_back(item);
  }
  return Value::list(std::move(out));
}
Value f_select(Evaluator& ev, const Value& v, const CallArgs& a, int l) { return select_items(ev, v, a, l, false, true); }
Value f_reject(Evaluator& ev, const Value& v, const CallArgs& a, int l) { return select_items(ev, v, a, l, false, false); }
Value f_selectattr(Evaluator& ev, const Value& v, const CallArgs& a, int l) { return select_items(ev, v, a, l, true, true); }
Value f_rejectattr(Evaluator& ev, const Value& v, const CallArgs& a, int l) { return select_items(ev, v, a, l, true, false); }

Value f_map(Evaluator& ev, const Value& v, const CallArgs& a, int line) {
  List out;
  if (const Value* attr = a.keyword("attribute")) {
    const Value* dflt = a.keyword("default");
    for (const Value& item : ev.iterate(v, line)) {
      Value x = attribute_path(ev, item, text_of(*attr), line);
      out.push_back(x.is_undefined() && dflt ? *dflt : x);
    }
    return Value::list(std::move(out));
  }
  if (a.positional.empty()) ev.fail(line, "map() needs a filter name or attribute=");
  std::string filter = text_of(a.positional[0]);
  CallArgs rest;
  rest.positional.assign(a.positional.begin() + 1, a.positional.end());
  rest.keywords = a.keywords;
  for (const Value& item : ev.iterate(v, line)) out.push_back(ev.apply_filter(filter, item, rest, line));
  return Value::list(std::move(out));
}

Value f_unique(Evaluator& ev, const Value& v, const CallArgs& a, int line) {
  bool case_sensitive = a.get(0, "case_sensitive").truthy();
  Value attr = a.get(1, "attribute");
  List out, seen;
  for (const Value& item : ev.iterate(v, line)) {
    Value key = attr.is_undefined() || attr.is_none() ? item : attribute_path(ev, item, text_of(attr), line);
    if (key.is_string() && !case_sensitive) key = Value::string(py_lower(key.str()));
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) continue;
    seen.push_back(key);
    out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value f_tojson(Evaluator& ev, const Value& v, const CallArgs& a, int line) {
  bool ensure_ascii = a.get(0, "ensure_ascii").truthy();
  Value indent = a.get(1, "indent");
  Value seps = a.get(2, "separators");
  bool sort_keys = a.get(3, "sort_keys").truthy();
  if (ensure_ascii) ev.fail(line, "tojson(ensure_ascii=True) is not supported");
  int ind = -1;
  if (indent.is_int()) ind = static_cast<int>(std::clamp<int64_t>(indent.as_int(), 0, 64));
  else if (!indent.is_undefined() && !indent.is_none()) ev.fail(line, "tojson: indent must be an integer");
  std::string item_sep = ind >= 0 ? "," : ", ", key_sep = ": ";
  if (seps.is_list()) {
    if (seps.items().size() != 2) ev.fail(line, "tojson: separators must be a pair of strings");
    item_sep = text_of(seps.items()[0]);
    key_sep = text_of(seps.items()[1]);
  }
  try {
    return Value::string(to_json(v, ind, item_sep, key_sep, sort_keys));
  } catch (const alpaca::Error& e) {
    ev.fail(line, e.message());
  }
}

Value f_indent(Evaluator& ev, const Value& v, const CallArgs& a, int line) {
  if (!v.is_string()) ev.fail(line, "indent: '" + v.type_name() + "' object has no attribute 'splitlines'");
  Value width = a.get(0, "width");
  std::string ind = width.is_string() ? width.str() : std::string(width.is_int() ? static_cast<size_t>(std::clamp<int64_t>(width.as_int(), 0, 256)) : 4, ' ');
  bool first = a.get(1, "first").truthy(), blank = a.get(2, "blank").truthy();
  std::vector<std::string> lines = py_splitlines(text_of(v) + "\n", false);
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) out += "\n";
    if (i && (blank || !lines[i].empty())) out += ind;
    out += lines[i];
  }
  if (first) out = ind + out;
  return keep_safe(v, std::move(out));
}

Value f_int(Evaluator&, const Value& v, const CallArgs& a, int) {
  Value dflt = a.get(0, "default");
  if (dflt.is_undefined()) dflt = Value::integer(0);
  if (v.is_int() || v.is_bool()) return Value::integer(v.as_int());
  if (v.is_float()) return std::isfinite(v.as_double()) ? Value::integer(static_cast<int64_t>(v.as_double())) : dflt;
  if (!v.is_string()) return dflt;
  std::string s = py_strip(v.str(), std::nullopt, true, true);
  char* end = nullptr;
  long long i = std::strtoll(s.c_str(), &end, 10);
  if (!s.empty() && end && *end == 0) return Value::integer(i);
  double d = std::strtod(s.c_str(), &end);
  if (!s.empty() && end && *end == 0 && std::isfinite(d)) return Value::integer(static_cast<int64_t>(d));
  return dflt;
}

Value f_float(Evaluator&, const Value& v, const CallArgs& a, int) {
  Value dflt = a.get(0, "default");
  if (dflt.is_undefined()) dflt = Value::number(0.0);
  if (v.is_number()) return Value::number(v.as_double());
  if (!v.is_string()) return dflt;
  std::string s = py_strip(v.str(), std::nullopt, true, true);
  char* end = nullptr;
  double d = std::strtod(s.c_str(), &end);
  return !s.empty() && end && *end == 0 ? Value::number(d) : dflt;
}

Value f_abs(Evaluator& ev, const Value& v, const CallArgs&, int line) {
  if (v.is_float()) return Value::number(std::fabs(v.as_double()));
  if (!v.is_number() || v.as_int() == INT64_MIN) ev.fail(line, "bad operand type for abs(): '" + v.type_name() + "'");
  return Value::integer(std::llabs(v.as_int()));
}

Value f_sum(Evaluator& ev, const Value& v, const CallArgs& a, int line) {
  Value attr = a.get(0, "attribute");
  Value total = a.get(1, "start");
  if (total.is_undefined()) total = Value::integer(0);
  for (const Value& item : ev.iterate(v, line)) {
    Value x = attr.is_undefined() || attr.is_none() ? item : attribute_path(ev, item, text_of(attr), line);
    if (!x.is_number() || !total.is_number()) ev.fail(line, "sum() of non-numbers");
    total = total.is_float() || x.is_float() ? Value::number(total.as_double() + x.as_double())
                                             : Value::integer(total.as_int() + x.as_int());
  }
  return total;
}

const std::unordered_map<std::string, FilterFn>& filter_table() {
  static const std::unordered_map<std::string, FilterFn> table = {
      {"trim", f_trim}, {"upper", f_upper}, {"lower", f_lower}, {"capitalize", f_capitalize},
      {"title", f_title}, {"string", f_string}, {"safe", f_safe}, {"e", f_escape}, {"escape", f_escape},
      {"length", f_length}, {"count", f_length}, {"replace", f_replace}, {"default", f_default},
      {"d", f_default}, {"join", f_join}, {"list", f_list}, {"first", f_first}, {"last", f_last},
      {"reverse", f_reverse}, {"items", f_items}, {"dictsort", f_dictsort}, {"select", f_select},
      {"reject", f_reject}, {"selectattr", f_selectattr}, {"rejectattr", f_rejectattr}, {"map", f_map},
      {"unique", f_unique}, {"tojson", f_tojson}, {"indent", f_indent}, {"int", f_int}, {"float", f_float},
      {"abs", f_abs}, {"sum", f_sum},
  };
  return table;
}

}  // namespace

Value builtin_filter(Evaluator& ev, const std::string& name, const Value& v, const CallArgs& args, int line) {
  const auto& table = filter_table();
  auto it = table.find(name);
  if (it == table.end())
    ev.fail(line, "the filter '" + name + "' is not supported by alpaca-train's chat template engine");
  return it->second(ev, v, args, line);
}

}  // namespace alpaca::chat
