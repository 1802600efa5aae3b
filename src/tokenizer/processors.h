// Private to src/tokenizer: the `tokenizers` crate's post-processors (processors/*.rs) for a
// single sequence: TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel (ids
// unchanged), Sequence.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "json_context.h"

namespace alpaca::tokenizer::detail {

class PostProcessor {
 public:
  // The tokenizer.json "post_processor" object at `where`; an unknown type is an error naming it.
  static PostProcessor parse(const json& j, const JsonContext& ctx, const std::string& where);
  // PostProcessor::process with add_special_tokens on one sequence's ids, in place.
  void apply(std::vector<int64_t>& ids) const;
  // Ids the single template puts before (prepended to *prefix) and after (appended to *suffix)
  // the sequence.
  void affixes(std::vector<int64_t>* prefix, std::vector<int64_t>* suffix) const;

 private:
  struct Node;  // the parsed tree (processors.cpp)
  explicit PostProcessor(std::shared_ptr<const Node> root) : root_(std::move(root)) {}
  std::shared_ptr<const Node> root_;
};

}  // namespace alpaca::tokenizer::detail
