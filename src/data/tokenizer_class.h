// Private to src/data: transformers 5's AutoTokenizer does not run every tokenizer.json as the
// `tokenizers` library would. For a `tokenizer_class` whose Python class defines its own
// `__init__` (LlamaTokenizer, GPT2Tokenizer, Qwen2Tokenizer, ...) it builds the normalizer,
// pre-tokenizer, decoder and BPE flags from the class and takes only the vocabulary, merges,
// added tokens and post-processor from the file (TokenizersBackend.convert_to_native_format).
// Classes that take the file as is: TokenizersBackend, PreTrainedTokenizerFast and any name
// transformers does not know. A LLaMA-2 tokenizer.json written by transformers 4.28.1 carries a
// Prepend/Replace normalizer and `"normalized": true` special tokens; run as is, the `</s>`
// train.py appends splits into three pieces, while AutoTokenizer gives id 2.
//
// apply_tokenizer_class() rewrites a parsed tokenizer.json into the document AutoTokenizer's
// class would have built, so detail::HfTokenizer runs (and save() writes) exactly that pipeline.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace alpaca::data::detail {

struct TokenizerClassInfo {
  std::string name;      // the class AutoTokenizer instantiates ("TokenizersBackend" = as is)
  bool rebuilt = false;  // the class built normalizer/pre-tokenizer/decoder itself
  // The class's __init__ defaults for roles the tokenizer files do not name.
  std::optional<std::string> unk, bos, eos, pad;
};

// `config`: tokenizer_config.json (or {}); `model_config`: config.json beside it (or {});
// `file` names the tokenizer.json in errors. Throws alpaca::Error for a class transformers 5
// rebuilds but this reimplementation does not (naming the class, the file and the way out).
TokenizerClassInfo apply_tokenizer_class(nlohmann::json& doc, const nlohmann::json& config,
                                         const nlohmann::json& model_config,
                                         const std::string& file);

// TokenizersBackend.update_post_processor: "<bos>:0 $A:0 <eos>:0" with the flags' tokens (an
// empty string = the flag is off). `ids` are their ids. Used when tokenizer_config.json names
// add_bos_token / add_eos_token, or the file has no post-processor.
nlohmann::json template_post_processor(const std::string& bos, int64_t bos_id,
                                       const std::string& eos, int64_t eos_id);

}  // namespace alpaca::data::detail
