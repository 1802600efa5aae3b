// Private to src/tokenizer: a Hugging Face `tokenizer.json` (the `tokenizers` library's format)
// read and run with the library's semantics. Each component lives in the file named after the
// crate's module:
//   model          BPE (bpe.cpp: merge ranks, byte_fallback, ignore_merges, unk_token, fuse_unk,
//                  continuing_subword_prefix, end_of_word_suffix), Unigram (unigram.cpp: Viterbi,
//                  unk_id, byte_fallback), WordPiece (wordpiece.cpp), WordLevel (wordlevel.cpp);
//                  see tokenizer_model.h
//   normalizer     normalizers.h: Sequence, Prepend, Replace, NFC, NFKC, NFD, NFKD, Lowercase,
//                  Strip, StripAccents, BertNormalizer, Precompiled (precompiled.h), ByteLevel
//   pre_tokenizer  pre_tokenizers.h: ByteLevel (with and without its regex), Split, Metaspace,
//                  Digits, BertPreTokenizer, WhitespaceSplit, Whitespace, Punctuation,
//                  CharDelimiterSplit, UnicodeScripts (unicode_scripts.h), Sequence
//   post_processor processors.h: TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel,
//                  Sequence
//   decoder        decoders.h: ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace,
//                  BPEDecoder, WordPiece, Sequence
//   added_tokens   added_vocabulary.h: special, normalized, lstrip, rstrip, single_word
// Anything else is an error naming the component and the file. Regexes run on PCRE2 (UTF + UCP,
// regex.cpp), Unicode normalization on utf8proc (normalizers.cpp, utf8.cpp); neither header
// leaves those files.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "alpaca/tokenizer/tokenizer.h"

namespace alpaca::tokenizer::detail {

class HfTokenizer {
 public:
  // Parses `path` (a tokenizer.json). Errors name the file and the component.
  static std::unique_ptr<HfTokenizer> load(const std::string& path);
  // Parses tokenizer.json text; `source` names it in errors.
  static std::unique_ptr<HfTokenizer> from_json_string(const std::string& text,
                                                       const std::string& source);
  // Builds from a parsed document (one apply_tokenizer_class() may have rewritten).
  static std::unique_ptr<HfTokenizer> from_json(nlohmann::json doc, const std::string& source);
  ~HfTokenizer();
  std::unique_ptr<HfTokenizer> clone() const;

  // `tokenizer.encode(text, add_special_tokens=...).ids`. Thread-safe.
  std::vector<int64_t> encode(const std::string& text, bool add_special_tokens) const;
  // `tokenizer.decode(ids, skip_special_tokens=...)`. Throws on an unknown id.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special) const;
  // The text bytes one token stands for (Tokenizer::token_bytes). Throws on an unknown id.
  std::string token_bytes(int64_t id) const;

  int64_t size() const;  // len(tokenizer): one past the largest id
  int64_t model_size() const;  // the model's vocabulary (one past its largest id)
  const char* model_type() const;  // "BPE", "Unigram", "WordPiece", "WordLevel"
  std::optional<int64_t> token_to_id(const std::string& token) const;
  std::optional<std::string> id_to_token(int64_t id) const;
  bool is_special(int64_t id) const;
  const std::vector<AddedToken>& added_tokens() const;  // in id order
  // `add_tokens([AddedToken(content, special=special, normalized=!special, lstrip=lstrip)])`: an
  // existing token keeps its id (and becomes special when asked; with `replace_flags` it takes these
  // flags, as the crate does for a token given twice in one add_tokens call); a new one gets size().
  // Returns the id.
  int64_t add_token(const std::string& content, bool special, bool lstrip = false, bool replace_flags = false);
  // Ids the post-processor puts before / after a single sequence (TemplateProcessing).
  std::vector<int64_t> template_prefix() const;
  std::vector<int64_t> template_suffix() const;

  // Replaces the post-processor (transformers' update_post_processor); to_json() writes it.
  void set_post_processor(const nlohmann::json& processor);
  const std::string& source() const;  // the file it was read from
  const nlohmann::json& document() const;  // the document as run (to_json() less added_tokens)

  // The tokenizer.json text: the document it was read from with `added_tokens` brought up to date.
  std::string to_json() const;

 private:
  struct Impl;
  explicit HfTokenizer(std::unique_ptr<Impl> impl);
  std::string compute_token_bytes(int64_t id) const;  // token_bytes without the table
  std::unique_ptr<Impl> impl_;
};

}  // namespace alpaca::tokenizer::detail
