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

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace alpaca::tokenizer::detail {

// How the class's __init__ leaves the post-processor (the BOS/EOS a call with
// add_special_tokens=True adds). from_pretrained drops add_bos_token / add_eos_token from
// tokenizer_config.json whenever a tokenizer.json is present, so only the class's own count.
enum class PostProcessorRule {
  kFile,      // TokenizersBackend's rule: the file's; a file without one gets update_post_processor's
              // template from the class's flags (TokenizersBackend: none, "$A")
  kUpdate,    // update_post_processor always (the class passes add_bos_token / add_eos_token itself)
  kTemplate,  // a fixed "<prefix...> $A <suffix...>" (RobertaProcessing, Whisper's prefix tokens)
};

// How the class's __init__ combines its own extra special tokens (`extra_specials`) with the
// extra_special_tokens / additional_special_tokens kwargs from_pretrained hands it (ConfigExtras):
// when the extra_special_tokens kwarg is there, TokenizersBackend's base __init__ takes it and
// drops whatever list the class passed as additional_special_tokens (kNamed and kBoth excepted).
enum class ExtrasRule {
  kAdditional,           // the additional_special_tokens kwarg, else the class's (TokenizersBackend, Camembert, XLNet, ...)
  kAdditionalThenClass,  // additional + the class's (T5, Lasr, VideoPrism, CodeLlama, MBart50, XGLM)
  kClassThenAdditional,  // the class's + additional (MBart)
  kClassOnly,            // the class's; additional is ignored (Pegasus decides from it itself; Esmc)
  kNamed,                // extra_special_tokens if not None, else additional if not None, else the class's (Nllb)
  kBoth,                 // extra + additional (Luke, MLuke: their own tokens are named_specials)
};

// The extra special-token lists from_pretrained passes the class (tokenization_utils_base.py):
// tokenizer_config.json's additional_special_tokens becomes the extra_special_tokens kwarg unless
// extra_special_tokens is given and non-empty; special_tokens_map.json (read only when the config
// has no added_tokens_decoder) extends extra_special_tokens and replaces additional_special_tokens.
struct ConfigExtras {
  std::optional<std::vector<std::string>> extra, additional;  // nullopt: the kwarg is not passed
  bool extra_null = false;                                    // extra_special_tokens is passed as None
  // tokenizer_config.json's other "*_token" string keys (not the seven roles), in the file's order:
  // from_pretrained makes each a model-specific special token (tokenization_utils_base.py 1846-1854).
  std::vector<std::pair<std::string, std::string>> model_specific;
};

struct TokenizerClassInfo {
  std::string name;      // the class AutoTokenizer instantiates ("TokenizersBackend" = as is)
  bool rebuilt = false;  // the class built normalizer/pre-tokenizer/decoder itself
  // The class's __init__ defaults for roles the tokenizer files do not name ("" = None).
  std::optional<std::string> unk, bos, eos, pad, sep, cls, mask;
  bool mask_lstrip = false;                 // the mask token is AddedToken(lstrip=True)
  // Tokens the class passes as model-specific "*_token" kwargs (Luke's entity tokens, Esmc's chain
  // break): TokenizersBackend adds them right after the roles, before the extra special tokens.
  std::vector<std::string> named_specials;
  // The class's own extra special tokens; after apply_tokenizer_class, the final list (combined
  // with the config's by `extras_rule`) that TokenizersBackend adds after the roles.
  std::vector<std::string> extra_specials;
  ExtrasRule extras_rule = ExtrasRule::kAdditional;
  PostProcessorRule post = PostProcessorRule::kFile;
  bool add_bos = false, add_eos = false;    // update_post_processor's flags (CodeLlama: add_bos)
  // kTemplate: tokens before / after $A; "@cls", "@sep", "@bos", "@eos" name a role ("@cls#0":
  // with that fixed id), anything else is a token looked up by content (the unk id when absent,
  // as convert_tokens_to_ids).
  std::vector<std::string> prefix, suffix;
  bool pair_doubles_suffix = false;         // kTemplate pair: "A sep sep B sep" (RobertaProcessing)
  std::string decode_suffix;                // CLIP: decode() replaces it by " " and strips
  bool ctc_decode = false;                  // Lasr: decode() first merges repeated ids and drops the pad id
};

// The ids the class's decode() hands the backend (LasrTokenizer._decode: CTC grouping, the pad
// id, its blank, dropped); `ids` itself for every other class.
std::vector<int64_t> class_decode_ids(const TokenizerClassInfo& info, const std::vector<int64_t>& ids,
                                      std::optional<int64_t> pad_id);

// The resolved role tokens of a loaded tokenizer ("" = none) and a token -> id lookup.
struct ClassRoles {
  std::string bos, eos, unk, sep, cls;
};

// The post-processor to run, or null to keep the file's: kFile with `file_has_one`. `lookup` maps
// a token to its id.
nlohmann::json class_post_processor(const TokenizerClassInfo& info, bool file_has_one, const ClassRoles& roles,
                                    const std::function<std::optional<int64_t>(const std::string&)>& lookup);

// `config`: tokenizer_config.json (or {}); `model_config`: config.json beside it (or {});
// `extras`: the extra special-token kwargs (config_extras); `file` names the tokenizer.json in errors. Throws alpaca::Error for a class transformers 5
// rebuilds but this reimplementation does not (naming the class, its model type or the missing
// component, the file and the way out).
TokenizerClassInfo apply_tokenizer_class(nlohmann::json& doc, const nlohmann::json& config,
                                         const nlohmann::json& model_config, const ConfigExtras& extras,
                                         const std::string& file);

// The ConfigExtras of a model directory's tokenizer_config.json and special_tokens_map.json (each an
// object, maybe empty); `dir` names them in errors.
ConfigExtras config_extras(const nlohmann::json& config, const nlohmann::json& special_map, const std::string& dir);

// TokenizersBackend.update_post_processor: "<bos>:0 $A:0 <eos>:0" with the flags' tokens (an
// empty string = the flag is off). `ids` are their ids. Used when tokenizer_config.json names
// add_bos_token / add_eos_token, or the file has no post-processor.
nlohmann::json template_post_processor(const std::string& bos, int64_t bos_id,
                                       const std::string& eos, int64_t eos_id);

}  // namespace alpaca::tokenizer::detail
