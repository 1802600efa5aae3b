// The tokenizer.json components of hand-built tokenizers (the `tokenizers` quicktour's BPE +
// Whitespace and its kin): the Whitespace, Punctuation (each behavior), CharDelimiterSplit and
// UnicodeScripts pre-tokenizers, the WordLevel model, the ByteLevel normalizer and the decoders such
// files carry, token-exact with transformers 5's AutoTokenizer on tokenizers trained on Alpaca
// (fixture: tests/reference/tokenizer_components_reference.py); and UnicodeScripts' script table
// against the library on every code point.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "alpaca/tokenizer/tokenizer.h"
#include "tokenizer_parity.h"
#include "tokenizer_test_util.h"

namespace alpaca::tokenizer::test_tokenizer_components {
namespace {

using namespace test;  // fixture_dir, read_json, json, fs

TEST(TokenizerComponents, EveryCaseMatchesAutoTokenizer) {
  const fs::path dir = fixture_dir("tokenizer_components");
  ALPACA_REQUIRE_TOKENIZER_FIXTURE(dir, "tokenizer_components");
  const json reference = read_json(dir / "reference.json");
  size_t cases = 0, texts = 0, differing = 0;
  for (const auto& [name, c] : reference["cases"].items()) {
    SCOPED_TRACE(name);
    const json ref = read_json(dir / "cases" / (name + ".json"));
    Tokenizer tok = Tokenizer::load(ref["dir"].get<std::string>());
    EXPECT_EQ(tok.vocab_size(), ref["len"].get<int64_t>());
    parity::expect_roles(tok, ref["roles"]);
    const size_t bad = parity::compare_texts(tok, ref);
    EXPECT_EQ(bad, 0u) << bad << " of " << ref["texts"].size() << " texts differ";
    ++cases;
    texts += ref["texts"].size();
    differing += bad;
  }
  EXPECT_EQ(cases, 15u);
  std::cout << "[tokenizer components] " << cases << " tokenizers x (" << reference["edge"] << " edge texts + "
            << reference["records"] << " records): " << texts
            << " texts compared (ids with and without special tokens, both decodes), " << differing << " differ\n";
}

// Every code point, in order and after "a" / "京", through UnicodeScripts: each piece shows as
// "▁" (id 1) and one unk (id 0) per character, so equal ids mean equal cuts.
TEST(TokenizerComponents, UnicodeScriptsCutsLikeTheLibraryOnEveryCodePoint) {
  const fs::path dir = fixture_dir("tokenizer_components");
  ALPACA_REQUIRE_TOKENIZER_FIXTURE(dir, "tokenizer_components");
  const json probe = read_json(dir / "scripts_probe.json");
  const Tokenizer tok = Tokenizer::load(probe["tokenizer"].get<std::string>());
  size_t bad = 0;
  for (size_t i = 0; i < probe["texts"].size(); ++i) {
    const auto want = probe["ids"][i].get<std::vector<int64_t>>();
    const auto got = tok.encode(probe["texts"][i].get<std::string>(), false);
    if (got != want && ++bad <= 3) {
      size_t at = 0;
      while (at < got.size() && at < want.size() && got[at] == want[at]) ++at;
      ADD_FAILURE() << "probe text " << i << " differs from id " << at << " on (ours " << got.size()
                    << " ids, the library's " << want.size() << "); regenerate src/tokenizer/unicode_scripts_table.inc "
                    << "with tests/reference/unicode_scripts_table.py if the pinned tokenizers changed";
    }
  }
  EXPECT_EQ(bad, 0u) << bad << " of " << probe["texts"].size() << " probe texts differ";
  std::cout << "[tokenizer components] UnicodeScripts: " << probe["texts"].size()
            << " probe texts (every code point, alone and after a Latin and a Han letter), " << bad << " differ\n";
}

}  // namespace
}  // namespace alpaca::tokenizer::test_tokenizer_components
