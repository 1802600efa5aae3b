// jinja2's builtin tests (`x is defined`, `x is string`, ...), with Python's type rules: bool is
// a number, Undefined is iterable and a sequence, a namespace is not a mapping.
#include <unordered_map>

#include "evaluator.h"
#include "strings.h"

namespace alpaca::chat {

namespace {

bool t_in(Evaluator& ev, const Value& v, const Value& seq, int line) {
  switch (seq.kind()) {
    case Value::Kind::kUndefined: return false;
    case Value::Kind::kString:
      if (!v.is_string()) ev.fail(line, "'in <string>' requires string as left operand, not " + v.type_name());
      return seq.str().find(v.str()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& x : seq.items())
        if (equals(x, v)) return true;
      return false;
    case Value::Kind::kDict:
      if (seq.is_namespace()) break;
      return v.is_string() && seq.entries().find(v.str()) != nullptr;
    default: break;
  }
  ev.fail(line, "argument of type '" + seq.type_name() + "' is not iterable");
}

bool compare_test(Evaluator& ev, const std::string& name, const Value& v, const Value& other, int line) {
  if (name == "eq" || name == "equalto" || name == "==") return equals(v, other);
  if (name == "ne" || name == "!=") return !equals(v, other);
  ev.require_defined(v, line);
  ev.require_defined(other, line);
  if (name == "lt" || name == "lessthan" || name == "<") return less_than(v, other);
  if (name == "le" || name == "<=") return !less_than(other, v);
  if (name == "gt" || name == "greaterthan" || name == ">") return less_than(other, v);
  return !less_than(v, other);  // ge, >=
}

}  // namespace

bool builtin_test(Evaluator& ev, const std::string& name, const Value& v, const CallArgs& args, int line) {
  using K = Value::Kind;
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict() && !v.is_namespace();
  if (name == "iterable") return v.kind() == K::kUndefined || v.is_string() || v.is_list() || (v.is_dict() && !v.is_namespace());
  if (name == "sequence") return v.kind() == K::kUndefined || v.is_string() || v.is_list() || (v.is_dict() && !v.is_namespace());
  if (name == "callable") return v.is_function();
  if (name == "escaped") return v.is_safe();
  if (name == "lower") return v.is_string() && py_lower(v.str()) == v.str();
  if (name == "upper") return v.is_string() && py_upper(v.str()) == v.str();
  if (name == "in") return t_in(ev, v, args.get(0, "seq"), line);
  if (name == "sameas") {
    Value o = args.get(0, "other");
    return (v.is_none() && o.is_none()) || (v.is_bool() && o.is_bool() && v.as_bool() == o.as_bool()) ||
           (v.is_list() && o.is_list() && &v.items() == &o.items()) ||
           (v.is_dict() && o.is_dict() && &v.entries() == &o.entries());
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (!v.is_int() && !v.is_bool()) ev.fail(line, "the test '" + name + "' needs an integer, not " + v.type_name());
    if (name == "divisibleby") {
      Value n = args.get(0, "num");
      if (!n.is_int() || n.as_int() == 0) ev.fail(line, "divisibleby needs a non-zero integer");
      return v.as_int() % n.as_int() == 0;
    }
    return (v.as_int() % 2 != 0) == (name == "odd");
  }
  static const char* kCompare[] = {"eq", "equalto", "==", "ne", "!=", "lt", "lessthan", "<", "le", "<=",
                                   "gt", "greaterthan", ">", "ge", ">="};
  for (const char* c : kCompare)
    if (name == c) return compare_test(ev, name, v, args.get(0, "other"), line);
  ev.fail(line, "the test '" + name + "' is not supported by alpaca-train's chat template engine");
}

}  // namespace alpaca::chat
