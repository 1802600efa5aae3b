// The SentencePiece path against transformers 4.28.1's slow LlamaTokenizer (stanford_alpaca's pin),
// run in its own venv by tests/reference/slow_llama_428_reference.py: train.py's input ids and
// labels for all 5,000 Alpaca records, and an edge-case list built around what 4.28.1 does
// differently from later versions (whitespace beside "[PAD]" written in the text is stripped).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "alpaca/data/alpaca_example.h"
#include "alpaca/tokenizer/tokenizer.h"
#include "tokenizer_parity.h"
#include "tokenizer_test_util.h"

namespace alpaca::tokenizer::test_tokenizer_428 {
namespace {

using namespace test;

const fs::path kFixture = fixture_dir("slow_llama_428");

Tokenizer alpaca_tokenizer() {
  Tokenizer tok = Tokenizer::load((shared_dir() / "data/llama2-tokenizer").string());
  EXPECT_EQ(tok.format(), "sentencepiece");
  EXPECT_EQ(tok.add_missing_special_tokens(), 1);  // train.py: LLaMA-2 lacks only a pad token
  EXPECT_EQ(tok.pad_id(), 32000);
  return tok;
}

TEST(Tokenizer428, EdgeCasesMatchTransformers4281) {
  ALPACA_REQUIRE_SHARED("data/llama2-tokenizer/tokenizer.model");
  ASSERT_TRUE(fs::exists(kFixture / "edge.json")) << "run the fixture first: ctest -R tokenizer_428";
  const json ref = read_json(kFixture / "edge.json");
  Tokenizer tok = alpaca_tokenizer();
  for (size_t i = 0; i < ref["texts"].size(); ++i) {
    const std::string text = ref["texts"][i].get<std::string>();
    const auto want = ref["ids"][i].get<std::vector<int64_t>>();
    EXPECT_EQ(tok.encode(text), want) << json(text).dump();
    EXPECT_EQ(tok.decode(want), ref["decoded"][i].get<std::string>()) << json(text).dump();
  }
}

// The tokenizer files of an output directory, as 4.28.1 reads them back: special_tokens_map.json as
// train.py's save_model writes it (AddedToken objects for bos/eos/unk, the string "[PAD]"), so
// 4.28.1 loading our output encodes as it encodes train.py's (no whitespace stripped before "</s>").
TEST(Tokenizer428, SavedDirectoryReadsBackInTransformers4281AsTrainPysDoes) {
  ALPACA_REQUIRE_SHARED("data/llama2-tokenizer/tokenizer.model");
  ASSERT_TRUE(fs::exists(kFixture / "saved.json")) << "run the fixture first: ctest -R tokenizer_428";
  const json ref = read_json(kFixture / "saved.json");
  const json edge = read_json(kFixture / "edge.json");
  TempDir tmp("tokenizer_428_saved");
  alpaca_tokenizer().save(tmp.path().string());
  EXPECT_EQ(read_json(tmp.path() / "special_tokens_map.json"), ref["special_tokens_map"]);
  Tokenizer back = Tokenizer::load(tmp.path().string());
  for (size_t i = 0; i < edge["texts"].size(); ++i)
    EXPECT_EQ(back.encode(edge["texts"][i].get<std::string>()), ref["ids"][i].get<std::vector<int64_t>>())
        << edge["texts"][i].dump();
}

TEST(Tokenizer428, AlpacaRecordsMatchTrainPyOnTransformers4281) {
  ALPACA_REQUIRE_SHARED("data/alpaca/alpaca_5000.json");
  ALPACA_REQUIRE_SHARED("data/llama2-tokenizer/tokenizer.model");
  ASSERT_TRUE(fs::exists(kFixture / "examples.jsonl")) << "run the fixture first: ctest -R tokenizer_428";
  auto records = load_alpaca_records((shared_dir() / "data/alpaca/alpaca_5000.json").string());
  Tokenizer tok = alpaca_tokenizer();
  auto examples = tokenize_alpaca(records, tok, 512, 0);
  std::ifstream in(kFixture / "examples.jsonl");
  std::string line;
  size_t n = 0, bad = 0;
  for (; std::getline(in, line); ++n) {
    ASSERT_LT(n, examples.size());
    if (!parity::same_example(json::parse(line), examples[n]) && ++bad <= 3) ADD_FAILURE() << "record " << n << " differs";
  }
  EXPECT_EQ(n, records.size());
  EXPECT_EQ(bad, 0u) << bad << " of " << n << " records differ";
}

}  // namespace
}  // namespace alpaca::tokenizer::test_tokenizer_428
