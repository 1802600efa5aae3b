// `generate --chat`: a conversation rendered by the model's chat template the way transformers'
// apply_chat_template(messages, add_generation_prompt=True) renders it, so a fine-tuned instruct
// model is asked in the format it was trained on. The text is then tokenized WITHOUT adding
// special tokens (apply_chat_template(tokenize=True) passes add_special_tokens=False: the
// template writes any BOS itself).
#pragma once

#include <string>

#include "alpaca/chat/chat_template.h"

namespace alpaca::generate {

// `messages_json`: a JSON array of messages. `special_tokens_json`: the tokenizer's named special
// tokens as transformers passes them to the template (data::template_special_tokens_json).
// `variables_json`: a JSON object of further template variables (tools, chat_template_kwargs:
// data::row_template_variables_json), which win over the special tokens as apply_chat_template's
// kwargs do.
std::string chat_prompt(const chat::ChatTemplate& tmpl, const std::string& messages_json,
                        const std::string& special_tokens_json, const std::string& variables_json = "{}");

}  // namespace alpaca::generate
