// The parsed template: expressions and statements, as jinja2.nodes has them for what chat
// templates use.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "value.h"

namespace alpaca::chat {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kConst,     // value
    kName,      // name
    kGetAttr,   // a.name
    kGetItem,   // a[b]
    kSlice,     // a[b:c:d]: args = {start, stop, step}, each may be null
    kCall,      // a(args, kwargs)
    kFilter,    // a | name(args, kwargs)
    kTest,      // a is [not] name(args)
    kNot,       // not a
    kNeg,       // -a
    kPos,       // +a
    kBinary,    // a op b: + - * / // % **
    kConcat,    // args joined with ~
    kCompare,   // a op b: == != < <= > >= in, "not in"
    kAnd,
    kOr,
    kCondExpr,  // b if a else c (c may be null)
    kList,
    kTuple,
    kDict,      // kwargs-like pairs of key/value expressions in args (even: key, odd: value)
  };
  Kind kind;
  int line = 0;
  std::string name;  // name, attribute, filter, test or operator
  Value value;       // constant
  bool negated = false;
  ExprPtr a, b, c;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    kData,        // text
    kOutput,      // {{ expr }}
    kIf,          // branches (cond, body), else_body
    kFor,         // targets in expr [if cond]: body, else_body
    kSet,         // targets (or target_ns.attr) = expr
    kSetBlock,    // {% set name %}body{% endset %} (optional filter in filter_name)
    kMacro,       // name(params = defaults): body
    kCallBlock,   // {% call macro(args) %}body{% endcall %}: body is caller()
    kFilterBlock, // {% filter name(args) %}body{% endfilter %}
    kBreak,
    kContinue,
    kGeneration,  // {% generation %}body{% endgeneration %}
  };
  Kind kind;
  int line = 0;
  std::string text;                  // data; set/macro name; namespace name of `set ns.attr`
  std::string attr;                  // `set ns.attr`
  std::vector<std::string> targets;  // for / set names
  ExprPtr expr;                      // output, iterable, value, call, filter call
  ExprPtr cond;                      // for ... if cond
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro parameters and defaults
};

struct Template {
  std::string source;
  std::string origin;
  Body body;
  bool has_generation = false;
};

}  // namespace alpaca::chat
