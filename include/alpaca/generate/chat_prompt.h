// `generate --chat`: a conversation rendered by the model's chat template the way transformers'
// apply_chat_template(messages, add_generation_prompt=True) renders it, so a fine-tuned instruct
// model is asked in the format it was trained on. The text is then tokenized WITHOUT adding
// special tokens (apply_chat_template(tokenize=True) passes add_special_tokens=False: the
// template writes any BOS itself).
#pragma once

#include <string>

#include "alpaca/chat/chat_template.h"

namespace alpaca::generate {

// `messages_json`: a JSON array of messages. bos_token/eos_token: the tokenizer's, as
// transformers passes its special tokens to the template ("" when the tokenizer has none).
std::string chat_prompt(const chat::ChatTemplate& tmpl, const std::string& messages_json,
                        const std::string& bos_token, const std::string& eos_token);

}  // namespace alpaca::generate
