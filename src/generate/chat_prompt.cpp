#include "alpaca/generate/chat_prompt.h"

#include <nlohmann/json.hpp>  // defines: nlohmann::json

namespace alpaca::generate {

std::string chat_prompt(const chat::ChatTemplate& tmpl, const std::string& messages_json,
                        const std::string& bos_token, const std::string& eos_token) {
  nlohmann::json ctx;
  ctx["messages"] = nlohmann::json::parse(messages_json);
  ctx["add_generation_prompt"] = true;
  ctx["bos_token"] = bos_token;
  ctx["eos_token"] = eos_token;
  return tmpl.render(ctx.dump()).text;
}

}  // namespace alpaca::generate
