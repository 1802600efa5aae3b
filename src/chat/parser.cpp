// Recursive descent over the lexer's tokens, following jinja2.parser.Parser's precedence:
// condexpr > or > and > not > compare > + - > ~ > * / // % > ** > unary > postfix, filters, tests.
#include "parser.h"

#include <charconv>

#include "alpaca/util/error.h"
#include "lexer.h"
#include "parser_impl.h"

namespace alpaca::chat {

std::string Parser::describe() const {
  switch (cur().type) {
    case Tok::kEof: return "the end of the template";
    case Tok::kBlockEnd: return "'%}'";
    case Tok::kVarEnd: return "'}}'";
    case Tok::kData: return "template text";
    default: return "'" + cur().text + "'";
  }
}

Body Parser::parse_body(std::initializer_list<std::string_view> end_names) {
  DepthGuard guard(*this);
  Body body;
  while (true) {
    const Token& tok = cur();
    if (tok.type == Tok::kEof) {
      if (end_names.size() == 0) return body;
      std::string expected;
      for (std::string_view e : end_names) expected += (expected.empty() ? "'" : " or '") + std::string(e) + "'";
      fail("unexpected end of template, expected " + expected);
    }
    if (tok.type == Tok::kData) {
      auto s = std::make_unique<Stmt>();
      s->kind = Stmt::Kind::kData;
      s->line = tok.line;
      s->text = tok.text;
      body.push_back(std::move(s));
      ++pos_;
    } else if (tok.type == Tok::kVarBegin) {
      ++pos_;
      auto s = std::make_unique<Stmt>();
      s->kind = Stmt::Kind::kOutput;
      s->line = tok.line;
      s->expr = parse_tuple(false);
      if (cur().type != Tok::kVarEnd) fail("expected the end of the print statement '}}', got " + describe());
      ++pos_;
      body.push_back(std::move(s));
    } else if (tok.type == Tok::kBlockBegin) {
      ++pos_;
      if (cur().type == Tok::kName) {
        for (std::string_view e : end_names)
          if (cur().text == e) {
            end_name_seen = cur().text;
            return body;  // the caller consumes the end tag
          }
      }
      body.push_back(parse_statement());
    } else {
      fail("unexpected " + describe());
    }
  }
}

StmtPtr Parser::simple_block(Stmt::Kind kind, int line, std::string_view end) {
  auto s = std::make_unique<Stmt>();
  s->kind = kind;
  s->line = line;
  expect_block_end();
  std::string end_s(end);
  s->body = parse_body({end_s});
  ++pos_;
  expect_block_end();
  return s;
}

StmtPtr Parser::parse_statement() {
  int line = cur().line;
  if (cur().type != Tok::kName) fail("expected a statement name, got " + describe());
  std::string kw = t_[pos_++].text;
  if (kw == "for") return parse_for(line);
  if (kw == "if") return parse_if(line);
  if (kw == "set") return parse_set(line);
  if (kw == "macro") return parse_macro(line);
  if (kw == "call") return parse_call_block(line);
  if (kw == "filter") return parse_filter_block(line);
  if (kw == "generation") {
    has_generation = true;
    return simple_block(Stmt::Kind::kGeneration, line, "endgeneration");
  }
  if (kw == "break" || kw == "continue") {
    auto s = std::make_unique<Stmt>();
    s->kind = kw == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
    s->line = line;
    expect_block_end();
    return s;
  }
  std::ostringstream msg;
  msg << origin_ << " line " << line << ": the statement '{% " << kw
      << " %}' is not supported by alpaca-train's chat template engine (it renders for, if, set, macro, call, "
         "filter, generation, break, continue and raw)";
  detail::throw_error(__FILE__, __LINE__, msg.str());
}

std::vector<std::string> Parser::parse_targets() {
  std::vector<std::string> names;
  bool parens = is_op("(");
  if (parens) ++pos_;
  names.push_back(expect_name());
  while (is_op(",")) {
    ++pos_;
    if (cur().type != Tok::kName) break;
    names.push_back(expect_name());
  }
  if (parens) expect_op(")");
  return names;
}

StmtPtr Parser::parse_for(int line) {
  auto s = std::make_unique<Stmt>();
  s->kind = Stmt::Kind::kFor;
  s->line = line;
  s->targets = parse_targets();
  if (!is_name("in")) fail("expected 'in' in a for loop, got " + describe());
  ++pos_;
  s->expr = parse_tuple(false, false);
  if (is_name("if")) {
    ++pos_;
    s->cond = parse_expression();
  }
  if (is_name("recursive")) fail("recursive for loops are not supported");
  expect_block_end();
  s->body = parse_body({"endfor", "else"});
  if (end_name_seen == "else") {
    ++pos_;
    expect_block_end();
    s->else_body = parse_body({"endfor"});
  }
  ++pos_;
  expect_block_end();
  return s;
}

StmtPtr Parser::parse_if(int line) {
  auto s = std::make_unique<Stmt>();
  s->kind = Stmt::Kind::kIf;
  s->line = line;
  while (true) {
    ExprPtr cond = parse_tuple(false);
    expect_block_end();
    Body body = parse_body({"elif", "else", "endif"});
    s->branches.emplace_back(std::move(cond), std::move(body));
    std::string end = end_name_seen;
    ++pos_;
    if (end == "elif") continue;
    if (end == "else") {
      expect_block_end();
      s->else_body = parse_body({"endif"});
      ++pos_;
    }
    expect_block_end();
    return s;
  }
}

StmtPtr Parser::parse_set(int line) {
  auto s = std::make_unique<Stmt>();
  s->line = line;
  if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().text == ".") {
    s->text = expect_name();
    ++pos_;
    s->attr = expect_name();
    s->targets.push_back(s->text);
  } else {
    s->targets = parse_targets();
  }
  if (is_op("=")) {
    ++pos_;
    s->kind = Stmt::Kind::kSet;
    s->expr = parse_tuple(false);
    expect_block_end();
    return s;
  }
  if (!s->attr.empty() || s->targets.size() != 1) fail("a block set assigns one name");
  s->kind = Stmt::Kind::kSetBlock;
  while (is_op("|")) {  // {% set x | filter %}: the filters apply to the rendered body
    ++pos_;
    s->expr = parse_filter(s->expr ? std::move(s->expr) : make(Expr::Kind::kConst));
  }
  expect_block_end();
  s->body = parse_body({"endset"});
  ++pos_;
  expect_block_end();
  return s;
}

StmtPtr Parser::parse_macro(int line) {
  auto s = std::make_unique<Stmt>();
  s->kind = Stmt::Kind::kMacro;
  s->line = line;
  s->text = expect_name();
  expect_op("(");
  while (!is_op(")")) {
    if (!s->params.empty()) expect_op(",");
    std::string name = expect_name();
    ExprPtr def;
    if (is_op("=")) {
      ++pos_;
      def = parse_expression();
    } else if (!s->params.empty() && s->params.back().second) {
      fail("macro '" + s->text + "': parameter '" + name + "' without a default follows one with a default");
    }
    s->params.emplace_back(name, std::move(def));
  }
  ++pos_;
  expect_block_end();
  s->body = parse_body({"endmacro"});
  ++pos_;
  if (cur().type == Tok::kName && cur().text == s->text) ++pos_;
  expect_block_end();
  return s;
}

StmtPtr Parser::parse_call_block(int line) {
  auto s = std::make_unique<Stmt>();
  s->kind = Stmt::Kind::kCallBlock;
  s->line = line;
  if (is_op("(")) fail("call blocks with caller arguments are not supported");
  s->expr = parse_expression();
  if (s->expr->kind != Expr::Kind::kCall) fail("expected a macro call after 'call'");
  expect_block_end();
  s->body = parse_body({"endcall"});
  ++pos_;
  expect_block_end();
  return s;
}

StmtPtr Parser::parse_filter_block(int line) {
  auto s = std::make_unique<Stmt>();
  s->kind = Stmt::Kind::kFilterBlock;
  s->line = line;
  s->expr = parse_filter(make(Expr::Kind::kConst));
  while (is_op("|")) {
    ++pos_;
    s->expr = parse_filter(std::move(s->expr));
  }
  expect_block_end();
  s->body = parse_body({"endfilter"});
  ++pos_;
  expect_block_end();
  return s;
}


std::unique_ptr<Template> parse_template(std::string source, std::string origin) {
  auto tmpl = std::make_unique<Template>();
  tmpl->origin = std::move(origin);
  Parser p(lex(source, tmpl->origin), tmpl->origin);
  tmpl->body = p.parse_body({});
  tmpl->has_generation = p.has_generation;
  tmpl->source = std::move(source);
  return tmpl;
}

}  // namespace alpaca::chat
