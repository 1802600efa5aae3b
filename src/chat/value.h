// The Jinja engine's values: Python's types as templates see them (None, an undefined, bool,
// int, float, str, list, dict in insertion order) plus callables (macros, globals) and
// namespaces. Lists and dicts are shared, as Python objects are; the sandbox makes them
// immutable, except namespaces, which `{% set ns.x = ... %}` writes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace alpaca::chat {

class Value;
using List = std::vector<Value>;
struct Dict;
struct Function;

class Value {
 public:
  enum class Kind : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };

  Value() = default;  // undefined
  static Value undefined(std::string hint = {});
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value number(double f);
  static Value string(std::string s, bool safe = false);
  static Value list(List items);
  static Value tuple(List items);  // a list that prints as Python prints a tuple
  static Value dict(Dict d);
  static Value namespace_(Dict d);
  static Value function(std::shared_ptr<Function> f);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_function() const { return kind_ == Kind::kFunction; }
  bool is_namespace() const { return kind_ == Kind::kDict && namespace_flag_; }
  bool is_safe() const { return safe_; }
  bool is_tuple() const { return kind_ == Kind::kList && tuple_flag_; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  double as_double() const;  // int, float or bool
  const std::string& str() const { return s_; }  // string value, or the undefined's hint
  const List& items() const { return *list_; }
  const Dict& entries() const { return *dict_; }
  Dict& mutable_entries() const { return *dict_; }
  const std::shared_ptr<Function>& fn() const { return fn_; }

  bool truthy() const;  // Python's bool()
  std::string type_name() const;  // Python's type name, for errors: 'dict object', ...

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  bool safe_ = false;           // Markup (the `safe` filter): joins escape plain strings
  bool namespace_flag_ = false;
  bool tuple_flag_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<Function> fn_;
};

struct Dict {
  std::vector<std::pair<std::string, Value>> entries;
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value v);  // replaces in place or appends
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keywords;
  // The named argument at `pos` or keyword `name`, else undefined.
  Value get(size_t pos, std::string_view name) const;
  const Value* keyword(std::string_view name) const;
};

class Evaluator;
struct Function {
  std::string name;
  std::function<Value(Evaluator&, const CallArgs&)> call;
};

// str(v) as Python/Jinja print it: None, True, 1.5, ['a', 1], {'k': 'v'}; undefined prints "".
std::string to_str(const Value& v);
// repr(v): strings quoted the way Python quotes them.
std::string repr(const Value& v);
// Python float repr ("1.0", "1e-05", "inf").
std::string float_repr(double f);
// json.dumps(v, ensure_ascii=False, indent=..., separators=..., sort_keys=...). indent < 0: none.
std::string to_json(const Value& v, int indent, std::string_view item_sep, std::string_view key_sep,
                    bool sort_keys);
// Python ==, and Python's < (throws a type error for unorderable pairs).
bool equals(const Value& a, const Value& b);
bool less_than(const Value& a, const Value& b);
// HTML-escape the way markupsafe.escape does.
std::string html_escape(std::string_view s);

// UTF-8 helpers: code points, as Python counts string length and indexes.
std::vector<std::string_view> utf8_chars(std::string_view s);
size_t utf8_length(std::string_view s);

}  // namespace alpaca::chat
