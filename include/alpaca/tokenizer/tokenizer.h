// The tokenizer of a Hugging Face model directory, in one of two formats:
//  - SentencePiece `tokenizer.model` plus the HF special/added tokens beside it
//    (tokenizer_config.json, special_tokens_map.json, added_tokens.json). Encoding reproduces
//    transformers 4.28.1's slow `LlamaTokenizer` (the version stanford_alpaca pins and ran; legacy
//    mode): the text is split on the special/added token strings (leftmost-longest), every other
//    chunk is encoded by SentencePiece on its own (each chunk gets the dummy "▁" prefix), special
//    strings become their ids, and BOS is prepended (no EOS).
//  - Hugging Face `tokenizer.json` (the `tokenizers` library's format: LLaMA-3, SmolLM, Mistral,
//    and LLaMA-2 as transformers 4.x/5 save it), encoded with that library's semantics, as
//    transformers 5's AutoTokenizer does (src/tokenizer/hf_tokenizer.h lists the components), including
//    its class rule: a tokenizer_class such as LlamaTokenizer rebuilds the pipeline from the class
//    and keeps only vocab, merges and added tokens from the file (src/tokenizer/tokenizer_class.h).
// Which one `load` uses: tokenizer.model when present (stanford_alpaca's use_fast=False), else
// tokenizer.json; `use_fast` (HF's --use_fast_tokenizer) picks tokenizer.json when both exist.
// SentencePiece, PCRE2 and utf8proc stay behind the pimpl so no third-party header leaks from here.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace alpaca::tokenizer {

// One token that is not (only) a SentencePiece piece: HF's AddedToken.
struct AddedToken {
  std::string content;
  int64_t id = 0;
  bool special = true;
  bool lstrip = false;  // the token eats the whitespace on its left
  bool rstrip = false;  // ... and on its right
  bool single_word = false;  // tokenizer.json: matches only as a whole word
  bool normalized = false;   // tokenizer.json: matched after the normalizer ran
};

class Tokenizer {
 public:
  // Loads a model directory (format chosen as above; + the HF json files when present), a bare
  // tokenizer.model or a bare tokenizer.json. Throws alpaca::Error naming the path when no
  // tokenizer is there, a file is unreadable or malformed, or a tokenizer.json component is not
  // supported.
  static Tokenizer load(const std::string& dir_or_file, bool use_fast = false);
  // Wraps serialized SentencePiece model bytes (no HF files): bos/eos/unk from the model.
  static Tokenizer from_serialized_model(const std::string& model_bytes);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  Tokenizer(const Tokenizer&);
  Tokenizer& operator=(const Tokenizer&);
  ~Tokenizer();

  // Token ids of `text`; `add_special_tokens` prepends BOS (and appends EOS only when the
  // tokenizer_config says add_eos_token: true) exactly like HF's add_special_tokens=True.
  // Thread-safe (const, SentencePiece encoding is reentrant).
  std::vector<int64_t> encode(const std::string& text, bool add_special_tokens = true) const;
  // HF `tokenizer(text, max_length=max_length, truncation=True)`: the text's own ids are cut on
  // the right so that they and the special tokens (BOS, a template's suffix) fit in max_length.
  // `truncated` (when given) tells whether anything was cut.
  std::vector<int64_t> encode_truncated(const std::string& text, int64_t max_length,
                                        bool* truncated = nullptr) const;
  // Text of `ids`; special tokens are dropped when `skip_special` (HF skip_special_tokens).
  // Throws on an id outside [0, vocab_size()).
  std::string decode(const std::vector<int64_t>& ids, bool skip_special = true) const;

  // The bytes of text that token `id` stands for, so tokens can be laid back onto the text they
  // came from (loss masks by byte span, conversation_example.h): an added token's content; a
  // byte-level piece (GPT-2 style "Ġ...") mapped back to its bytes; a byte-fallback piece <0xNN>
  // as that byte; "▁" as a space. Throws on an id outside [0, vocab_size()).
  std::string token_bytes(int64_t id) const;

  int64_t vocab_size() const;  // model vocabulary + added tokens = HF len(tokenizer)
  int64_t sp_vocab_size() const;  // the model's own vocabulary (SentencePiece pieces / BPE vocab)
  // "sentencepiece" (tokenizer.model) or "tokenizer.json".
  std::string format() const;
  std::optional<int64_t> pad_id() const;
  // The role's id; throws naming the role when the tokenizer has none (a tokenizer.json may
  // lack some until add_missing_special_tokens()).
  int64_t bos_id() const;
  int64_t eos_id() const;
  int64_t unk_id() const;
  std::string bos_token() const;
  std::string eos_token() const;
  std::optional<std::string> pad_token() const;
  std::optional<std::string> unk_token() const;
  const std::vector<AddedToken>& added_tokens() const;
  // Id of `token` when it is a whole SentencePiece piece or an added token.
  std::optional<int64_t> token_to_id(const std::string& token) const;

  // The file the tokenizer runs from (tokenizer.json or tokenizer.model; "(in memory)" for
  // from_serialized_model) and, for tokenizer.json, the class transformers 5 builds it as
  // ("LlamaTokenizer", ... or "TokenizersBackend" when the file's pipeline is used as is).
  std::string source() const;
  std::string tokenizer_class() const;
  // The self-check every run and `preprocess` make before tokenizing data: the EOS train.py
  // appends to each target, and the BOS and PAD, each alone and after/before text, must come
  // out as exactly their own id. Throws alpaca::Error naming the token, the ids it became and
  // the tokenizer file otherwise (a split EOS means the model never learns to stop).
  void check_special_tokens() const;
  // "id 'piece'" for each of `ids` (the pieces as the vocabulary spells them), for messages.
  std::string describe_ids(const std::vector<int64_t>& ids) const;

  // Adds `token` as a special token unless it already exists; returns its id. A new token gets
  // id vocab_size() (HF add_special_tokens: "[PAD]" -> 32000 for LLaMA-2).
  int64_t add_special_token(const std::string& token);
  // Makes `token` the pad token, adding it first when needed.
  void set_pad_token(const std::string& token);
  // Makes `token`, which must already be in the vocabulary, the eos token (TRL SFTConfig's
  // eos_token: `tokenizer.eos_token = token`); an error naming the token and file otherwise.
  void set_eos_token(const std::string& token);
  // stanford_alpaca train.py's special-token rule: each missing role gets its default token
  // (pad "[PAD]", eos "</s>", bos "<s>", unk "<unk>", in that order), added as special tokens as
  // `tokenizer.add_special_tokens(dict)` does. Returns how many tokens are new to the vocabulary
  // (train.py's num_new_tokens: those embedding rows are mean-initialised).
  int64_t add_missing_special_tokens();
  // TRL SFTTrainer's rule instead (conversation and prompt-completion data): nothing is added; a
  // tokenizer without a pad token pads with its eos. Returns 0 (no new vocabulary rows); throws
  // naming the tokenizer when it has no eos either.
  int64_t use_eos_as_missing_pad();
  // Sets model_max_length written to tokenizer_config.json by save().
  void set_model_max_length(int64_t n);

  // Writes the tokenizer in the format it was loaded from, plus the added tokens; transformers'
  // AutoTokenizer loads the directory with the same ids. Creates `dir` if needed.
  //  - SentencePiece: tokenizer.model, tokenizer.json (the `tokenizers` form, which transformers 5
  //    loads without protobuf), tokenizer_config.json, special_tokens_map.json and, when there are
  //    tokens beyond the SentencePiece vocab, added_tokens.json.
  //  - tokenizer.json: tokenizer.json (as read, added tokens brought up to date),
  //    tokenizer_config.json (as read, roles and added_tokens_decoder updated) and
  //    special_tokens_map.json.
  void save(const std::string& dir) const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace alpaca::tokenizer
