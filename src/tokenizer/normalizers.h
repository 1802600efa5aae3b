// Private to src/tokenizer: the `tokenizers` crate's normalizers (normalizers/*.rs): Sequence,
// Prepend, Replace, NFC, NFKC, NFD, NFKD, Lowercase, Strip, StripAccents, BertNormalizer,
// Precompiled (precompiled.h) and ByteLevel (the pre-tokenizer's byte alphabet, pre_tokenizers.h). Unicode tables come from utf8proc, inside normalizers.cpp.
#pragma once

#include <memory>
#include <string>

#include "json_context.h"

namespace alpaca::tokenizer::detail {

class Normalizer {
 public:
  // The tokenizer.json "normalizer" object at `where`; an unknown type is an error naming it.
  static Normalizer parse(const json& j, const JsonContext& ctx, const std::string& where);
  // Normalizer::normalize_str on `s`, in place.
  void normalize(std::string& s) const;

 private:
  struct Node;  // the parsed tree (normalizers.cpp)
  explicit Normalizer(std::shared_ptr<const Node> root) : root_(std::move(root)) {}
  std::shared_ptr<const Node> root_;
};

}  // namespace alpaca::tokenizer::detail
