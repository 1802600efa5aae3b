// Tokenizer on the real LLaMA-2 SentencePiece model: slow-LlamaTokenizer encoding (BOS, special
// strings split out), the [PAD] addition, and save/load round trips.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "alpaca/tokenizer/tokenizer.h"
#include "alpaca/util/error.h"
#include "test_util.h"

namespace alpaca::tokenizer::test_tokenizer {
namespace {

using ::alpaca::testing::shared_dir;
using ::alpaca::testing::TempDir;

std::string llama2_model() {
  return (shared_dir() / "data/llama2-tokenizer/tokenizer.model").string();
}

TEST(Tokenizer, EncodesLikeSlowLlamaTokenizer) {
  ALPACA_REQUIRE_SHARED("data/llama2-tokenizer/tokenizer.model");
  Tokenizer tok = Tokenizer::load(llama2_model());
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.unk_id(), 0);
  EXPECT_FALSE(tok.pad_id().has_value());
  EXPECT_EQ(tok.vocab_size(), 32000);
  // Expected ids from python sentencepiece on the same model.
  EXPECT_EQ(tok.encode("Hello world"), (std::vector<int64_t>{1, 15043, 3186}));
  EXPECT_EQ(tok.encode("Hello world", false), (std::vector<int64_t>{15043, 3186}));
  // A special-token string inside the text becomes its id; each side is encoded on its own.
  EXPECT_EQ(tok.encode("Hello</s>"), (std::vector<int64_t>{1, 15043, 2}));
  EXPECT_EQ(tok.encode("a <s>b"), (std::vector<int64_t>{1, 263, 29871, 1, 289}));
  EXPECT_EQ(tok.encode(""), (std::vector<int64_t>{1}));
  EXPECT_EQ(tok.decode({1, 15043, 3186, 2}), "Hello world");
  // An id past the vocabulary (a model's padded embedding rows, which generation can pick) decodes as
  // nothing, as transformers decodes it; a negative id is no token.
  EXPECT_EQ(tok.decode({32000}), "");
  EXPECT_EQ(tok.decode({15043, 32000, 3186}), tok.decode({15043, 3186}));
  EXPECT_EQ(tok.token_bytes(32000), "");
  EXPECT_THROW(tok.decode({-1}), Error);
}

TEST(Tokenizer, AddsPadAndSavesForTransformers) {
  ALPACA_REQUIRE_SHARED("data/llama2-tokenizer/tokenizer.model");
  Tokenizer tok = Tokenizer::load(llama2_model());
  tok.set_pad_token("[PAD]");
  EXPECT_EQ(tok.pad_id(), 32000);
  EXPECT_EQ(tok.vocab_size(), 32001);
  EXPECT_EQ(tok.add_special_token("[PAD]"), 32000);  // already there: same id
  EXPECT_EQ(tok.add_special_token("</s>"), 2);        // an existing piece keeps its id
  EXPECT_EQ(tok.encode("x[PAD]"), (std::vector<int64_t>{1, 921, 32000}));

  TempDir dir("tokenizer_save");
  tok.set_model_max_length(512);
  tok.save(dir.path().string());
  for (const char* f : {"tokenizer.model", "tokenizer.json", "tokenizer_config.json",
                        "special_tokens_map.json",
                        "added_tokens.json"})
    EXPECT_TRUE(std::filesystem::exists(dir.path() / f)) << f;

  Tokenizer back = Tokenizer::load(dir.path().string());
  EXPECT_EQ(back.pad_id(), 32000);
  EXPECT_EQ(back.vocab_size(), 32001);
  const std::string text = "Below is an instruction.\n\n### Response:Sure[PAD] thing</s>";
  EXPECT_EQ(back.encode(text), tok.encode(text));

  // transformers (v5: AutoTokenizer gives the tokenizers-backed LlamaTokenizer) loads the saved
  // directory with the same ids and the same pad token.
  std::string script = dir.path().string() + "/check.py";
  {
    std::ofstream py(script);
    py << "import sys, json\n"
          "from transformers import AutoTokenizer\n"
          "t = AutoTokenizer.from_pretrained(sys.argv[1])\n"
          "texts = ['Hello world', 'Below is an instruction.\\n\\n### Response:Sure thing</s>',"
          " 'x[PAD]']\n"
          "print(json.dumps({'pad': t.pad_token_id, 'len': len(t), "
          "'ids': [t(s)['input_ids'] for s in texts]}))\n";
  }
  std::string out;
  int rc = ::alpaca::testing::run_command(
      ::alpaca::testing::python() + " " + script + " " + dir.path().string() + " 2>/dev/null",
      &out);
  ASSERT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out.substr(out.find('{')));
  EXPECT_EQ(j["pad"].get<int64_t>(), 32000);
  EXPECT_EQ(j["len"].get<int64_t>(), 32001);
  EXPECT_EQ(j["ids"][0].get<std::vector<int64_t>>(), tok.encode("Hello world"));
  EXPECT_EQ(j["ids"][1].get<std::vector<int64_t>>(),
            tok.encode("Below is an instruction.\n\n### Response:Sure thing</s>"));
  EXPECT_EQ(j["ids"][2].get<std::vector<int64_t>>(), tok.encode("x[PAD]"));
}

TEST(Tokenizer, ReadsHfSpecialTokenFiles) {
  ALPACA_REQUIRE_SHARED("data/llama2-tokenizer/tokenizer.model");
  TempDir dir("tokenizer_hf");
  std::filesystem::copy_file(llama2_model(), dir.path() / "tokenizer.model");
  {
    std::ofstream(dir.path() / "tokenizer_config.json")
        << R"({"add_bos_token": true, "add_eos_token": true,
               "bos_token": {"__type": "AddedToken", "content": "<s>"},
               "eos_token": "</s>", "unk_token": "<unk>", "pad_token": null,
               "added_tokens_decoder": {"32000": {"content": "<sep>", "special": true}}})";
    std::ofstream(dir.path() / "special_tokens_map.json") << R"({"pad_token": "<unk>"})";
  }
  Tokenizer tok = Tokenizer::load(dir.path().string());
  EXPECT_EQ(tok.pad_id(), 0);  // special_tokens_map.json names <unk> as pad
  EXPECT_EQ(tok.vocab_size(), 32001);
  EXPECT_EQ(tok.encode("x<sep>x"), (std::vector<int64_t>{1, 921, 32000, 921, 2}));
  EXPECT_EQ(tok.decode({1, 921, 32000, 921, 2}, true), "x x");
  EXPECT_EQ(tok.decode({921, 32000, 921}, false), "x<sep>x");

  std::ofstream(dir.path() / "tokenizer_config.json") << "{not json";
  try {
    Tokenizer::load(dir.path().string());
    FAIL() << "malformed tokenizer_config.json accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("tokenizer_config.json"), std::string::npos) << e.message();
  }
  EXPECT_THROW(Tokenizer::load((dir.path() / "missing").string()), Error);
}

// AddedToken flags ("special", "lstrip", "rstrip") that are not booleans are errors naming the
// field and the file, not a JSON library exception (fuzz_tokenizer_files found this); a plain
// string entry in added_tokens_decoder has no flags. The bundled SentencePiece model suffices.
TEST(Tokenizer, AddedTokenFlagsMustBeBooleans) {
  TempDir dir("tokenizer_flags");
  std::filesystem::copy_file(alpaca::testing::source_dir() / "data" / "tokenizer" / "tokenizer.model",
                             dir.path() / "tokenizer.model");
  std::ofstream(dir.path() / "tokenizer_config.json") << R"({"added_tokens_decoder": {"600": "<sep>"}})";
  EXPECT_EQ(Tokenizer::load(dir.path().string()).vocab_size(), 601);
  // Every part must be in the message of the error the load throws ("" when it throws none).
  const auto expect_load_error = [&](const std::vector<std::string>& parts) {
    const std::string msg = alpaca::testing::error_of([&] { Tokenizer::load(dir.path().string()); });
    for (const auto& part : parts) EXPECT_NE(msg.find(part), std::string::npos) << part << " not in: " << msg;
  };
  std::ofstream(dir.path() / "tokenizer_config.json")
      << R"({"added_tokens_decoder": {"600": {"content": "<sep>", "special": "yes"}}})";
  expect_load_error({"'special' of the added token", "must be true or false", "tokenizer_config.json"});
  std::ofstream(dir.path() / "tokenizer_config.json") << "{}";
  std::ofstream(dir.path() / "special_tokens_map.json")
      << R"({"additional_special_tokens": [{"content": "<x>", "lstrip": 1}]})";
  expect_load_error({"'lstrip'", "special_tokens_map.json"});
}

}  // namespace
}  // namespace alpaca::tokenizer::test_tokenizer
