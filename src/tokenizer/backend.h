// Private to src/tokenizer: the one interface behind the Tokenizer facade. Two implementations:
//   - SentencePiece (sentencepiece_backend.cpp): tokenizer.model plus the HF added tokens, encoded
//     as transformers 4.28.1's slow LlamaTokenizer;
//   - tokenizer.json (tokenizers_backend.cpp): detail::HfTokenizer as transformers 5's
//     TokenizersBackend (and the class it is built as, tokenizer_class.h) runs it.
// The facade (tokenizer.cpp) reads the HF json files beside the model (tokenizer_config.json,
// special_tokens_map.json, added_tokens.json) the same way for both and hands each backend what
// it found through this interface; the shared types (AddedToken, the role tokens) live here and in
// the public header, below the facade.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "alpaca/tokenizer/tokenizer.h"
#include "tokenizer_class.h"

namespace alpaca::tokenizer::detail {

// The special-token roles of a tokenizer, as strings ("" = none). pad is optional apart: train.py
// tells "no pad token" (None) from any string.
struct SpecialTokens {
  std::string bos, eos, unk;
  std::optional<std::string> pad;
  std::string sep, cls, mask;  // tokenizer.json classes only (BERT-like roles)
};

class Backend {
 public:
  virtual ~Backend() = default;
  // A deep copy (each backend owns its model state).
  virtual std::unique_ptr<Backend> clone() const = 0;

  SpecialTokens roles;         // set by the backend's defaults, then by the facade from the HF files
  int64_t model_max_length = 0;  // 0 = not set; save() writes it
  std::string source = "(in memory)";  // the file encoding runs from

  virtual const char* format() const = 0;  // "sentencepiece" or "tokenizer.json"
  // The tokenizer.json class transformers 5 builds ("" for SentencePiece).
  virtual std::string tokenizer_class() const { return ""; }
  // Whether an explicit null role in the HF files clears the role (tokenizer.json: a None kwarg
  // does; 4.28.1's slow tokenizer keeps the model's token) and whether the sep/cls/mask roles
  // count.
  virtual bool json_roles() const { return false; }

  // tokenizer_config.json (an object, maybe empty) of a model directory, after its tokens and
  // roles were read: the backend's flags (SentencePiece: add_bos_token, add_eos_token, legacy,
  // model_max_length; tokenizer.json: kept to be written back). `dir` names the file in errors.
  virtual void configure(const nlohmann::json& config, const std::filesystem::path& dir) = 0;
  // Registers `content` as a no-split token (HF _add_tokens): an existing one keeps its id (and
  // `id`, when given, must agree); lstrip/rstrip: the slow tokenizer's whitespace eating.
  int64_t add(const std::string& content, bool special, std::optional<int64_t> id = std::nullopt,
              bool lstrip = false, bool rstrip = false) {
    return add_token(content, special, id, lstrip, rstrip);
  }
  // A token given as a plain string (train.py's "[PAD]", added_tokens.json, a string in
  // additional_special_tokens): transformers 4.28.1's slow tokenizer strips the whitespace on both
  // sides of such a token in the text (only AddedToken objects keep their own lstrip/rstrip).
  int64_t add_plain(const std::string& content, bool special, std::optional<int64_t> id = std::nullopt) {
    return add(content, special, id, /*lstrip=*/true, /*rstrip=*/true);
  }
  // HF marks the role tokens as no-split special tokens, so their strings in the text become ids.
  virtual void register_special_tokens() = 0;
  // After a model directory is read: the post-processor the class leaves (tokenizer.json only).
  virtual void update_post_processor() {}

  virtual std::vector<int64_t> encode(const std::string& text, bool add_special_tokens) const = 0;
  // Ids encode(text, true) puts before and after the text's own ids.
  virtual void affixes(std::vector<int64_t>* prefix, std::vector<int64_t>* suffix) const = 0;
  virtual std::string decode(const std::vector<int64_t>& ids, bool skip_special) const = 0;
  virtual std::string token_bytes(int64_t id) const = 0;

  virtual int64_t size() const = 0;        // model vocabulary + added tokens
  virtual int64_t model_size() const = 0;  // the model's own vocabulary
  virtual std::optional<int64_t> lookup(const std::string& token) const = 0;
  // The token as the vocabulary spells it (describe_ids), nullopt for an unknown id.
  virtual std::optional<std::string> id_to_piece(int64_t id) const = 0;
  virtual const std::vector<AddedToken>& added_tokens() const = 0;
  // The id of role token `token` ("bos", ...); throws naming the role when there is none.
  int64_t role_id(const std::string& token, const char* role) const;

  // Writes the tokenizer files into `dir` (which exists); see Tokenizer::save.
  virtual void save(const std::filesystem::path& dir) const = 0;

 protected:
  // For clone(): the state every backend carries (roles, model_max_length, source) onto `copy`.
  void copy_common_state_to(Backend& copy) const {
    copy.roles = roles;
    copy.model_max_length = model_max_length;
    copy.source = source;
  }
  // add() without its defaults (a default argument of a virtual function would be the caller's).
  virtual int64_t add_token(const std::string& content, bool special, std::optional<int64_t> id, bool lstrip,
                            bool rstrip) = 0;
};

// `model_bytes`: a serialized SentencePiece ModelProto; `where` names it in errors. Roles come
// from the model's bos/eos/unk/pad pieces.
std::unique_ptr<Backend> make_sentencepiece_backend(const std::string& model_bytes, const std::string& where);
// A parsed tokenizer.json (already rewritten by apply_tokenizer_class when `cls` names a class);
// `file` is its path.
std::unique_ptr<Backend> make_tokenizers_backend(nlohmann::json doc, const std::string& file,
                                                 const TokenizerClassInfo& cls);

// Writes `text` to `path` whole, or throws naming the file (a full disk shows up at close).
void write_text_file(const std::filesystem::path& path, const std::string& text);

}  // namespace alpaca::tokenizer::detail
