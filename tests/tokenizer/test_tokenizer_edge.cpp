// Tokenizer edge cases against transformers 4.x's slow LlamaTokenizer (legacy and non-legacy),
// from tests/reference/tokenizer_edge_reference.py: special-token strings with and without
// surrounding spaces, "▁" in the text, leading/trailing spaces, empty text, non-ASCII.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "alpaca/tokenizer/tokenizer.h"
#include "test_util.h"

namespace alpaca::tokenizer::test_tokenizer_edge {
namespace {

using ::alpaca::testing::binary_dir;
using ::alpaca::testing::shared_dir;
using ::alpaca::testing::TempDir;

TEST(TokenizerEdge, MatchesSlowLlamaTokenizerLegacyAndNonLegacy) {
  ALPACA_REQUIRE_SHARED("data/llama2-tokenizer/tokenizer.model");
  const auto fixture = binary_dir() / "fixtures/tokenizer_edge/edge_cases.json";
  ASSERT_TRUE(std::filesystem::exists(fixture)) << "run ctest -R tokenizer_edge (the fixture)";
  std::ifstream in(fixture);
  auto ref = nlohmann::json::parse(in);
  TempDir dir("tokenizer_edge");
  for (const char* mode : {"legacy", "non_legacy"}) {
    const bool legacy = std::string(mode) == "legacy";
    auto tdir = dir.path() / mode;
    std::filesystem::create_directories(tdir);
    std::filesystem::copy_file(shared_dir() / "data/llama2-tokenizer/tokenizer.model",
                               tdir / "tokenizer.model");
    std::ofstream(tdir / "tokenizer_config.json")
        << "{\"legacy\": " << (legacy ? "true" : "false") << ", \"bos_token\": \"<s>\", "
        << "\"eos_token\": \"</s>\", \"unk_token\": \"<unk>\", \"pad_token\": null}";
    Tokenizer tok = Tokenizer::load(tdir.string());
    tok.set_pad_token("[PAD]");
    const auto& texts = ref[mode]["texts"];
    const auto& ids = ref[mode]["ids"];
    ASSERT_EQ(texts.size(), ids.size());
    for (size_t i = 0; i < texts.size(); ++i) {
      const std::string text = texts[i].get<std::string>();
      EXPECT_EQ(tok.encode(text), ids[i].get<std::vector<int64_t>>())
          << mode << " text '" << text << "'";
    }
    // The mode survives save/load.
    tok.save((tdir / "saved").string());
    Tokenizer back = Tokenizer::load((tdir / "saved").string());
    for (size_t i = 0; i < texts.size(); ++i)
      EXPECT_EQ(back.encode(texts[i].get<std::string>()), ids[i].get<std::vector<int64_t>>())
          << mode << " after save, text '" << texts[i].get<std::string>() << "'";
  }
}

}  // namespace
}  // namespace alpaca::tokenizer::test_tokenizer_edge
