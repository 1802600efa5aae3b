#include "alpaca/generate/chat_prompt.h"

#include <nlohmann/json.hpp>  // defines: nlohmann::ordered_json

namespace alpaca::generate {

std::string chat_prompt(const chat::ChatTemplate& tmpl, const std::string& messages_json,
                        const std::string& special_tokens_json, const std::string& variables_json) {
  // ordered_json: objects keep the file's key order, as Python dicts do (tools render as JSON text).
  nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(special_tokens_json);
  ctx.update(nlohmann::ordered_json::parse(variables_json));  // {**special_tokens_map, **kwargs}
  ctx["messages"] = nlohmann::ordered_json::parse(messages_json);
  ctx["add_generation_prompt"] = true;
  return tmpl.render(ctx.dump()).text;
}

}  // namespace alpaca::generate
