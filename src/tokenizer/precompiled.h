// Private to src/tokenizer: the `tokenizers` crate's Precompiled normalizer (normalizers/precompiled.rs
// over the spm_precompiled crate): SentencePiece's precompiled_charsmap, a darts-clone double-array
// trie over UTF-8 byte strings whose leaves index NUL-terminated replacements in a blob.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace alpaca::tokenizer::detail {

class Precompiled {
 public:
  // `base64`: the tokenizer.json field "precompiled_charsmap"; `where` names it in errors.
  Precompiled(const std::string& base64, const std::string& where);
  // Precompiled::normalize: each extended grapheme cluster shorter than 6 bytes that the trie
  // maps (its shortest mapped prefix) is replaced whole; otherwise each character on its own.
  std::string normalize(const std::string& s) const;

 private:
  // Offset of the replacement of the shortest mapped prefix of s[begin, end), or -1.
  int64_t lookup(const std::string& s, size_t begin, size_t end) const;
  void append(std::string* out, int64_t at) const;

  std::string where_;
  std::vector<uint32_t> trie_;
  std::string normalized_;
};

}  // namespace alpaca::tokenizer::detail
