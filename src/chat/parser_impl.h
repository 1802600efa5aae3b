// The parser's class, shared by parser.cpp (statements) and parser_expr.cpp (expressions).
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "alpaca/util/error.h"
#include "ast.h"
#include "lexer.h"

namespace alpaca::chat {

constexpr int kMaxDepth = 200;  // nesting bound: hostile templates must not exhaust the stack

class Parser {
 public:
  Parser(std::vector<Token> toks, const std::string& origin) : t_(std::move(toks)), origin_(origin) {}
  Body parse_body(std::initializer_list<std::string_view> end_names);
  std::string end_name_seen;  // which end name stopped parse_body
  bool has_generation = false;

 private:
  const Token& cur() const { return t_[pos_]; }
  const Token& peek(size_t n = 1) const { return t_[std::min(pos_ + n, t_.size() - 1)]; }
  [[noreturn]] void fail(const std::string& what) const {
    ALPACA_FAIL(origin_ << " line " << cur().line << ": " << what);
  }
  bool is_op(std::string_view op) const { return cur().type == Tok::kOp && cur().text == op; }
  bool is_name(std::string_view n) const { return cur().type == Tok::kName && cur().text == n; }
  void expect_op(std::string_view op) {
    if (!is_op(op)) fail("expected '" + std::string(op) + "', got " + describe());
    ++pos_;
  }
  std::string expect_name() {
    if (cur().type != Tok::kName) fail("expected a name, got " + describe());
    return t_[pos_++].text;
  }
  void expect_block_end() {
    if (cur().type != Tok::kBlockEnd) fail("expected the end of the statement '%}', got " + describe());
    ++pos_;
  }
  std::string describe() const;
  ExprPtr make(Expr::Kind k) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = cur().line;
    return e;
  }
  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > kMaxDepth) p.fail("nesting deeper than " + std::to_string(kMaxDepth) + " levels");
    }
    ~DepthGuard() { --p.depth_; }
  };

  StmtPtr parse_statement();
  StmtPtr parse_for(int line);
  StmtPtr parse_if(int line);
  StmtPtr parse_set(int line);
  StmtPtr parse_macro(int line);
  StmtPtr parse_call_block(int line);
  StmtPtr parse_filter_block(int line);
  StmtPtr simple_block(Stmt::Kind kind, int line, std::string_view end);

  ExprPtr parse_expression(bool with_condexpr = true);
  ExprPtr parse_binary_level(Expr::Kind kind, std::initializer_list<std::string_view> ops,
                             const std::function<ExprPtr()>& operand);
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary(bool with_filter = true);
  ExprPtr parse_primary();
  ExprPtr parse_tuple(bool explicit_parens, bool with_condexpr = true);
  ExprPtr parse_list();
  ExprPtr parse_dict();
  ExprPtr parse_postfix(ExprPtr node);
  ExprPtr parse_filter_expr(ExprPtr node);
  ExprPtr parse_subscript(ExprPtr node);
  ExprPtr parse_subscribed();
  ExprPtr parse_filter(ExprPtr node);
  ExprPtr parse_test(ExprPtr node);
  ExprPtr parse_call(ExprPtr callee);  // `callee(args)`, at the "("
  void parse_call_args(Expr& call);
  std::vector<std::string> parse_targets();

  std::vector<Token> t_;
  size_t pos_ = 0;
  const std::string& origin_;
  int depth_ = 0;
};

}  // namespace alpaca::chat
