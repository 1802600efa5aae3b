// Tokenizer::check_special_tokens: train.py appends the EOS *string* to every target and the
// tokenizer must turn it back into the EOS id. When it does not (a tokenizer.json whose
// normalizer rewrites the text but whose special tokens were matched in normalized form, as
// transformers 4.28.1 wrote LLaMA-2's), every example ends in ordinary pieces, the model never
// sees EOS and never learns to stop, and nothing else fails. So the run stops here instead.
#include <nlohmann/json.hpp>

#include "alpaca/tokenizer/tokenizer.h"
#include "alpaca/util/error.h"

namespace alpaca::tokenizer {
namespace {

void check_one(const Tokenizer& tok, const char* role, const std::string& token, int64_t id) {
  // Alone, after text (where train.py puts EOS) and before text.
  const std::vector<std::pair<std::string, std::string>> contexts = {
      {"", ""}, {"Hello world.", ""}, {"", "Hello"}};
  for (const auto& [before, after] : contexts) {
    const std::string text = before + token + after;
    const std::vector<int64_t> ids = tok.encode(text, /*add_special_tokens=*/false);
    bool ok = !ids.empty();
    if (before.empty() && after.empty()) ok = ids == std::vector<int64_t>{id};
    if (ok && before.empty()) ok = ids.front() == id;
    if (ok && after.empty()) ok = ids.back() == id;
    ALPACA_CHECK(ok, "tokenizer self-check failed: the " << role << " token " << nlohmann::json(token).dump()
                         << " (id " << id << ") in the text " << nlohmann::json(text).dump()
                         << " tokenizes to [" << tok.describe_ids(ids) << "] instead of its id, with "
                         << tok.source()
                         << (tok.tokenizer_class().empty() ? "" : " (tokenizer_class " + tok.tokenizer_class() + ")")
                         << "; training on this would never teach the model to stop. Use the checkpoint's "
                            "tokenizer files as transformers 5 saves them, or fix the token's \"normalized\" "
                            "flag / the normalizer in that file");
  }
}

}  // namespace

void Tokenizer::check_special_tokens() const {
  if (!eos_token().empty() && token_to_id(eos_token())) check_one(*this, "eos", eos_token(), eos_id());
  if (!bos_token().empty() && token_to_id(bos_token())) check_one(*this, "bos", bos_token(), bos_id());
  if (pad_token() && !pad_token()->empty() && pad_id()) check_one(*this, "pad", *pad_token(), *pad_id());
}

}  // namespace alpaca::tokenizer
