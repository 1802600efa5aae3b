// Private to src/tokenizer: the `tokenizers` crate's decoders (decoders/*.rs): ByteLevel,
// Metaspace, ByteFallback, Fuse, Strip, Replace, BPEDecoder, WordPiece (wordpiece.cpp), Sequence.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "json_context.h"

namespace alpaca::tokenizer::detail {

class Decoder {
 public:
  // The tokenizer.json "decoder" object at `where`; an unknown type is an error naming it.
  static Decoder parse(const json& j, const JsonContext& ctx, const std::string& where);
  // Decoder::decode_chain: the tokens (as the vocabulary spells them) rewritten in place; the
  // caller concatenates the result.
  void decode_chain(std::vector<std::string>& tokens) const;
  // Whether a ByteLevel decoder runs anywhere in the chain (the pieces are byte-level text).
  bool has_byte_level() const;

 private:
  struct Node;  // the parsed tree (decoders.cpp)
  explicit Decoder(std::shared_ptr<const Node> root) : root_(std::move(root)) {}
  std::shared_ptr<const Node> root_;
};

}  // namespace alpaca::tokenizer::detail
