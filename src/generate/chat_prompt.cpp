#include "alpaca/generate/chat_prompt.h"

#include <nlohmann/json.hpp>  // defines: nlohmann::json

namespace alpaca::generate {

std::string chat_prompt(const chat::ChatTemplate& tmpl, const std::string& messages_json,
                        const std::string& special_tokens_json) {
  nlohmann::json ctx = nlohmann::json::parse(special_tokens_json);
  ctx["messages"] = nlohmann::json::parse(messages_json);
  ctx["add_generation_prompt"] = true;
  return tmpl.render(ctx.dump()).text;
}

}  // namespace alpaca::generate
