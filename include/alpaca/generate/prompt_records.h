// The prompts of `alpaca-train generate --prompts FILE`: Alpaca records (a JSON array or JSON
// Lines) whose every field is kept, so the output line can repeat the record and add the
// generation. Strict like the training loader: errors name the file and the record.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace alpaca::generate {

struct PromptRecord {
  std::string json;      // the record as read, one JSON object (compact)
  std::string prompt;    // the text sent to the model (template applied unless raw); "" for a chat record
  // A chat record's conversation, a JSON array of {"role", "content", ...} messages: a record's own
  // "messages", or (PromptOptions::chat) its instruction as one user message. The chat template
  // renders it with add_generation_prompt (generate::chat_prompt).
  std::optional<std::string> messages;
  // A chat record's template variables beside its messages, a JSON object: the record's `tools` and
  // `chat_template_kwargs` members (data::row_template_variables_json), as training reads them.
  std::string template_variables = "{}";
  std::optional<std::string> expected;  // the --expected_field value, when asked for
};

struct PromptOptions {
  bool raw_prompt = false;     // send "instruction" as is (no template, no "input")
  std::string expected_field;  // "" = none; else every record must have this string field
  bool chat = false;           // Alpaca records become one user message (instruction, "\n\n", input)
};

// Reads `path`. Errors (alpaca::Error): unreadable file, malformed JSON (with line), no records,
// a record that is not an object, neither a "messages" list of {"role": string, ...} objects nor a
// string "instruction", a non-string "input", a missing
// expected field.
std::vector<PromptRecord> load_prompt_records(const std::string& path, const PromptOptions& opts);
std::vector<PromptRecord> parse_prompt_records(const std::string& text, const std::string& name,
                                               const PromptOptions& opts);

// The Alpaca prompt of one instruction (+ input) as in training (data::format_alpaca_prompt).
std::string alpaca_prompt(const std::string& instruction, const std::string& input);

// The user message of an Alpaca record under --chat: the instruction, then its input (if any)
// after a blank line.
std::string chat_user_content(const std::string& instruction, const std::string& input);

// One output line: the record's fields plus "generation", "generation_ids" and, when an expected
// value is known, "exact_match" (generation and expected equal after trimming whitespace).
std::string output_line(const PromptRecord& rec, const std::string& generation, const std::vector<int64_t>& ids,
                        std::optional<bool> exact_match);

// Exact match as the quick start scores it: both sides with surrounding whitespace removed.
bool exact_match(const std::string& generation, const std::string& expected);

}  // namespace alpaca::generate
