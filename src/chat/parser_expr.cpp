// Expressions, after jinja2.parser.Parser: the same precedence and the same postfix rules
// (`-x|f` is f(-x); a test takes one bare argument, `x is divisibleby 3`).
#include <charconv>

#include "parser_impl.h"

namespace alpaca::chat {

ExprPtr Parser::parse_tuple(bool explicit_parens, bool with_condexpr) {
  DepthGuard guard(*this);
  auto tuple = make(Expr::Kind::kTuple);
  bool is_tuple = false;
  while (true) {
    if (!tuple->args.empty()) expect_op(",");
    if (cur().type == Tok::kVarEnd || cur().type == Tok::kBlockEnd || is_op(")") || is_name("in") ||
        (!with_condexpr && is_name("if")))
      break;
    tuple->args.push_back(parse_expression(with_condexpr));
    if (is_op(",")) {
      is_tuple = true;
    } else {
      break;
    }
  }
  if (!is_tuple) {
    if (!tuple->args.empty()) return std::move(tuple->args[0]);
    if (!explicit_parens) fail("expected an expression, got " + describe());
  }
  return tuple;
}

ExprPtr Parser::parse_expression(bool with_condexpr) {
  DepthGuard guard(*this);
  if (!with_condexpr) return parse_or();
  ExprPtr expr = parse_or();
  while (is_name("if")) {
    ++pos_;
    auto cond = make(Expr::Kind::kCondExpr);
    cond->a = parse_or();  // the test
    cond->b = std::move(expr);
    if (is_name("else")) {
      ++pos_;
      cond->c = parse_expression(true);
    }
    expr = std::move(cond);
  }
  return expr;
}

// One left-associative level of binary operators: operands from `operand`, joined while the
// current token is one of `ops` (names for kOr / kAnd, operator tokens for kBinary, which keeps
// the operator's text in name).
ExprPtr Parser::parse_binary_level(Expr::Kind kind, std::initializer_list<std::string_view> ops,
                                   const std::function<ExprPtr()>& operand) {
  const bool words = kind != Expr::Kind::kBinary;
  auto at_op = [&] {
    for (std::string_view op : ops)
      if (words ? is_name(op) : is_op(op)) return true;
    return false;
  };
  ExprPtr left = operand();
  while (at_op()) {
    auto e = make(kind);
    if (!words) e->name = t_[pos_].text;
    ++pos_;
    e->a = std::move(left);
    e->b = operand();
    left = std::move(e);
  }
  return left;
}

ExprPtr Parser::parse_or() { return parse_binary_level(Expr::Kind::kOr, {"or"}, [this] { return parse_and(); }); }

ExprPtr Parser::parse_and() { return parse_binary_level(Expr::Kind::kAnd, {"and"}, [this] { return parse_not(); }); }

ExprPtr Parser::parse_not() {
  DepthGuard guard(*this);
  if (is_name("not")) {
    auto e = make(Expr::Kind::kNot);
    ++pos_;
    e->a = parse_not();
    return e;
  }
  return parse_compare();
}

// a < b <= c: the operands in a and args, the operators in kwargs' names.
ExprPtr Parser::parse_compare() {
  ExprPtr expr = parse_math1();
  ExprPtr cmp;
  while (true) {
    std::string op;
    if (cur().type == Tok::kOp &&
        (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
         cur().text == ">" || cur().text == ">=")) {
      op = cur().text;
      ++pos_;
    } else if (is_name("in")) {
      op = "in";
      ++pos_;
    } else if (is_name("not") && peek().type == Tok::kName && peek().text == "in") {
      op = "not in";
      pos_ += 2;
    } else {
      break;
    }
    if (!cmp) {
      cmp = make(Expr::Kind::kCompare);
      cmp->a = std::move(expr);
    }
    cmp->kwargs.emplace_back(op, parse_math1());
  }
  return cmp ? std::move(cmp) : std::move(expr);
}

ExprPtr Parser::parse_math1() {
  return parse_binary_level(Expr::Kind::kBinary, {"+", "-"}, [this] { return parse_concat(); });
}

ExprPtr Parser::parse_concat() {
  ExprPtr first = parse_math2();
  if (!is_op("~")) return first;
  auto e = make(Expr::Kind::kConcat);
  e->args.push_back(std::move(first));
  while (is_op("~")) {
    ++pos_;
    e->args.push_back(parse_math2());
  }
  return e;
}

ExprPtr Parser::parse_math2() {
  return parse_binary_level(Expr::Kind::kBinary, {"*", "/", "//", "%"}, [this] { return parse_pow(); });
}

ExprPtr Parser::parse_pow() {
  return parse_binary_level(Expr::Kind::kBinary, {"**"}, [this] { return parse_unary(); });
}

ExprPtr Parser::parse_unary(bool with_filter) {
  DepthGuard guard(*this);
  ExprPtr node;
  if (is_op("-") || is_op("+")) {
    node = make(is_op("-") ? Expr::Kind::kNeg : Expr::Kind::kPos);
    ++pos_;
    node->a = parse_unary(false);
  } else {
    node = parse_primary();
  }
  node = parse_postfix(std::move(node));
  if (with_filter) node = parse_filter_expr(std::move(node));
  return node;
}

ExprPtr Parser::parse_primary() {
  DepthGuard guard(*this);
  const Token& tok = cur();
  auto e = make(Expr::Kind::kConst);
  switch (tok.type) {
    case Tok::kName:
      if (tok.text == "true" || tok.text == "True" || tok.text == "false" || tok.text == "False") {
        e->value = Value::boolean(tok.text[0] == 't' || tok.text[0] == 'T');
      } else if (tok.text == "none" || tok.text == "None") {
        e->value = Value::none();
      } else {
        e->kind = Expr::Kind::kName;
        e->name = tok.text;
      }
      ++pos_;
      return e;
    case Tok::kString: {
      std::string s;
      while (cur().type == Tok::kString) s += t_[pos_++].text;  // adjacent literals join
      e->value = Value::string(std::move(s));
      return e;
    }
    case Tok::kInt: {
      int64_t v = 0;
      auto r = std::from_chars(tok.text.data(), tok.text.data() + tok.text.size(), v);
      if (r.ec != std::errc()) fail("integer literal " + tok.text + " is out of range");
      e->value = Value::integer(v);
      ++pos_;
      return e;
    }
    case Tok::kFloat:
      e->value = Value::number(std::strtod(tok.text.c_str(), nullptr));
      ++pos_;
      return e;
    case Tok::kOp:
      if (tok.text == "(") {
        ++pos_;
        ExprPtr inner = parse_tuple(true);
        expect_op(")");
        return inner;
      }
      if (tok.text == "[") return parse_list();
      if (tok.text == "{") return parse_dict();
      [[fallthrough]];
    default: fail("unexpected " + describe());
  }
}

ExprPtr Parser::parse_list() {
  auto e = make(Expr::Kind::kList);
  expect_op("[");
  while (!is_op("]")) {
    if (!e->args.empty()) expect_op(",");
    if (is_op("]")) break;
    e->args.push_back(parse_expression());
  }
  ++pos_;
  return e;
}

ExprPtr Parser::parse_dict() {
  auto e = make(Expr::Kind::kDict);
  expect_op("{");
  while (!is_op("}")) {
    if (!e->args.empty()) expect_op(",");
    if (is_op("}")) break;
    e->args.push_back(parse_expression());
    expect_op(":");
    e->args.push_back(parse_expression());
  }
  ++pos_;
  return e;
}

ExprPtr Parser::parse_call(ExprPtr callee) {
  auto call = make(Expr::Kind::kCall);
  call->a = std::move(callee);
  parse_call_args(*call);
  return call;
}

ExprPtr Parser::parse_postfix(ExprPtr node) {
  while (true) {
    if (is_op(".") || is_op("[")) {
      node = parse_subscript(std::move(node));
    } else if (is_op("(")) {
      node = parse_call(std::move(node));
    } else {
      return node;
    }
  }
}

ExprPtr Parser::parse_filter_expr(ExprPtr node) {
  while (true) {
    if (is_op("|")) {
      ++pos_;
      node = parse_filter(std::move(node));
    } else if (is_name("is")) {
      node = parse_test(std::move(node));
    } else if (is_op("(")) {
      node = parse_call(std::move(node));
    } else {
      return node;
    }
  }
}

ExprPtr Parser::parse_subscript(ExprPtr node) {
  DepthGuard guard(*this);
  if (is_op(".")) {
    ++pos_;
    if (cur().type == Tok::kName) {
      auto e = make(Expr::Kind::kGetAttr);
      e->name = t_[pos_++].text;
      e->a = std::move(node);
      return e;
    }
    if (cur().type != Tok::kInt) fail("expected a name or a number after '.', got " + describe());
    auto e = make(Expr::Kind::kGetItem);
    e->a = std::move(node);
    e->b = parse_primary();
    return e;
  }
  expect_op("[");
  std::vector<ExprPtr> items;
  while (!is_op("]")) {
    if (!items.empty()) expect_op(",");
    if (is_op("]")) break;
    items.push_back(parse_subscribed());
  }
  ++pos_;
  if (items.empty()) fail("expected a subscript inside '[]'");
  ExprPtr index;
  if (items.size() == 1) {
    index = std::move(items[0]);
  } else {
    index = make(Expr::Kind::kTuple);
    index->args = std::move(items);
  }
  if (index->kind == Expr::Kind::kSlice) {
    index->a = std::move(node);
    return index;
  }
  auto e = make(Expr::Kind::kGetItem);
  e->a = std::move(node);
  e->b = std::move(index);
  return e;
}

// One subscript: an expression, or a slice start:stop:step (a kSlice node, object filled later).
ExprPtr Parser::parse_subscribed() {
  ExprPtr start;
  if (!is_op(":")) {
    start = parse_expression();
    if (!is_op(":")) return start;
  }
  auto slice = make(Expr::Kind::kSlice);
  ++pos_;
  slice->args.resize(3);
  slice->args[0] = std::move(start);
  if (!is_op("]") && !is_op(",") && !is_op(":")) slice->args[1] = parse_expression();
  if (is_op(":")) {
    ++pos_;
    if (!is_op("]") && !is_op(",")) slice->args[2] = parse_expression();
  }
  return slice;
}

void Parser::parse_call_args(Expr& call) {
  DepthGuard guard(*this);
  expect_op("(");
  while (!is_op(")")) {
    if (!call.args.empty() || !call.kwargs.empty()) {
      expect_op(",");
      if (is_op(")")) break;
    }
    if (is_op("*") || is_op("**")) fail("*args and **kwargs in calls are not supported");
    if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().text == "=") {
      std::string key = t_[pos_].text;
      pos_ += 2;
      call.kwargs.emplace_back(key, parse_expression());
    } else {
      if (!call.kwargs.empty()) fail("a positional argument follows a keyword argument");
      call.args.push_back(parse_expression());
    }
  }
  ++pos_;
}

ExprPtr Parser::parse_filter(ExprPtr node) {
  auto e = make(Expr::Kind::kFilter);
  e->name = expect_name();
  while (is_op(".")) {
    ++pos_;
    e->name += "." + expect_name();
  }
  e->a = std::move(node);
  if (is_op("(")) parse_call_args(*e);
  return e;
}

ExprPtr Parser::parse_test(ExprPtr node) {
  auto e = make(Expr::Kind::kTest);
  ++pos_;  // is
  if (is_name("not")) {
    ++pos_;
    e->negated = true;
  }
  e->name = expect_name();
  e->a = std::move(node);
  const Token& t = cur();
  if (is_op("(")) {
    parse_call_args(*e);
  } else if ((t.type == Tok::kName || t.type == Tok::kString || t.type == Tok::kInt || t.type == Tok::kFloat ||
              is_op("[") || is_op("{")) &&
             !is_name("else") && !is_name("or") && !is_name("and")) {
    if (is_name("is")) fail("you cannot chain multiple tests with 'is'");
    e->args.push_back(parse_postfix(parse_primary()));
  }
  return e;
}

}  // namespace alpaca::chat
