// Private to src/data: the pieces of row normalisation shared by conversation.cpp (detection,
// OpenAI messages, prompt-completion), sharegpt.cpp and dataset_files.cpp (files -> rows).
#pragma once

#include <initializer_list>
#include <string>

#include "alpaca/data/conversation.h"
#include "dataset_rows.h"

namespace alpaca::data {

inline constexpr const char* kFormatFields =
    "alpaca {instruction, input, output}, messages {messages: [{role, content}]}, "
    "sharegpt {conversations: [{from, value}]}, prompt_completion {prompt, completion}, text {text}, "
    "tokenized {input_ids, labels?}";

// obj[key] unless absent or null.
inline const Row* member(const Row& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

// "<name>: row <index>", the prefix of every row error.
std::string row_where(const std::string& name, int64_t index);

// A normalised message {role, content?, the other keys of `src` in order}, minus the keys in
// `skip`, null members and "train" (whose value goes to *train). Errors (prefixed by `where`): an
// unknown role, a non-string content, a message with no content (an assistant one may have
// tool_calls instead), a non-boolean train.
Row make_message(const std::string& role, const Row* content, const Row& src,
                 std::initializer_list<const char*> skip, const std::string& where, char* train);

// `tools` as a list (a JSON string is parsed), nulls dropped.
Row normalise_tools(const Row& tools, const std::string& where);

// The template variables a conversation row brings beside its messages, added to `ctx`: `tools`
// (normalised), then each member of `chat_template_kwargs` (TRL passes the row's dict to
// apply_chat_template, so it overrides `tools` and the tokenizer's special tokens; e.g.
// {"enable_thinking": false} for Qwen3's template). Null members are absent (a null "tools" takes
// the row's tools away, as TRL's dict merge does); an argument of
// apply_chat_template (messages, add_generation_prompt, chat_template, ...) is an error.
void add_template_variables(const Row& row, Row& ctx, const std::string& where);

ConversationRow sharegpt_row(const Row& row, const std::string& name, int64_t index);

// The format of a file from its first row; an error listing row 0's fields when none matches.
// `text_field`: the field of a language-modelling row (RowFormat::text_field).
DatasetFormat detect_format(const Row& first, const std::string& name, const std::string& text_field);

// Row `index` of file `name` in `format` (its format not kAuto).
ConversationRow normalise_row(const Row& row, const RowFormat& format, const std::string& name,
                              int64_t index);

// Tokenized rows rows[first..] of one file: prompt_completion_columns from the union of the rows'
// own_columns, as datasets gives a file the union of its rows' keys as columns.
void settle_tokenized_columns(std::vector<ConversationRow>& rows, size_t first);

}  // namespace alpaca::data
