// Issue 26, the class rule for every tokenizer_class transformers 5 rebuilds from its Python class
// (src/data/tokenizer_class.cpp), token-exact with AutoTokenizer (fixture:
// tests/reference/tokenizer_classes_reference.py): LLaMA-2's and SmolLM2's tokenizer.json (BPE),
// SentencePiece-trained Unigram files (Precompiled charsmap, byte pieces) and a trained WordPiece
// file, as is and under each class, with and without the kwargs that change the pipeline; edge texts and Alpaca records
// with and without add_special_tokens, both decodes, the roles, len(), the built pipeline, the
// save -> AutoTokenizer round trip; and for the classes transformers 5 itself cannot tokenize a
// plain text with, a clear error naming the model type and the exception transformers raises.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "alpaca/tokenizer/tokenizer.h"
#include "alpaca/util/error.h"
#include "test_util.h"
#include "tokenizer_parity.h"

namespace alpaca::tokenizer::test_tokenizer_classes {
namespace {

namespace fs = std::filesystem;
using ::alpaca::testing::binary_dir;
using ::alpaca::testing::TempDir;
using nlohmann::json;
using parity::compare_texts;
using parity::expect_roles;

const fs::path& fixture() {
  static const fs::path p = binary_dir() / "fixtures/tokenizer_classes";
  return p;
}

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

#define REQUIRE_FIXTURE()                                 \
  ALPACA_REQUIRE_SHARED("data/alpaca/alpaca_5000.json");  \
  ASSERT_TRUE(fs::exists(fixture() / "reference.json"))   \
      << "run the fixture first: ctest -R tokenizer_classes (fixture_tokenizer_classes)"

// The classes tokenizer_class.cpp reimplements (what AutoTokenizer instantiates).
const std::set<std::string> kImplemented = {
    "LlamaTokenizer",   "CodeLlamaTokenizer", "GemmaTokenizer",    "Siglip2Tokenizer",   "GPT2Tokenizer",
    "CodeGenTokenizer", "GPTNeoXTokenizer",   "CohereTokenizer",   "Qwen2Tokenizer",     "Qwen3_5Tokenizer",
    "RobertaTokenizer", "LukeTokenizer",      "BlenderbotTokenizer", "DebertaTokenizer", "WhisperTokenizer",
    "CLIPTokenizer", "OpenAIGPTTokenizer", "HerbertTokenizer", "ReformerTokenizer", "Tipsv2Tokenizer", "NougatTokenizer",
    "T5Tokenizer", "XLMRobertaTokenizer", "AlbertTokenizer", "DebertaV2Tokenizer", "BertTokenizer", "DistilBertTokenizer",
    "CamembertTokenizer", "MBartTokenizer", "PegasusTokenizer", "BigBirdTokenizer", "XLNetTokenizer", "BarthezTokenizer",
    "RemBertTokenizer", "LasrTokenizer", "VideoPrismTokenizer", "MLukeTokenizer", "XGLMTokenizer",
    "DPRQuestionEncoderTokenizer", "DPRContextEncoderTokenizer", "DPRReaderTokenizer", "MPNetTokenizer",
    "FunnelTokenizer", "SplinterTokenizer", "FNetTokenizer", "ConvBertTokenizer", "NllbTokenizer",
    "MBart50Tokenizer", "SeamlessM4TTokenizer", "EsmcTokenizer", "MarkupLMTokenizer"};

TEST(TokenizerClasses, EveryCaseMatchesAutoTokenizer) {
  REQUIRE_FIXTURE();
  const json reference = read_json(fixture() / "reference.json");
  TempDir tmp("tokenizer_classes");
  std::set<std::string> classes;
  size_t files = 0, texts = 0, differing = 0;
  for (const auto& [name, c] : reference["cases"].items()) {
    SCOPED_TRACE(name);
    const json ref = read_json(fixture() / "cases" / (name + ".json"));
    Tokenizer tok = Tokenizer::load(ref["dir"].get<std::string>());
    EXPECT_EQ(tok.tokenizer_class(), ref["class"].get<std::string>());
    EXPECT_EQ(tok.vocab_size(), ref["len"].get<int64_t>());
    expect_roles(tok, ref["roles"]);
    EXPECT_NO_THROW(tok.check_special_tokens());
    const size_t bad = compare_texts(tok, ref);
    EXPECT_EQ(bad, 0u) << bad << " of " << ref["texts"].size() << " texts differ";
    // The pipeline the class built, as save() writes it.
    const fs::path out = tmp.path() / name;
    tok.save(out.string());
    const json built = read_json(out / "tokenizer.json");
    for (const char* k : {"normalizer", "pre_tokenizer", "decoder"})
      EXPECT_EQ(built[k], ref["pipeline"][k]) << k;
    for (const auto& [k, v] : ref["pipeline"]["model"].items()) EXPECT_EQ(built["model"][k], v) << "model." << k;
    classes.insert(ref["class"].get<std::string>());
    ++files;
    texts += ref["texts"].size();
    differing += bad;
  }
  // 93 cases on the edge texts + the records, 29 on the config-extras / language texts (fewer records).
  EXPECT_EQ(files, 122u);
  for (const auto& c : kImplemented) EXPECT_TRUE(classes.count(c)) << c << " has no case in the fixture";
  std::cout << "[tokenizer classes] " << files << " files (" << reference["edge"] << " edge texts + "
            << reference["records"] << " records, or the extras cases' texts) x 2 (with/without special tokens), "
            << classes.size() << " classes: " << texts << " texts compared, " << differing << " differ\n";
}

// A saved directory loads in transformers 5 with the same class, len() and ids.
TEST(TokenizerClasses, SavedDirectoriesLoadInTransformersWithSameIds) {
  REQUIRE_FIXTURE();
  const json reference = read_json(fixture() / "reference.json");
  TempDir tmp("tokenizer_classes_save");
  const std::vector<std::string> texts = {"Below is an instruction.\n\n### Response:Sure thing</s>",
                                          "x<pad>y <s>Hello</s> world <|endoftext|>", " leading \u2581 space",
                                          "\u65e5\u672c\u8a9e \U0001F999 123 ABC"};
  json ours = json::object();
  std::string dirs;
  for (const auto& [name, c] : reference["cases"].items()) {
    Tokenizer tok = Tokenizer::load(read_json(fixture() / "cases" / (name + ".json"))["dir"].get<std::string>());
    const fs::path out = tmp.path() / name;
    tok.save(out.string());
    json ids = json::array();
    for (const auto& t : texts) ids.push_back(tok.encode(t));
    ours[name] = {{"class", tok.tokenizer_class()}, {"len", tok.vocab_size()}, {"ids", ids}};
    dirs += " " + out.string();
  }
  const fs::path script = tmp.path() / "check.py";
  std::ofstream(script) << "import sys, json\n"
                           "from transformers import AutoTokenizer\n"
                           "texts = json.loads(sys.argv[1])\n"
                           "out = {}\n"
                           "for d in sys.argv[2:]:\n"
                           "    t = AutoTokenizer.from_pretrained(d)\n"
                           "    out[d.rsplit('/', 1)[1]] = {'class': type(t).__name__, 'len': len(t),\n"
                           "        'ids': [t(s)['input_ids'] for s in texts]}\n"
                           "print(json.dumps(out))\n";
  std::string out;
  int rc = ::alpaca::testing::run_command(::alpaca::testing::python() + " " + script.string() + " '" +
                                              json(texts).dump() + "'" + dirs + " 2>/dev/null",
                                          &out);
  ASSERT_EQ(rc, 0) << out;
  const json theirs = json::parse(out.substr(out.find('{')));
  for (const auto& [name, v] : ours.items()) EXPECT_EQ(theirs[name], v) << name;
}

// Every class transformers 5 rebuilds: the reimplemented ones load; the others are exactly those
// transformers 5 itself cannot tokenize a plain text with (cannot_tokenize.json: the exception it
// raises), and fail with an error naming the class, its model type and that exception.
TEST(TokenizerClasses, UnsupportedClassesSayWhy) {
  REQUIRE_FIXTURE();
  const json classes = read_json(fixture() / "classes.json");
  const json cannot = read_json(fixture() / "cannot_tokenize.json");
  // A base file of the model type the class builds: LLaMA-2's BPE, the T5-layout Unigram, the WordPiece.
  std::map<std::string, fs::path> base;
  for (const auto& [model, c] : std::map<std::string, std::string>{{"BPE", "llama"}, {"Unigram", "t5"}, {"WordPiece", "bert"}})
    base[model] = read_json(fixture() / "cases" / (c + ".json"))["dir"].get<std::string>() + "/tokenizer.json";
  TempDir tmp("tokenizer_classes_unsupported");
  size_t supported = 0, refused = 0;
  for (const auto& [name, c] : classes.items()) {
    SCOPED_TRACE(name);
    const fs::path d = tmp.path() / name;
    fs::create_directories(d);
    const std::string cls = c["class"].get<std::string>(), model = c["model"].get<std::string>();
    fs::copy_file(base.count(model) ? base.at(model) : base.at("BPE"), d / "tokenizer.json");
    std::ofstream(d / "tokenizer_config.json") << json{{"tokenizer_class", name}}.dump();
    if (!cannot.contains(name)) {
      EXPECT_TRUE(kImplemented.count(cls)) << cls << " is neither reimplemented nor refused by transformers";
      EXPECT_EQ(Tokenizer::load(d.string()).tokenizer_class(), cls);
      ++supported;
      continue;
    }
    try {
      Tokenizer::load(d.string());
      ADD_FAILURE() << "expected an error: transformers 5 cannot tokenize a text with " << cls << " (" << model << ")";
    } catch (const Error& e) {
      const std::string msg = e.what(), theirs = cannot[name].get<std::string>();
      EXPECT_NE(msg.find(name), std::string::npos) << msg;
      EXPECT_NE(msg.find(model), std::string::npos) << msg;
      // The exception transformers raises, up to the end of its first sentence.
      const std::string first = theirs.substr(0, theirs.find(". ") == std::string::npos ? theirs.size() : theirs.find(". ") + 1);
      EXPECT_NE(msg.find(first), std::string::npos) << msg << "\ntransformers: " << theirs;
      EXPECT_NE(msg.find("PreTrainedTokenizerFast"), std::string::npos) << msg;
    }
    ++refused;
    if (kImplemented.count(cls)) ++supported;  // MarkupLM: reimplemented, given what transformers needs (tags_dict)
  }
  EXPECT_EQ(refused, cannot.size());
  std::cout << "[tokenizer classes] " << classes.size() << " classes rebuilt by transformers 5: " << supported
            << " reimplemented, " << classes.size() - supported << " refused; " << refused
            << " fail as transformers 5 itself fails on a plain text with only tokenizer_class set\n";
  EXPECT_GT(supported, 15u);
  // Classes whose __init__ is their parent's: the file's pipeline, the parent's roles.
  const json inherited = read_json(fixture() / "inherited.json");
  EXPECT_FALSE(inherited.empty());
  for (const auto& [name, parent] : inherited.items()) {
    SCOPED_TRACE(name + " (" + parent.get<std::string>() + ".__init__)");
    const fs::path d = tmp.path() / name;
    fs::create_directories(d);
    fs::copy_file(base.at(classes.at(parent.get<std::string>()).at("model").get<std::string>()), d / "tokenizer.json");
    std::ofstream(d / "tokenizer_config.json") << json{{"tokenizer_class", name}}.dump();
    EXPECT_EQ(Tokenizer::load(d.string()).tokenizer_class(), name);
  }
}

}  // namespace
}  // namespace alpaca::tokenizer::test_tokenizer_classes

// A module's test files compile as one unit (tests/CMakeLists.txt): this file's macros end here.
#undef REQUIRE_FIXTURE
