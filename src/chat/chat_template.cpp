// ChatTemplate: finding the template the way transformers 5 does, and preparing the variables
// the way apply_chat_template does before it renders.
#include "alpaca/chat/chat_template.h"
#include "alpaca/util/user_error.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "evaluator.h"
#include "parser.h"
#include "value_json.h"

namespace alpaca::chat {

namespace fs = std::filesystem;

ChatTemplate::ChatTemplate(std::string source, std::string origin)
    : impl_(parse_template(std::move(source), std::move(origin))) {}
ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

const std::string& ChatTemplate::source() const { return impl_->source; }
bool ChatTemplate::has_generation_blocks() const { return impl_->has_generation; }

namespace {

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  ALPACA_CHECK(in, "cannot read the chat template file " << p << "; check the path and its permissions");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// tokenizer_config.json's chat_template: a string, or [{name, template}, ...] of which
// transformers renders "default".
std::string template_from_config(const fs::path& config) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text(config));
  } catch (const nlohmann::json::exception& e) {
    ALPACA_USER_FAIL(config << " is not valid JSON (" << e.what() << "); fix or regenerate the tokenizer files");
  }
  ALPACA_USER_CHECK(j.is_object() && j.contains("chat_template"),
               config << " has no chat_template and there is no chat_template.jinja beside it; pass "
                         "--chat_template FILE with the model's Jinja chat template");
  const auto& t = j["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  ALPACA_CHECK(t.is_array(), config << ": chat_template must be a string or a list of {name, template}");
  std::string names;
  for (const auto& entry : t) {
    ALPACA_CHECK(entry.is_object() && entry.contains("name") && entry["name"].is_string() &&
                     entry.contains("template") && entry["template"].is_string(),
                 config << ": each chat_template entry must be {\"name\": string, \"template\": string}");
    if (entry["name"] == "default") return entry["template"].get<std::string>();
    names += (names.empty() ? "" : ", ") + entry["name"].get<std::string>();
  }
  std::ostringstream msg;
  msg << config << " has several chat templates (" << names
      << ") and none named \"default\"; pass --chat_template FILE to pick one";
  detail::throw_error(__FILE__, __LINE__, msg.str());
}

// What apply_chat_template does to each message: drop keys whose value is None, then alias the
// reasoning (_alias_reasoning_fields): {"thinking": r, **message, "reasoning_content": r}.
Value prepare_message(const Value& m) {
  ALPACA_CHECK(m.is_dict(), "chat messages must be objects, got " << m.type_name());
  Dict d;
  for (const auto& [k, v] : m.entries().entries)
    if (!v.is_none()) d.entries.emplace_back(k, v);
  const Value* reasoning = nullptr;
  for (const char* key : {"reasoning_content", "thinking", "reasoning"})
    if (!reasoning) reasoning = d.find(key);
  if (!reasoning) return Value::dict(std::move(d));
  Value r = *reasoning;
  Dict out;
  out.set("thinking", r);
  for (const auto& [k, v] : d.entries) out.set(k, v);
  out.set("reasoning_content", r);
  return Value::dict(std::move(out));
}

}  // namespace

ChatTemplate ChatTemplate::load(const fs::path& model_dir, const fs::path& override_path) {
  if (!override_path.empty()) return ChatTemplate(read_text(override_path), override_path.string());
  fs::path jinja = model_dir / "chat_template.jinja";
  if (fs::exists(jinja)) return ChatTemplate(read_text(jinja), jinja.string());
  fs::path config = model_dir / "tokenizer_config.json";
  ALPACA_CHECK(fs::exists(config), "no chat template in " << model_dir << ": neither chat_template.jinja nor "
                                                             "tokenizer_config.json is there; pass --chat_template FILE");
  return ChatTemplate(template_from_config(config), config.string() + " (chat_template)");
}

RenderResult ChatTemplate::render(std::string_view context_json, const RenderOptions& options) const {
  Value ctx = parse_json_value(context_json);
  ALPACA_CHECK(ctx.is_dict(), "the chat template context must be a JSON object of variables");
  Dict vars = ctx.entries();
  if (const Value* msgs = vars.find("messages"); msgs && msgs->is_list()) {
    List prepared;
    for (const Value& m : msgs->items()) prepared.push_back(prepare_message(m));
    vars.set("messages", Value::list(std::move(prepared)));
  }
  if (!vars.find("add_generation_prompt")) vars.set("add_generation_prompt", Value::boolean(false));
  if (!vars.find("tools")) vars.set("tools", Value::none());
  if (!vars.find("documents")) vars.set("documents", Value::none());
  Evaluator ev(*impl_, options);
  return ev.render(Value::dict(std::move(vars)));
}

}  // namespace alpaca::chat
