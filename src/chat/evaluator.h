// Renders a parsed Template: statements write into an output buffer, expressions evaluate to
// Values, with jinja2's semantics as transformers configures it (ImmutableSandboxedEnvironment,
// default Undefined, loopcontrols, the generation extension).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "alpaca/chat/chat_template.h"
#include "ast.h"
#include "value.h"

namespace alpaca::chat {

// A scope: a for-loop iteration, a macro call or the template's top level.
struct Frame {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Frame> parent;
};
using FramePtr = std::shared_ptr<Frame>;

class Evaluator {
 public:
  Evaluator(const Template& tmpl, const RenderOptions& options);
  // Renders with `context` (a dict Value: the template's variables).
  RenderResult render(const Value& context);

  [[noreturn]] void fail(int line, const std::string& what) const;
  Value call(const Value& fn, const CallArgs& args, int line);
  Value apply_filter(const std::string& name, const Value& v, const CallArgs& args, int line);
  bool apply_test(const std::string& name, const Value& v, const CallArgs& args, int line);
  Value get_attr(const Value& obj, const std::string& name, int line);
  Value get_item(const Value& obj, const Value& key, int line);
  // Raises the undefined's error when `v` is undefined (an operation Undefined refuses).
  void require_defined(const Value& v, int line) const;
  void count_iterations(size_t n, int line);
  std::vector<Value> iterate(const Value& v, int line);  // for, list, join, map ...
  const RenderOptions& options() const { return options_; }
  std::string capture(const Body& body, const FramePtr& frame);  // renders into a string

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  Flow exec_body(const Body& body, const FramePtr& frame);
  Flow exec(const Stmt& s, const FramePtr& frame);
  Flow exec_for(const Stmt& s, const FramePtr& frame);
  void exec_set(const Stmt& s, const FramePtr& frame);
  void exec_macro(const Stmt& s, const FramePtr& frame);
  Value exec_call_block(const Stmt& s, const FramePtr& frame);
  void write(std::string_view text, int line);
  void assign(const std::vector<std::string>& targets, const Value& v, Frame& frame, int line);

  Value eval(const Expr& e, const FramePtr& frame);
  Value eval_name(const Expr& e, const FramePtr& frame);
  Value eval_call(const Expr& e, const FramePtr& frame);
  Value eval_filter_chain(const Expr& e, const Value* base, const FramePtr& frame);
  Value eval_compare(const Expr& e, const FramePtr& frame);
  Value eval_slice(const Expr& e, const FramePtr& frame);
  CallArgs eval_args(const Expr& e, const FramePtr& frame);
  Value binary(const std::string& op, const Value& a, const Value& b, int line);
  Value call_macro(const Stmt& macro, const FramePtr& closure, const CallArgs& args, int line);
  Value lookup_global(const std::string& name);

  const Template& tmpl_;
  const RenderOptions& options_;
  std::string root_;
  std::string* sink_ = &root_;
  std::vector<std::pair<size_t, size_t>> spans_;
  std::unordered_map<std::string, Value> globals_;
  size_t iterations_ = 0;
  int call_depth_ = 0;
};

// Filters (filters.cpp), tests (tests.cpp) and methods of str/dict (methods.cpp).
Value builtin_filter(Evaluator& ev, const std::string& name, const Value& v, const CallArgs& args, int line);
bool builtin_test(Evaluator& ev, const std::string& name, const Value& v, const CallArgs& args, int line);
Value call_method(Evaluator& ev, const Value& obj, const std::string& name, const CallArgs& args, int line);
// Globals: raise_exception, strftime_now, namespace, dict, range.
std::unordered_map<std::string, Value> builtin_globals();

}  // namespace alpaca::chat
