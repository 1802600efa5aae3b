// Dataset rows of every format (conversation.h) turned into training examples {input_ids, labels}
// with TRL's SFTTrainer semantics (trl 1.16: SFTTrainer._prepare_dataset, SFTConfig):
//
//  - alpaca rows: tokenize_alpaca, unchanged (stanford_alpaca's prompt, its truncation).
//  - messages / sharegpt rows: the chat template rendered with add_generation_prompt=false and the
//    tokenizer's bos_token/eos_token, tokenized WITHOUT added special tokens (apply_chat_template's
//    rule; no EOS is appended: the template writes the turn terminators). Labels are the ids on
//    every token (TRL's default), or with assistant_only_loss only on assistant tokens.
//  - prompt_completion rows, strings: ids of `prompt` and of `prompt + completion + EOS` (EOS
//    appended unless the completion ends with it), each tokenized with the special tokens (BOS when
//    the tokenizer adds one), as TRL's tokenizer(text) call; message lists: the prompt rendered
//    with add_generation_prompt=true, and prompt + completion rendered without. The completion
//    starts where the two id lists diverge (TRL's common_prefix_length); completion_only_loss
//    (default: true for these rows, as TRL's None) masks what comes before.
//
// Assistant tokens: transformers' return_assistant_tokens_mask rule, in bytes: the tokens from the
// one holding a span's first character to the one holding its last character (char_to_token:
// the first token with a byte of that character), so a token straddling either edge counts, and
// the later pieces of a last character split across tokens do not. Spans: the template's
// {% generation %} blocks when it has them, else assistant_char_spans (prefix rendering: content
// and turn terminator, never the role header). A message with "train": false loses its span (and,
// without assistant_only_loss, its span's labels). A row left with no trained token is an error
// naming the row. Tokens are laid back onto the text with Tokenizer::token_bytes; a tokenizer
// whose normalizer rewrites the text cannot be laid back and is an error naming the row.
//
// Truncation to model_max_length keeps the start (TRL's truncation_mode "keep_start"), after the
// labels are made, so a partly kept assistant turn still trains only its content. In addition, so
// that no partial role header is ever trained: when the cut falls outside every assistant span,
// the labels after the end of the last assistant span are dropped (the incomplete trailing turn).
// Rows left with no label by truncation are dropped, as TRL drops them, unless packing: TRL skips
// that filter when it packs, and so do we (MaskOptions::packing; both counted in the stats). A row
// with no label BEFORE truncation is an error either way (the silent-zero bug).
// Packing "wrapped" (packing.h) does not cut conversation rows at all (TRL: packing skips the
// truncation step and "wrapped" keeps every token); MaskOptions::truncate_conversations = false.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "alpaca/data/alpaca_example.h"
#include "alpaca/data/conversation.h"
#include "alpaca/tokenizer/tokenizer.h"

namespace alpaca::chat {
class ChatTemplate;
}

namespace alpaca::data {

struct MaskOptions {
  bool assistant_only_loss = false;          // SFTConfig.assistant_only_loss (default False)
  std::optional<bool> completion_only_loss;  // SFTConfig: None = true for prompt-completion rows
  int64_t model_max_length = 0;              // 0: no truncation
  bool packing = false;                      // keep rows truncation leaves with no label (TRL packing)
  bool truncate_conversations = true;        // false: packing "wrapped" (alpaca rows are cut regardless)
};

// The mask options of a run (train, its pre-flight check, preprocess): TRL's SFTConfig fields, and
// what --packing / --packing_strategy change (above). `packing_strategy` is ignored without packing.
MaskOptions run_mask_options(bool assistant_only_loss, std::optional<bool> completion_only_loss,
                             int64_t model_max_length, bool packing, const std::string& packing_strategy);

struct MaskStats {
  int64_t num_rows = 0;        // rows read
  int64_t num_truncated = 0;   // rows longer than model_max_length
  int64_t num_dropped = 0;     // conversation rows left with no label by truncation (not returned)
  int64_t num_kept_no_label = 0;  // the same rows when packing (returned, as TRL keeps them)
  int64_t num_no_label = 0;    // alpaca rows left with no label (kept, as tokenize_alpaca)
  int64_t num_tokens = 0;      // tokens of the returned examples
  int64_t num_trained = 0;     // of them, tokens with a label
};

// One example of a row that is not alpaca, before truncation unless `opt.model_max_length` > 0.
// `tmpl` may be null for prompt-completion string rows. `truncated` (when given) tells whether the
// row was cut. Throws alpaca::Error naming row.source: a template error (its line), an empty
// mask, text the tokens cannot be laid back onto.
Example conversation_example(const ConversationRow& row, const tokenizer::Tokenizer& tokenizer, const chat::ChatTemplate* tmpl,
                             const MaskOptions& opt, bool* truncated = nullptr);

// Every row in order (alpaca rows through tokenize_alpaca, mixed files work), minus the rows
// truncation leaves without a label. `tmpl` is needed when a row is conversational. Runs
// tokenizer.check_special_tokens() first. `num_threads` <= 0 uses every core.
std::vector<Example> tokenize_rows(const std::vector<ConversationRow>& rows, const tokenizer::Tokenizer& tokenizer,
                                   const chat::ChatTemplate* tmpl, const MaskOptions& opt, int num_threads = 0,
                                   MaskStats* stats = nullptr);

// A dataset as training reads it: load_dataset(paths, format), the chat template when a row needs
// one (chat::ChatTemplate::load(model_dir, chat_template): `chat_template` overrides the model's),
// then tokenize_rows. Used by train (data and eval), its pre-flight check, and preprocess.
std::vector<Example> load_examples(const std::string& paths, const RowFormat& format,
                                   const tokenizer::Tokenizer& tokenizer, const std::filesystem::path& model_dir,
                                   const std::filesystem::path& chat_template, const MaskOptions& opt, int num_threads = 0, MaskStats* stats = nullptr);

// The named special tokens transformers 5 passes to every chat template (apply_chat_template:
// `{**tokenizer.special_tokens_map, **kwargs}`), as a JSON object: bos_token, eos_token, unk_token,
// pad_token from `tokenizer` (so the tokens train adds, as train.py, are seen), and from the
// tokenizer_config.json beside its file (overridden by special_tokens_map.json where the config has
// no added_tokens_decoder, as transformers' legacy path): sep_token, cls_token, mask_token, every other
// string `*_token` key and the named `extra_special_tokens` (model-specific tokens). Roles the
// tokenizer lacks are absent (undefined in the template), as there. Read once per tokenizer file.
std::string template_special_tokens_json(const tokenizer::Tokenizer& tokenizer);

// Whether any row needs the chat template (messages, sharegpt, prompt-completion message lists).
bool needs_chat_template(const std::vector<ConversationRow>& rows);

// "trained N of M tokens (P%) in K examples; T truncated to L tokens, D dropped ...": the log line.
std::string describe_mask_stats(const MaskStats& stats, int64_t model_max_length);

// The byte range [begin, end) of `text` each of `ids` covers (ids = the text's tokens, no special
// tokens added). Whitespace an lstrip/rstrip token swallowed joins that token; a space the
// tokenizer inserted (SentencePiece's prefix "▁") covers nothing. A token that does not spell the
// text (an <unk>, a normalizer's rewrite) holds the text up to where the following tokens spell it
// again (token_ranges.cpp); throws when they never do within 1 KB.
std::vector<std::pair<size_t, size_t>> token_byte_ranges(const tokenizer::Tokenizer& tokenizer, const std::string& text,
                                                         const std::vector<int64_t>& ids);

}  // namespace alpaca::data
