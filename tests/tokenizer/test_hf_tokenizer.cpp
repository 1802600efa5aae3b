// The tokenizer.json path (issue 14), token-exact against transformers 5's AutoTokenizer after
// stanford_alpaca train.py's special-token rule (fixture: tests/reference/hf_tokenizer_reference.py)
// for LLaMA-2's tokenizer.json as transformers 5 writes it, SmolLM2-135M-Instruct's tokenizer and a
// LLaMA-3-style tokenizer, and two tokenizers built to cover the other components: all 5,000 Alpaca records (input ids and labels as train.py makes them),
// the edge-case list (ids and both decodes), decode(encode(x)) == x for the byte-level ones, the
// save -> AutoTokenizer round trip, the format selection rule and the errors.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "alpaca/data/alpaca_example.h"
#include "alpaca/tokenizer/tokenizer.h"
#include "alpaca/util/error.h"
#include "tokenizer_parity.h"
#include "tokenizer_test_util.h"

namespace alpaca::tokenizer::test_hf_tokenizer {
namespace {

using namespace test;

fs::path fixture() { return fixture_dir("hf_tokenizer"); }
json reference() { return read_json(fixture() / "reference.json"); }

#define REQUIRE_FIXTURE() ALPACA_REQUIRE_TOKENIZER_FIXTURE(fixture(), "hf_tokenizer")

class HfTokenizerParity : public ::testing::TestWithParam<const char*> {};

TEST_P(HfTokenizerParity, MatchesAutoTokenizerAfterTrainPyRule) {
  REQUIRE_FIXTURE();
  const std::string name = GetParam();
  const json ref = reference();
  const json& r = ref["tokenizers"][name];
  Tokenizer tok = Tokenizer::load(r["dir"].get<std::string>());
  EXPECT_EQ(tok.format(), "tokenizer.json");
  EXPECT_EQ(tok.add_missing_special_tokens(), r["num_new_tokens"].get<int64_t>());
  EXPECT_EQ(tok.vocab_size(), r["len"].get<int64_t>());
  EXPECT_EQ(tok.pad_id(), r["pad_id"].get<int64_t>());
  EXPECT_EQ(tok.eos_id(), r["eos_id"].get<int64_t>());
  EXPECT_EQ(tok.bos_id(), r["bos_id"].get<int64_t>());
  EXPECT_EQ(tok.unk_id(), r["unk_id"].get<int64_t>());
  EXPECT_EQ(tok.eos_token(), r["eos_token"].get<std::string>());

  // Edge cases: ids, decode with and without special tokens.
  const auto& texts = ref["edge_texts"];
  const size_t bad = parity::count_edge_differences(tok, texts, r["edge"], name);
  EXPECT_EQ(bad, 0u) << bad << " of " << texts.size() << " edge cases differ";

  // An id past the vocabulary decodes as nothing, as `tokenizers` decodes it.
  const std::vector<int64_t> some = tok.encode("Hello world", false);
  std::vector<int64_t> with_past = some;
  with_past.insert(with_past.begin() + 1, tok.vocab_size() + 7);
  EXPECT_EQ(tok.decode(with_past), tok.decode(some));
  EXPECT_EQ(tok.token_bytes(tok.vocab_size()), "");

  // All records, train.py's preprocess.
  auto records = load_alpaca_records((shared_dir() / "data/alpaca/alpaca_5000.json").string());
  const int64_t max_len = ref["model_max_length"].get<int64_t>();
  auto examples = tokenize_alpaca(records, tok, max_len, 0);
  std::ifstream in(fixture() / (name + ".jsonl"));
  std::string line;
  size_t n = 0, mismatched = 0;
  for (; std::getline(in, line); ++n) {
    ASSERT_LT(n, examples.size());
    if (!parity::same_example(json::parse(line), examples[n]) && ++mismatched <= 3)
      ADD_FAILURE() << name << " record " << n << " differs (ours " << examples[n].input_ids.size()
                    << " ids)";
  }
  EXPECT_EQ(n, records.size());
  EXPECT_EQ(mismatched, 0u) << mismatched << " of " << n << " records differ";

  // Byte-level BPE is lossless: decode(encode(x)) == x on every record's text.
  if (!r["library_roundtrip_ok"].is_null()) {
    size_t lossy = 0;
    for (const auto& rec : records) {
      const std::string text = rec.instruction + "\n" + rec.input + "\n" + rec.output;
      if (tok.decode(tok.encode(text, false), false) != text && ++lossy <= 3)
        ADD_FAILURE() << name << ": decode(encode(x)) != x for " << json(text).dump().substr(0, 200);
    }
    EXPECT_EQ(lossy, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, HfTokenizerParity,
                         ::testing::Values("llama2_json", "smollm2", "llama3_style", "components_a",
                                           "components_b"));

// Saving keeps tokenizer.json (plus the added tokens); ours and AutoTokenizer read it back with
// the same ids and the same special tokens.
TEST(HfTokenizer, SavedDirectoryLoadsInTransformersWithSameIds) {
  REQUIRE_FIXTURE();
  const json ref = reference();
  TempDir tmp("hf_tokenizer_save");
  const std::vector<std::string> texts = {
      "Below is an instruction.\n\n### Response:Sure thing", "x[PAD]y [PAD] z <unk>", "日本語 🦙 1234567",
      "<|begin_of_text|>hi<|im_end|></s>"};
  json ours = json::object();
  std::string dirs;
  for (const char* name : {"llama2_json", "smollm2", "llama3_style"}) {
    Tokenizer tok = Tokenizer::load(ref["tokenizers"][name]["dir"].get<std::string>());
    tok.add_missing_special_tokens();
    tok.set_model_max_length(512);
    const fs::path out = tmp.path() / name;
    tok.save(out.string());
    EXPECT_TRUE(fs::exists(out / "tokenizer.json"));
    EXPECT_FALSE(fs::exists(out / "tokenizer.model"));
    Tokenizer back = Tokenizer::load(out.string());
    EXPECT_EQ(back.vocab_size(), tok.vocab_size());
    EXPECT_EQ(back.pad_id(), tok.pad_id());
    json ids = json::array();
    for (const auto& t : texts) {
      EXPECT_EQ(back.encode(t), tok.encode(t)) << name << " " << t;
      ids.push_back(tok.encode(t));
    }
    ours[name] = {{"len", tok.vocab_size()}, {"pad", *tok.pad_id()}, {"eos", tok.eos_id()},
                  {"bos", tok.bos_id()}, {"unk", tok.unk_id()}, {"ids", ids}};
    dirs += " " + out.string();
  }
  expect_auto_tokenizer_agrees(tmp.path(), dirs, texts, ours, /*with_bos_unk=*/true);
}

// tokenizer.model when present (use_fast=False), tokenizer.json otherwise or with use_fast.
TEST(HfTokenizer, FormatSelectionRule) {
  REQUIRE_FIXTURE();
  ALPACA_REQUIRE_SHARED("data/llama2-tokenizer/tokenizer.model");
  const json ref = reference();
  TempDir tmp("hf_tokenizer_select");
  fs::copy(ref["tokenizers"]["llama2_json"]["dir"].get<std::string>(), tmp.path(),
           fs::copy_options::recursive);
  EXPECT_EQ(Tokenizer::load(tmp.path().string()).format(), "tokenizer.json");
  fs::copy_file(shared_dir() / "data/llama2-tokenizer/tokenizer.model", tmp.path() / "tokenizer.model");
  Tokenizer slow = Tokenizer::load(tmp.path().string());
  Tokenizer fast = Tokenizer::load(tmp.path().string(), /*use_fast=*/true);
  EXPECT_EQ(slow.format(), "sentencepiece");
  EXPECT_EQ(fast.format(), "tokenizer.json");
  // The two LLaMA-2 tokenizers differ only in BOS (transformers 5's conversion adds none) and
  // in the prefix space of text after a special token.
  EXPECT_EQ(slow.encode("Hello world"), (std::vector<int64_t>{1, 15043, 3186}));
  EXPECT_EQ(fast.encode("Hello world"), (std::vector<int64_t>{15043, 3186}));
  EXPECT_EQ(Tokenizer::load((tmp.path() / "tokenizer.json").string()).format(), "tokenizer.json");
  fs::remove(tmp.path() / "tokenizer.json");
  fs::remove(tmp.path() / "tokenizer.model");
  try {
    Tokenizer::load(tmp.path().string());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.model (SentencePiece) or tokenizer.json"), std::string::npos)
        << e.what();
  }
}

void expect_error(const fs::path& dir, const std::vector<std::string>& parts) {
  try {
    Tokenizer::load(dir.string());
    FAIL() << "expected an error for " << dir;
  } catch (const Error& e) {
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "'" << p << "' not in: " << e.what();
  }
}

// Unsupported components and malformed files: errors name the file, the component and what is
// supported.
TEST(HfTokenizer, ErrorsNameTheFileAndTheSupportedComponents) {
  REQUIRE_FIXTURE();
  const json ref = reference();
  const fs::path src = ref["tokenizers"]["smollm2"]["dir"].get<std::string>();
  const json doc = json::parse(read_text(src / "tokenizer.json"));
  TempDir tmp("hf_tokenizer_errors");
  auto variant = [&](const std::string& tag, const std::function<void(json&)>& edit) {
    fs::path d = tmp.path() / tag;
    fs::create_directories(d);
    json j = doc;
    edit(j);
    write(d / "tokenizer.json", j.dump());
    return d;
  };
  expect_error(variant("pre", [](json& j) { j["pre_tokenizer"] = {{"type", "FixedLength"}}; }),
               {"tokenizer.json", "pre_tokenizer", "\"FixedLength\"", "supported: ByteLevel, Split, Metaspace",
                "Whitespace, Punctuation, CharDelimiterSplit, UnicodeScripts"});
  expect_error(variant("delimiter", [](json& j) {
                 j["pre_tokenizer"] = {{"type", "CharDelimiterSplit"}, {"delimiter", "ab"}};
               }),
               {"tokenizer.json", "pre_tokenizer", "\"delimiter\" must be a single character"});
  expect_error(variant("norm", [](json& j) { j["normalizer"] = {{"type", "Unicode"}}; }),
               {"tokenizer.json", "\"Unicode\"", "supported: Sequence, Prepend, Replace, NFC, NFKC", "ByteLevel"});
  expect_error(variant("charsmap", [](json& j) { j["normalizer"] = {{"type", "Precompiled"}}; }),
               {"tokenizer.json", "normalizer", "required field \"precompiled_charsmap\" is missing"});
  expect_error(variant("charsmap64", [](json& j) {
                 j["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", "AAAA!AAA"}};
               }),
               {"tokenizer.json", "precompiled_charsmap", "not base64"});
  expect_error(variant("post", [](json& j) { j["post_processor"] = {{"type", "RobertaProcessing"}}; }),
               {"tokenizer.json", "post_processor", "required field \"cls\" is missing"});
  expect_error(variant("post_type", [](json& j) { j["post_processor"] = {{"type", "NoSuchProcessing"}}; }),
               {"tokenizer.json", "\"NoSuchProcessing\"", "supported: TemplateProcessing, RobertaProcessing"});
  expect_error(variant("dec", [](json& j) {
                 j["decoder"] = {{"type", "Sequence"}, {"decoders", {{{"type", "CTC"}}}}};
               }),
               {"tokenizer.json", "decoder.decoders[0]", "\"CTC\"", "supported: ByteLevel, Metaspace"});
  expect_error(variant("model", [](json& j) { j["model"]["type"] = "NoSuchModel"; }),
               {"tokenizer.json", "\"NoSuchModel\"", "supported: BPE, Unigram, WordPiece, WordLevel"});
  expect_error(variant("wordlevel", [](json& j) { j["model"] = {{"type", "WordLevel"}, {"vocab", json::object()}}; }),
               {"tokenizer.json", "a WordLevel model needs \"unk_token\""});
  expect_error(variant("unigram", [](json& j) { j["model"]["type"] = "Unigram"; }),
               {"tokenizer.json", "a Unigram model needs \"vocab\": [[piece, score], ...]"});
  expect_error(variant("wordpiece", [](json& j) { j["model"] = {{"type", "WordPiece"}, {"vocab", json::object()}}; }),
               {"tokenizer.json", "a WordPiece model needs \"unk_token\""});
  expect_error(variant("dropout", [](json& j) { j["model"]["dropout"] = 0.1; }),
               {"tokenizer.json", "dropout", "not supported"});
  expect_error(variant("regex", [](json& j) {
                 j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}},
                                       {"behavior", "Isolated"}, {"invert", false}};
               }),
               {"tokenizer.json", "does not compile"});
  fs::path bad = tmp.path() / "malformed";
  fs::create_directories(bad);
  write(bad / "tokenizer.json", read_text(src / "tokenizer.json").substr(0, 1000));
  expect_error(bad, {(bad / "tokenizer.json").string(), "not valid JSON"});
  fs::path nomodel = tmp.path() / "nomodel";
  fs::create_directories(nomodel);
  write(nomodel / "tokenizer.json", "{\"version\": \"1.0\"}");
  expect_error(nomodel, {"tokenizer.json", "not a tokenizer.json"});
}

}  // namespace
}  // namespace alpaca::tokenizer::test_hf_tokenizer

// A module's test files compile as one unit (tests/CMakeLists.txt): this file's macros end here.
#undef REQUIRE_FIXTURE
