// Dataset rows in the formats TRL's SFTTrainer detects, each normalised into one plain struct
// that the chat-template engine renders across a JSON-text boundary (no JSON type in this header).
//
//   alpaca             {instruction, input?, output}           -> AlpacaRecord, byte-identical to
//                                                                 load_alpaca_records
//   messages           {messages: [{role, content, ...}], tools?}   (OpenAI / TRL conversational)
//   sharegpt           {conversations: [{from, value}], system?, tools?}  (LLaMA-Factory)
//   prompt_completion  {prompt, completion}: both strings, or both message lists
//   text               {text}: language modelling (--dataset_text_field names another field)
//   tokenized          {input_ids, labels?, completion_mask?, assistant_masks?}: already tokenized
//                      (TRL's "processed" datasets: used as given, no template, no EOS added)
//
// Rows rendered by a chat template may carry `chat_template_kwargs` (an object), whose members join
// the template's variables as TRL passes them to apply_chat_template (e.g. enable_thinking).
//
// The format is chosen per file from its first row's fields (input_ids, then messages,
// conversations, prompt+completion, instruction+output, then the text field, in that order, as TRL
// checks for a processed dataset, then `messages`), unless --dataset_format names one. Files: JSON array or JSON Lines (.json, .jsonl, any other name),
// Parquet (.parquet), Arrow IPC (.arrow), and a `datasets.save_to_disk` directory; several
// comma-separated paths are concatenated in order. Every error names the file and the row.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "alpaca/data/alpaca_record.h"

namespace alpaca::tokenizer {
class Tokenizer;
}

namespace alpaca::data {

enum class DatasetFormat { kAuto, kAlpaca, kMessages, kShareGpt, kPromptCompletion, kText, kTokenized };

// "auto" (or "") / alpaca / messages / sharegpt / prompt_completion / text / tokenized; anything else
// is an error listing the names.
DatasetFormat parse_dataset_format(const std::string& name);
// Whether parse_dataset_format accepts `name` (for the flags' usage checks).
bool is_dataset_format_name(const std::string& name);
const char* dataset_format_name(DatasetFormat format);
// "alpaca, messages, sharegpt, prompt_completion, text, tokenized": for help texts and errors.
const char* dataset_format_names();

// How to read rows: the format (kAuto: detected per file) and the field that holds a language-
// modelling row's text (TRL SFTConfig's dataset_text_field, "text" by default; --dataset_text_field).
// Built from a DatasetFormat alone where the text field is the default.
struct RowFormat {
  DatasetFormat format = DatasetFormat::kAuto;
  std::string text_field = "text";

  RowFormat() = default;
  RowFormat(DatasetFormat f) : format(f) {}  // NOLINT(google-explicit-constructor): the common case
  RowFormat(DatasetFormat f, std::string field) : format(f), text_field(std::move(field)) {}
};
// --dataset_format and --dataset_text_field together; errors name the flag (an empty field too).
RowFormat parse_row_format(const std::string& format_name, const std::string& text_field);

// One dataset row after normalisation.
//  - kAlpaca: `alpaca` only.
//  - kMessages / kShareGpt / kPromptCompletion with message lists: `conversation_json` is the
//    template context `{"messages": [...], "tools": [...], <chat_template_kwargs' members>}`
//    ("tools" only when the row has it),
//    every message {"role", "content"?, other keys in the row's order}: roles are system, user,
//    assistant, tool; ShareGPT roles are mapped (conversation.cpp says how); null members and the
//    per-message "train" key are dropped (its value is in `train_message`). For prompt-completion,
//    messages[0, num_prompt_messages) are the prompt and the rest the completion.
//  - kPromptCompletion with strings: `prompt` and `completion`, `conversation_json` empty.
//  - kText (TRL's language-modelling rows, {"text": ...}, or the field RowFormat::text_field names):
//    the text in `completion`, `prompt` empty: TRL tokenizes text + EOS and trains every token,
//    what an empty prompt gives.
//  - kTokenized: `token_ids` and, when the row has them, `token_labels` (as given) or the masks
//    (0/1 per token) that SFTTrainer folds into the labels: assistant_masks always,
//    completion_mask with completion_only_loss (conversation_example.h).
struct ConversationRow {
  DatasetFormat format = DatasetFormat::kAlpaca;
  std::string source;  // "<file>: row <i>", for errors about this row later (template, mask)
  AlpacaRecord alpaca;
  std::string conversation_json;
  std::vector<char> train_message;  // per message: 0 where the row says "train": false
  int64_t num_prompt_messages = 0;   // prompt-completion message lists only
  std::string prompt, completion;    // prompt-completion strings only
  std::vector<int64_t> token_ids, token_labels;         // tokenized rows only (labels may be absent)
  std::vector<char> completion_mask, assistant_masks;  // tokenized rows only, empty when absent
  // Tokenized rows only: the row's file has a `prompt` and a `completion` column (in some row; a
  // datasets table has the union of its rows' keys). SFTTrainer then takes completion_only_loss
  // None as True, so completion_mask applies (settle_tokenized_columns).
  bool prompt_completion_columns = false;
  unsigned char own_columns = 0;  // tokenized rows only: 1 = this row has `prompt`, 2 = `completion`

  bool is_conversational() const { return !conversation_json.empty(); }
};

// Each --data_path item and its format.
using FileFormats = std::vector<std::pair<std::string, DatasetFormat>>;

struct Dataset {
  std::vector<ConversationRow> rows;  // in file order, files in the order given
  FileFormats files;                  // each path and the format it had

  bool all_alpaca() const;
  std::vector<AlpacaRecord> alpaca_records() const;  // requires all_alpaca()
};

// Loads `paths` (one path or several separated by commas). `format` kAuto detects per file.
// Errors: a missing or unreadable path, a file that is not the format its extension says, rows
// that match no format (listing the fields seen and the formats known), and any bad row.
Dataset load_dataset(const std::string& paths, const RowFormat& format = {});

// The rows of JSON text (an array or JSON Lines) normalised; `name` stands for the file in errors.
std::vector<ConversationRow> parse_dataset_rows(const std::string& text, const std::string& name,
                                                const RowFormat& format = {});

// The chat-template variables a row (one JSON object, as text) brings beside its messages: its
// `tools` and the members of its `chat_template_kwargs`, normalised as for training (nulls absent,
// apply_chat_template's own arguments an error prefixed by `where`), as a JSON object text ("{}"
// when none). For `generate`, whose prompt records and --chat_template_kwargs carry the same.
std::string row_template_variables_json(const std::string& row_json, const std::string& where);

// The paths of a comma-separated --data_path (empty items are an error).
std::vector<std::string> split_data_paths(const std::string& paths);

// Each file of `paths` with its format (`format` when given, else detected from its first row),
// without normalising the rows: for checks before a run writes anything. A file whose first row
// cannot be read gets kAuto; its error comes when load_dataset reads it.
FileFormats peek_dataset_formats(const std::string& paths, const RowFormat& format = {});

// Whose special-token rule a run follows: stanford_alpaca's train.py (add the missing pad [PAD],
// eos, bos, unk and resize the embeddings to len(tokenizer)) when any file of `paths` (and
// `eval_paths`) holds Alpaca records or cannot be read yet; TRL's SFTTrainer (add nothing: pad =
// eos when the tokenizer has none, the embeddings as stored) when every file is conversations or
// prompt-completion rows.
bool follows_train_py_tokens(const std::string& paths, const std::string& eval_paths, const RowFormat& format);

// The special tokens of a run over `paths` (+ `eval_paths`), as train, its pre-check and
// preprocess set them: TRL SFTConfig's --eos_token / --pad_token first (tokens the vocabulary
// already has; a user error naming the flag otherwise), then follows_train_py_tokens' rule
// (Tokenizer::add_missing_special_tokens or use_eos_as_missing_pad).
struct SpecialTokens {
  bool train_py = false;       // train.py's rule applied (Alpaca records)
  int64_t num_new_tokens = 0;  // tokens it added (train.py's num_new_tokens)
};
SpecialTokens prepare_special_tokens(tokenizer::Tokenizer& tok, const std::string& paths, const std::string& eval_paths,
                                     const RowFormat& format, const std::string& eos_token = "",
                                     const std::string& pad_token = "");

}  // namespace alpaca::data
