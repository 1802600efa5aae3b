// Statements: output, if, for (loop.*, filters, else, break/continue), set, macros, call and
// filter blocks, {% generation %} spans. Scopes follow jinja2: each for-loop iteration and each
// macro call gets a fresh frame; `if` shares its frame; a loop's assignments never leave it.
#include "evaluator.h"

#include "alpaca/util/error.h"

namespace alpaca::chat {

Evaluator::Evaluator(const Template& tmpl, const RenderOptions& options)
    : tmpl_(tmpl), options_(options), globals_(builtin_globals()) {}

void Evaluator::fail(int line, const std::string& what) const {
  ALPACA_FAIL(tmpl_.origin << " line " << line << ": " << what);
}

void Evaluator::require_defined(const Value& v, int line) const {
  if (v.is_undefined()) fail(line, v.str().empty() ? "a value is undefined" : v.str());
}

void Evaluator::count_iterations(size_t n, int line) {
  iterations_ += n;
  if (iterations_ > options_.max_loop_iterations)
    fail(line, "more than " + std::to_string(options_.max_loop_iterations) +
                   " loop iterations in one render (a runaway template?)");
}

void Evaluator::write(std::string_view text, int line) {
  if (sink_->size() + text.size() > options_.max_output_bytes)
    fail(line, "the rendered text exceeds " + std::to_string(options_.max_output_bytes) + " bytes");
  sink_->append(text);
}

RenderResult Evaluator::render(const Value& context) {
  auto root = std::make_shared<Frame>();
  for (const auto& [k, v] : context.entries().entries) root->vars[k] = v;
  exec_body(tmpl_.body, root);
  return RenderResult{std::move(root_), std::move(spans_)};
}

Evaluator::Flow Evaluator::exec_body(const Body& body, const FramePtr& frame) {
  for (const auto& s : body) {
    Flow f = exec(*s, frame);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

std::string Evaluator::capture(const Body& body, const FramePtr& frame) {
  std::string buf;
  std::string* saved = sink_;
  sink_ = &buf;
  try {
    Flow f = exec_body(body, frame);
    if (f != Flow::kNormal) fail(body.empty() ? 0 : body.front()->line, "break/continue outside a loop");
  } catch (...) {
    sink_ = saved;
    throw;
  }
  sink_ = saved;
  return buf;
}

Evaluator::Flow Evaluator::exec(const Stmt& s, const FramePtr& frame) {
  switch (s.kind) {
    case Stmt::Kind::kData: write(s.text, s.line); return Flow::kNormal;
    case Stmt::Kind::kOutput: {
      write(to_str(eval(*s.expr, frame)), s.line);
      return Flow::kNormal;
    }
    case Stmt::Kind::kIf:
      for (const auto& [cond, body] : s.branches)
        if (eval(*cond, frame).truthy()) return exec_body(body, frame);
      return exec_body(s.else_body, frame);
    case Stmt::Kind::kFor: return exec_for(s, frame);
    case Stmt::Kind::kSet:
    case Stmt::Kind::kSetBlock: exec_set(s, frame); return Flow::kNormal;
    case Stmt::Kind::kMacro: exec_macro(s, frame); return Flow::kNormal;
    case Stmt::Kind::kCallBlock: write(to_str(exec_call_block(s, frame)), s.line); return Flow::kNormal;
    case Stmt::Kind::kFilterBlock: {
      Value body = Value::string(capture(s.body, frame));
      write(to_str(eval_filter_chain(*s.expr, &body, frame)), s.line);
      return Flow::kNormal;
    }
    case Stmt::Kind::kBreak: return Flow::kBreak;
    case Stmt::Kind::kContinue: return Flow::kContinue;
    case Stmt::Kind::kGeneration: {
      // transformers records (start, start + len(rendered body)) in the top-level output only.
      if (sink_ != &root_) return exec_body(s.body, frame);
      size_t start = root_.size();
      std::string body = capture(s.body, frame);
      write(body, s.line);
      spans_.emplace_back(start, root_.size());
      return Flow::kNormal;
    }
  }
  return Flow::kNormal;
}

namespace {

Value loop_object(const std::vector<Value>& items, size_t i, const Value& cycle) {
  size_t n = items.size();
  auto num = [](size_t x) { return Value::integer(static_cast<int64_t>(x)); };
  Dict d;  // keys are distinct: appended without Dict::set's search
  d.entries.reserve(12);
  d.entries.emplace_back("index", num(i + 1));
  d.entries.emplace_back("index0", num(i));
  d.entries.emplace_back("revindex", num(n - i));
  d.entries.emplace_back("revindex0", num(n - i - 1));
  d.entries.emplace_back("first", Value::boolean(i == 0));
  d.entries.emplace_back("last", Value::boolean(i + 1 == n));
  d.entries.emplace_back("length", num(n));
  d.entries.emplace_back("depth", Value::integer(1));
  d.entries.emplace_back("depth0", Value::integer(0));
  if (i > 0) d.entries.emplace_back("previtem", items[i - 1]);
  if (i + 1 < n) d.entries.emplace_back("nextitem", items[i + 1]);
  d.entries.emplace_back("cycle", cycle);
  return Value::dict(std::move(d));
}

}  // namespace

Evaluator::Flow Evaluator::exec_for(const Stmt& s, const FramePtr& frame) {
  Value iterable = eval(*s.expr, frame);
  std::vector<Value> owned;
  if (!iterable.is_list() || s.cond) owned = iterate(iterable, s.line);
  const std::vector<Value>* list = iterable.is_list() && !s.cond ? &iterable.items() : &owned;
  if (s.cond) {  // for x in xs if cond: filtered before loop.* is computed
    std::vector<Value> kept;
    for (const Value& item : owned) {
      auto probe = std::make_shared<Frame>();
      probe->parent = frame;
      assign(s.targets, item, *probe, s.line);
      if (eval(*s.cond, probe).truthy()) kept.push_back(item);
    }
    owned = std::move(kept);
  }
  const std::vector<Value>& items = *list;
  count_iterations(items.size(), s.line);
  auto index = std::make_shared<size_t>(0);
  auto cycle = std::make_shared<Function>();
  cycle->name = "loop.cycle";
  cycle->call = [index](Evaluator& ev, const CallArgs& args) {
    if (args.positional.empty()) ev.fail(0, "loop.cycle() needs at least one value");
    return args.positional[*index % args.positional.size()];
  };
  Value cycle_fn = Value::function(cycle);
  for (size_t i = 0; i < items.size(); ++i) {
    *index = i;
    auto iter = std::make_shared<Frame>();
    iter->parent = frame;
    assign(s.targets, items[i], *iter, s.line);
    iter->vars["loop"] = loop_object(items, i, cycle_fn);
    if (exec_body(s.body, iter) == Flow::kBreak) break;
  }
  if (items.empty()) return exec_body(s.else_body, frame);
  return Flow::kNormal;
}

void Evaluator::assign(const std::vector<std::string>& targets, const Value& v, Frame& frame, int line) {
  if (targets.size() == 1) {
    frame.vars[targets[0]] = v;
    return;
  }
  std::vector<Value> parts = iterate(v, line);
  if (parts.size() != targets.size())
    fail(line, "cannot unpack " + std::to_string(parts.size()) + " values into " + std::to_string(targets.size()) +
                   " names");
  for (size_t i = 0; i < targets.size(); ++i) frame.vars[targets[i]] = parts[i];
}

void Evaluator::exec_set(const Stmt& s, const FramePtr& frame) {
  Value v;
  if (s.kind == Stmt::Kind::kSetBlock) {
    v = Value::string(capture(s.body, frame));
    if (s.expr) v = eval_filter_chain(*s.expr, &v, frame);
  } else {
    v = eval(*s.expr, frame);
  }
  if (s.attr.empty()) {
    assign(s.targets, v, *frame, s.line);
    return;
  }
  Value ns;
  for (Frame* f = frame.get(); f; f = f->parent.get()) {
    auto it = f->vars.find(s.text);
    if (it != f->vars.end()) {
      ns = it->second;
      break;
    }
  }
  if (!ns.is_namespace()) fail(s.line, "cannot assign attribute on non-namespace object '" + s.text + "'");
  if (!s.attr.empty() && s.attr[0] == '_')
    fail(s.line, "chat templates cannot store underscore-prefixed attributes on a namespace ('" + s.attr + "')");
  ns.mutable_entries().set(s.attr, v);
}

void Evaluator::exec_macro(const Stmt& s, const FramePtr& frame) {
  auto fn = std::make_shared<Function>();
  fn->name = s.text;
  const Stmt* macro = &s;
  std::weak_ptr<Frame> closure = frame;  // a frame holding its own macro must not keep itself alive
  fn->call = [macro, closure](Evaluator& ev, const CallArgs& args) {
    FramePtr f = closure.lock();
    return ev.call_macro(*macro, f, args, macro->line);
  };
  frame->vars[s.text] = Value::function(fn);
}

Value Evaluator::call_macro(const Stmt& m, const FramePtr& closure, const CallArgs& args, int line) {
  if (call_depth_ >= 64) fail(line, "macro calls nest deeper than 64 levels (recursion?)");
  if (args.positional.size() > m.params.size())
    fail(line, "macro '" + m.text + "' takes not more than " + std::to_string(m.params.size()) + " argument(s)");
  auto f = std::make_shared<Frame>();
  f->parent = closure;
  for (const auto& [k, v] : args.keywords) {
    bool known = k == "caller";
    for (const auto& p : m.params) known = known || p.first == k;
    if (!known) fail(line, "macro '" + m.text + "' takes no keyword argument '" + k + "'");
    f->vars[k] = v;
  }
  for (size_t i = 0; i < m.params.size(); ++i) {
    const auto& [name, def] = m.params[i];
    if (i < args.positional.size()) {
      f->vars[name] = args.positional[i];
    } else if (!args.keyword(name)) {
      f->vars[name] = def ? eval(*def, f) : Value::undefined("parameter '" + name + "' was not provided");
    }
  }
  ++call_depth_;
  std::string out;
  try {
    out = capture(m.body, f);
  } catch (...) {
    --call_depth_;
    throw;
  }
  --call_depth_;
  return Value::string(std::move(out));
}

Value Evaluator::exec_call_block(const Stmt& s, const FramePtr& frame) {
  auto caller = std::make_shared<Function>();
  caller->name = "caller";
  const Body* body = &s.body;
  std::weak_ptr<Frame> weak = frame;  // the caller may be stored in that very frame
  caller->call = [body, weak](Evaluator& ev, const CallArgs&) {
    FramePtr f = weak.lock();
    if (!f) ev.fail(0, "caller() used after its call block ended");
    return Value::string(ev.capture(*body, f));
  };
  Value fn = eval(*s.expr->a, frame);
  CallArgs args = eval_args(*s.expr, frame);
  args.keywords.emplace_back("caller", Value::function(caller));
  return call(fn, args, s.line);
}

}  // namespace alpaca::chat
