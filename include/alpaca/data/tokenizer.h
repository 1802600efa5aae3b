// The LLaMA tokenizer: a SentencePiece model plus the Hugging Face special/added tokens that
// live beside it (tokenizer_config.json, special_tokens_map.json, added_tokens.json). Encoding
// reproduces transformers' slow `LlamaTokenizer` (legacy mode, the one stanford_alpaca used):
// the text is first split on the special/added token strings (leftmost-longest match), every
// other chunk is encoded by SentencePiece on its own (each chunk gets SentencePiece's dummy
// "▁" prefix), special strings become their ids, and BOS is prepended (no EOS).
// SentencePiece stays behind a pimpl so no third-party header leaks from here.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace alpaca::data {

// One token that is not (only) a SentencePiece piece: HF's AddedToken.
struct AddedToken {
  std::string content;
  int64_t id = 0;
  bool special = true;
  bool lstrip = false;  // the token eats the whitespace on its left
  bool rstrip = false;  // ... and on its right
};

class Tokenizer {
 public:
  // Loads `dir/tokenizer.model` (+ the HF json files when present) or a bare .model file.
  // Throws alpaca::Error naming the path when the model is missing or unreadable, or a json file
  // is malformed.
  static Tokenizer load(const std::string& dir_or_model_file);
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
  // Text of `ids`; special tokens are dropped when `skip_special` (HF skip_special_tokens).
  // Throws on an id outside [0, vocab_size()).
  std::string decode(const std::vector<int64_t>& ids, bool skip_special = true) const;

  int64_t vocab_size() const;  // SentencePiece pieces + added tokens = HF len(tokenizer)
  int64_t sp_vocab_size() const;
  std::optional<int64_t> pad_id() const;
  int64_t bos_id() const;
  int64_t eos_id() const;
  int64_t unk_id() const;
  std::string bos_token() const;
  std::string eos_token() const;
  std::optional<std::string> pad_token() const;
  const std::vector<AddedToken>& added_tokens() const;
  // Id of `token` when it is a whole SentencePiece piece or an added token.
  std::optional<int64_t> token_to_id(const std::string& token) const;

  // Adds `token` as a special token unless it already exists; returns its id. A new token gets
  // id vocab_size() (HF add_special_tokens: "[PAD]" -> 32000 for LLaMA-2).
  int64_t add_special_token(const std::string& token);
  // Makes `token` the pad token, adding it first when needed.
  void set_pad_token(const std::string& token);
  // Sets model_max_length written to tokenizer_config.json by save().
  void set_model_max_length(int64_t n);

  // Writes tokenizer.model, tokenizer.json (the `tokenizers` form, which transformers 5 loads
  // without protobuf), tokenizer_config.json, special_tokens_map.json and, when there are
  // tokens beyond the SentencePiece vocab, added_tokens.json; transformers' AutoTokenizer loads
  // the directory with the same ids. Creates `dir` if needed.
  void save(const std::string& dir) const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace alpaca::data
