// Assistant spans by prefix rendering: each assistant turn is the text that rendering one more
// message adds after the generation prompt. Needs no markers in the template, so it covers the
// stock templates that have none (Llama-3.1, Qwen3, Gemma-3 ...), whose masks come out all-zero
// through return_assistant_tokens_mask.
#include <nlohmann/json.hpp>

#include "alpaca/chat/chat_template.h"

namespace alpaca::chat {

namespace {

using json = nlohmann::ordered_json;

std::string with_prefix(const json& ctx, size_t n, bool add_generation_prompt) {
  json c = ctx;
  json msgs = json::array();
  for (size_t i = 0; i < n; ++i) msgs.push_back(ctx["messages"][i]);
  c["messages"] = std::move(msgs);
  c["add_generation_prompt"] = add_generation_prompt;
  return c.dump();
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

std::vector<AssistantSpan> assistant_char_spans(const ChatTemplate& tmpl, std::string_view context_json,
                                                const RenderOptions& options) {
  json ctx;
  try {
    ctx = json::parse(context_json.begin(), context_json.end());
  } catch (const json::exception& e) {
    ALPACA_FAIL("the chat template context is not valid JSON: " << e.what());
  }
  ALPACA_CHECK(ctx.is_object() && ctx.contains("messages") && ctx["messages"].is_array(),
               "the chat template context needs a \"messages\" list");
  const json& msgs = ctx["messages"];
  const std::string full = tmpl.render(with_prefix(ctx, msgs.size(), false), options).text;
  std::vector<AssistantSpan> spans;
  for (size_t i = 0; i < msgs.size(); ++i) {
    if (!msgs[i].is_object() || msgs[i].value("role", json()) != "assistant") continue;
    const std::string before = tmpl.render(with_prefix(ctx, i, true), options).text;
    const std::string after = tmpl.render(with_prefix(ctx, i + 1, false), options).text;
    ALPACA_CHECK(starts_with(after, before) && starts_with(full, after),
                 "message " << i << " (assistant): the chat template is not prefix-stable there (rendering "
                            << (starts_with(after, before) ? "messages[:" + std::to_string(i + 1) + "] is not a prefix of all messages"
                                                           : "messages[:" + std::to_string(i) + "] with the generation prompt is not a prefix of messages[:" + std::to_string(i + 1) + "]")
                            << "), so its tokens cannot be found by prefix rendering; use a template with "
                               "{% generation %} markers (--chat_template)");
    spans.push_back({i, before.size(), after.size()});
  }
  return spans;
}

}  // namespace alpaca::chat
