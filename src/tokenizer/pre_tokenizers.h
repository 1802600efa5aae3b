// Private to src/tokenizer: the `tokenizers` crate's pre-tokenizers (pre_tokenizers/*.rs):
// ByteLevel (with and without its regex), Split, Metaspace, Digits, BertPreTokenizer,
// WhitespaceSplit, Whitespace, Punctuation, CharDelimiterSplit, UnicodeScripts, Sequence; and
// what the ByteLevel normalizer and the ByteLevel and Metaspace decoders share with them.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "json_context.h"
#include "pre_tokenized.h"

namespace alpaca::tokenizer::detail {

// ByteLevel's alphabet (bytes_char in byte_level.rs, also the ByteLevel normalizer's): each byte
// as the printable character GPT-2 spells it with, and back.
const std::array<std::string, 256>& byte_to_char();
const std::unordered_map<uint32_t, unsigned char>& char_to_byte();

// Metaspace's prepend_scheme (or the older add_prefix_space), shared by its decoder.
enum class PrependScheme { kAlways, kFirst, kNever };
PrependScheme parse_prepend_scheme(const json& j, const JsonContext& ctx, const std::string& where);

class PreTokenizer {
 public:
  // The tokenizer.json "pre_tokenizer" object at `where`; an unknown type is an error naming it.
  static PreTokenizer parse(const json& j, const JsonContext& ctx, const std::string& where);
  // PreTokenizer::pre_tokenize: splits every piece that is not yet a token, drops empty ones.
  void apply(std::vector<Piece>& pieces) const;

 private:
  struct Node;  // the parsed tree (pre_tokenizers.cpp)
  explicit PreTokenizer(std::shared_ptr<const Node> root) : root_(std::move(root)) {}
  std::shared_ptr<const Node> root_;
};

}  // namespace alpaca::tokenizer::detail
