// Expressions: names, attribute and item access (jinja2's getattr/getitem fallbacks), calls,
// filters, tests, Python arithmetic and comparison, `and`/`or` returning an operand.
#include <algorithm>
#include <cmath>
#include <optional>

#include "evaluator.h"

namespace alpaca::chat {

namespace {

constexpr size_t kMaxValueBytes = size_t{64} << 20;  // a string or list built by + * ~

// The result of an overflow-checked operation (x op y -> *r), or an error on overflow.
template <typename Op>
int64_t checked_op(Op op, int64_t x, int64_t y, Evaluator& ev, int line) {
  int64_t r = 0;
  if (op(x, y, &r)) ev.fail(line, "integer overflow in a template expression");
  return r;
}
bool add_ovf(int64_t x, int64_t y, int64_t* r) { return __builtin_add_overflow(x, y, r); }
bool sub_ovf(int64_t x, int64_t y, int64_t* r) { return __builtin_sub_overflow(x, y, r); }
bool mul_ovf(int64_t x, int64_t y, int64_t* r) { return __builtin_mul_overflow(x, y, r); }

// Python's slice.indices(n) and the positions it selects.
std::vector<size_t> slice_positions(size_t n, const Value& start, const Value& stop, const Value& step,
                                    Evaluator& ev, int line) {
  auto as_index = [&](const Value& v) -> std::optional<int64_t> {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    if (!v.is_int() && !v.is_bool()) ev.fail(line, "slice indices must be integers or None");
    return v.as_int();
  };
  int64_t st = as_index(step).value_or(1);
  if (st == 0) ev.fail(line, "slice step cannot be zero");
  int64_t len = static_cast<int64_t>(n);
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v < 0 ? *v + len : *v;
    if (st > 0) return std::clamp<int64_t>(x, 0, len);
    return std::clamp<int64_t>(x, -1, len - 1);
  };
  int64_t lo = clamp(as_index(start), st > 0 ? 0 : len - 1);
  int64_t hi = clamp(as_index(stop), st > 0 ? len : -1);
  std::vector<size_t> out;
  for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st) out.push_back(static_cast<size_t>(i));
  return out;
}

}  // namespace

Value Evaluator::eval(const Expr& e, const FramePtr& frame) {
  switch (e.kind) {
    case Expr::Kind::kConst: return e.value;
    case Expr::Kind::kName: return eval_name(e, frame);
    case Expr::Kind::kGetAttr: return get_attr(eval(*e.a, frame), e.name, e.line);
    case Expr::Kind::kGetItem: return get_item(eval(*e.a, frame), eval(*e.b, frame), e.line);
    case Expr::Kind::kSlice: return eval_slice(e, frame);
    case Expr::Kind::kCall: return eval_call(e, frame);
    case Expr::Kind::kFilter: return eval_filter_chain(e, nullptr, frame);
    case Expr::Kind::kTest: {
      Value v = eval(*e.a, frame);
      bool r = apply_test(e.name, v, eval_args(e, frame), e.line);
      return Value::boolean(e.negated ? !r : r);
    }
    case Expr::Kind::kNot: return Value::boolean(!eval(*e.a, frame).truthy());
    case Expr::Kind::kNeg:
    case Expr::Kind::kPos: {
      Value v = eval(*e.a, frame);
      require_defined(v, e.line);
      if (!v.is_number()) fail(e.line, "bad operand type for unary " + std::string(e.kind == Expr::Kind::kNeg ? "-" : "+") + ": '" + v.type_name() + "'");
      if (e.kind == Expr::Kind::kPos) return v.is_bool() ? Value::integer(v.as_int()) : v;
      if (v.is_float()) return Value::number(-v.as_double());
      return Value::integer(checked_op(sub_ovf, 0, v.as_int(), *this, e.line));
    }
    case Expr::Kind::kBinary: {
      Value a = eval(*e.a, frame);
      return binary(e.name, a, eval(*e.b, frame), e.line);
    }
    case Expr::Kind::kConcat: {  // str_join: without autoescape `~` never escapes
      std::string out;
      for (const auto& x : e.args) {
        out += to_str(eval(*x, frame));
        if (out.size() > kMaxValueBytes) fail(e.line, "a string grows past 64 MiB");
      }
      return Value::string(std::move(out));
    }
    case Expr::Kind::kCompare: return eval_compare(e, frame);
    case Expr::Kind::kAnd: {
      Value a = eval(*e.a, frame);
      return a.truthy() ? eval(*e.b, frame) : a;
    }
    case Expr::Kind::kOr: {
      Value a = eval(*e.a, frame);
      return a.truthy() ? a : eval(*e.b, frame);
    }
    case Expr::Kind::kCondExpr:
      if (eval(*e.a, frame).truthy()) return eval(*e.b, frame);
      return e.c ? eval(*e.c, frame) : Value::undefined("the conditional expression had no else branch");
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      List items;
      for (const auto& x : e.args) items.push_back(eval(*x, frame));
      return e.kind == Expr::Kind::kTuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
    }
    case Expr::Kind::kDict: {
      Dict d;
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        Value k = eval(*e.args[i], frame);
        if (!k.is_string()) fail(e.line, "dict literal keys must be strings here, got " + k.type_name());
        d.set(k.str(), eval(*e.args[i + 1], frame));
      }
      return Value::dict(std::move(d));
    }
  }
  return Value();
}

Value Evaluator::eval_name(const Expr& e, const FramePtr& frame) {
  for (Frame* f = frame.get(); f; f = f->parent.get()) {
    auto it = f->vars.find(e.name);
    if (it != f->vars.end()) return it->second;
  }
  auto g = globals_.find(e.name);
  if (g != globals_.end()) return g->second;
  return Value::undefined("'" + e.name + "' is undefined");
}

namespace {

std::string object_name(const Value& v) {
  if (v.is_none()) return "None";
  return "'" + v.type_name() + " object'";
}

}  // namespace

Value Evaluator::get_attr(const Value& obj, const std::string& name, int line) {
  require_defined(obj, line);
  if (obj.is_dict()) {
    if (const Value* v = obj.entries().find(name)) return *v;
  }
  return Value::undefined(object_name(obj) + " has no attribute '" + name + "'");
}

Value Evaluator::get_item(const Value& obj, const Value& key, int line) {
  require_defined(obj, line);
  if (obj.is_dict() && key.is_string()) {
    if (const Value* v = obj.entries().find(key.str())) return *v;
    return Value::undefined(object_name(obj) + " has no attribute '" + key.str() + "'");
  }
  if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.as_int();
    if (obj.is_list()) {
      int64_t n = static_cast<int64_t>(obj.items().size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.items()[static_cast<size_t>(i)];
    } else {
      std::vector<std::string_view> chars = utf8_chars(obj.str());
      int64_t n = static_cast<int64_t>(chars.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return Value::string(std::string(chars[static_cast<size_t>(i)]));
    }
    return Value::undefined(object_name(obj) + " has no element " + std::to_string(key.as_int()));
  }
  return Value::undefined(object_name(obj) + " has no element " + repr(key));
}

Value Evaluator::eval_slice(const Expr& e, const FramePtr& frame) {
  Value obj = eval(*e.a, frame);
  require_defined(obj, e.line);
  Value bounds[3];
  for (int i = 0; i < 3; ++i)
    if (e.args[static_cast<size_t>(i)]) bounds[i] = eval(*e.args[static_cast<size_t>(i)], frame);
  if (obj.is_list()) {
    List out;
    for (size_t i : slice_positions(obj.items().size(), bounds[0], bounds[1], bounds[2], *this, e.line))
      out.push_back(obj.items()[i]);
    return Value::list(std::move(out));
  }
  if (obj.is_string()) {
    std::vector<std::string_view> chars = utf8_chars(obj.str());
    std::string out;
    for (size_t i : slice_positions(chars.size(), bounds[0], bounds[1], bounds[2], *this, e.line)) out += chars[i];
    return Value::string(std::move(out));
  }
  fail(e.line, "'" + obj.type_name() + "' object is not subscriptable with a slice");
}

CallArgs Evaluator::eval_args(const Expr& e, const FramePtr& frame) {
  CallArgs args;
  for (const auto& x : e.args) args.positional.push_back(eval(*x, frame));
  for (const auto& [k, x] : e.kwargs) args.keywords.emplace_back(k, eval(*x, frame));
  return args;
}

Value Evaluator::eval_call(const Expr& e, const FramePtr& frame) {
  if (e.a->kind == Expr::Kind::kGetAttr) {  // obj.method(...)
    Value obj = eval(*e.a->a, frame);
    require_defined(obj, e.line);
    if (obj.is_dict()) {
      const Value* member = obj.entries().find(e.a->name);
      if (member && member->is_function()) return call(*member, eval_args(e, frame), e.line);
    }
    return call_method(*this, obj, e.a->name, eval_args(e, frame), e.line);
  }
  Value fn = eval(*e.a, frame);
  return call(fn, eval_args(e, frame), e.line);
}

Value Evaluator::call(const Value& fn, const CallArgs& args, int line) {
  require_defined(fn, line);
  if (!fn.is_function()) fail(line, "'" + fn.type_name() + "' object is not callable");
  return fn.fn()->call(*this, args);
}

Value Evaluator::eval_filter_chain(const Expr& e, const Value* base, const FramePtr& frame) {
  Value input;
  if (e.a->kind == Expr::Kind::kConst && base && e.a->value.is_undefined()) {
    input = *base;
  } else if (e.a->kind == Expr::Kind::kFilter) {
    input = eval_filter_chain(*e.a, base, frame);
  } else {
    input = eval(*e.a, frame);
  }
  return apply_filter(e.name, input, eval_args(e, frame), e.line);
}

Value Evaluator::apply_filter(const std::string& name, const Value& v, const CallArgs& args, int line) {
  return builtin_filter(*this, name, v, args, line);
}

bool Evaluator::apply_test(const std::string& name, const Value& v, const CallArgs& args, int line) {
  return builtin_test(*this, name, v, args, line);
}

Value Evaluator::eval_compare(const Expr& e, const FramePtr& frame) {
  Value left = eval(*e.a, frame);
  for (const auto& [op, rhs] : e.kwargs) {
    Value right = eval(*rhs, frame);
    bool r;
    if (op == "==") {
      r = equals(left, right);
    } else if (op == "!=") {
      r = !equals(left, right);
    } else if (op == "in" || op == "not in") {
      r = builtin_test(*this, "in", left, CallArgs{{right}, {}}, e.line);
      if (op == "not in") r = !r;
    } else {
      require_defined(left, e.line);
      require_defined(right, e.line);
      if (op == "<") r = less_than(left, right);
      else if (op == ">") r = less_than(right, left);
      else if (op == "<=") r = !less_than(right, left);
      else r = !less_than(left, right);
    }
    if (!r) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

std::vector<Value> Evaluator::iterate(const Value& v, int line) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return {};
    case Value::Kind::kList: return v.items();
    case Value::Kind::kDict: {
      if (v.is_namespace()) break;
      std::vector<Value> keys;
      for (const auto& [k, x] : v.entries().entries) keys.push_back(Value::string(k));
      return keys;
    }
    case Value::Kind::kString: {
      std::vector<Value> chars;
      for (std::string_view c : utf8_chars(v.str())) chars.push_back(Value::string(std::string(c)));
      return chars;
    }
    default: break;
  }
  fail(line, "'" + v.type_name() + "' object is not iterable");
}

Value Evaluator::binary(const std::string& op, const Value& a, const Value& b, int line) {
  require_defined(a, line);
  require_defined(b, line);
  auto type_error = [&]() -> Value {
    fail(line, "unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" + b.type_name() + "'");
  };
  if (op == "+" && a.is_string() && b.is_string()) {
    if (a.str().size() + b.str().size() > kMaxValueBytes) fail(line, "a string grows past 64 MiB");
    bool safe = a.is_safe() || b.is_safe();
    std::string l = safe && !a.is_safe() ? html_escape(a.str()) : a.str();
    std::string r = safe && !b.is_safe() ? html_escape(b.str()) : b.str();
    return Value::string(l + r, safe);
  }
  if (op == "+" && a.is_list() && b.is_list()) {
    if (a.items().size() + b.items().size() > kMaxValueBytes / 16) fail(line, "a list grows too long");
    List out = a.items();
    out.insert(out.end(), b.items().begin(), b.items().end());
    return Value::list(std::move(out));
  }
  if (op == "*" && ((a.is_string() || a.is_list()) != (b.is_string() || b.is_list()))) {
    const Value& seq = a.is_string() || a.is_list() ? a : b;
    const Value& n = a.is_string() || a.is_list() ? b : a;
    if (!n.is_int() && !n.is_bool()) return type_error();
    int64_t times = std::max<int64_t>(0, n.as_int());
    size_t unit = seq.is_string() ? seq.str().size() : seq.items().size() * 16;
    if (unit && static_cast<uint64_t>(times) > kMaxValueBytes / unit) fail(line, "a repeated value grows past 64 MiB");
    if (seq.is_string()) {
      std::string out;
      for (int64_t i = 0; i < times; ++i) out += seq.str();
      return Value::string(std::move(out));
    }
    List out;
    for (int64_t i = 0; i < times; ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
    return Value::list(std::move(out));
  }
  if (op == "%" && a.is_string()) fail(line, "printf-style string formatting ('...' % x) is not supported");
  if (!a.is_number() || !b.is_number()) return type_error();
  bool ints = !a.is_float() && !b.is_float();
  if (op == "/") {
    if (b.as_double() == 0) fail(line, "division by zero");
    return Value::number(a.as_double() / b.as_double());
  }
  if (ints) {
    int64_t x = a.as_int(), y = b.as_int();
    if (op == "+") return Value::integer(checked_op(add_ovf, x, y, *this, line));
    if (op == "-") return Value::integer(checked_op(sub_ovf, x, y, *this, line));
    if (op == "*") return Value::integer(checked_op(mul_ovf, x, y, *this, line));
    if (op == "//" || op == "%") {
      if (y == 0) fail(line, "integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) fail(line, "integer overflow in a template expression");
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {  // Python floors
        --q;
        m += y;
      }
      return Value::integer(op == "//" ? q : m);
    }
    if (op == "**" && y >= 0) {  // by squaring; an overflow is an error (Python would go bigint)
      int64_t base = x, p = 1;
      for (uint64_t k = static_cast<uint64_t>(y); k; k >>= 1) {
        if (k & 1) p = checked_op(mul_ovf, p, base, *this, line);
        if (k > 1) base = checked_op(mul_ovf, base, base, *this, line);
      }
      return Value::integer(p);
    }
  }
  double x = a.as_double(), y = b.as_double();
  if (op == "+") return Value::number(x + y);
  if (op == "-") return Value::number(x - y);
  if (op == "*") return Value::number(x * y);
  if (op == "**") return Value::number(std::pow(x, y));
  if (y == 0) fail(line, "float division or modulo by zero");
  double q = std::floor(x / y);
  return Value::number(op == "//" ? q : x - q * y);
}

}  // namespace alpaca::chat
