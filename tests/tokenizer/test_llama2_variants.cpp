// Issue 26: LLaMA-2 tokenizer.json files as transformers 4.28.1, 4.44.2 and 5 write them (with
// and without tokenizer.model beside, legacy true/false), token-exact with transformers 5's
// AutoTokenizer after train.py's special-token rule (fixture:
// tests/reference/llama2_tokenizer_variants_reference.py): all Alpaca records, edge cases with
// both decodes, the save -> AutoTokenizer round trip, the class table and each reimplemented
// class's pipeline against transformers', and the EOS self-check on a file whose EOS splits.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "alpaca/data/alpaca_example.h"
#include "alpaca/tokenizer/tokenizer.h"
#include "alpaca/util/error.h"
#include "tokenizer_parity.h"
#include "tokenizer_test_util.h"

namespace alpaca::tokenizer::test_llama2_variants {
namespace {

using namespace test;

fs::path fixture() { return fixture_dir("llama2_variants"); }

#define REQUIRE_FIXTURE() ALPACA_REQUIRE_TOKENIZER_FIXTURE(fixture(), "llama2_variants")

Tokenizer load_variant(const json& r) {
  // With tokenizer.model beside, tokenizer.json is what --use_fast_tokenizer (and transformers 5) uses.
  return Tokenizer::load(r["dir"].get<std::string>(), /*use_fast=*/true);
}

TEST(Llama2Variants, EveryVariantMatchesAutoTokenizer) {
  REQUIRE_FIXTURE();
  const json ref = read_json(fixture() / "reference.json");
  auto records = load_alpaca_records((shared_dir() / "data/alpaca/alpaca_5000.json").string());
  const int64_t max_len = ref["model_max_length"].get<int64_t>();
  std::map<std::string, std::vector<json>> files;  // records file -> its lines
  size_t compared_files = 0, compared_records = 0, differing = 0;
  for (const auto& [name, r] : ref["variants"].items()) {
    SCOPED_TRACE(name);
    Tokenizer tok = load_variant(r);
    EXPECT_EQ(tok.format(), "tokenizer.json");
    EXPECT_EQ(tok.tokenizer_class(), r["class"].get<std::string>());
    EXPECT_EQ(tok.add_missing_special_tokens(), r["num_new_tokens"].get<int64_t>());
    EXPECT_EQ(tok.vocab_size(), r["len"].get<int64_t>());
    EXPECT_EQ(tok.pad_id(), r["pad_id"].get<int64_t>());
    EXPECT_EQ(tok.eos_id(), r["eos_id"].get<int64_t>());
    EXPECT_EQ(tok.bos_id(), r["bos_id"].get<int64_t>());
    EXPECT_EQ(tok.encode("Hello world</s>", false), r["auto_hello_eos"].get<std::vector<int64_t>>());
    EXPECT_NO_THROW(tok.check_special_tokens());
    EXPECT_EQ(parity::count_edge_differences(tok, ref["edge_texts"], r["edge"], name), 0u);
    auto& lines = files[r["records_file"].get<std::string>()];
    if (lines.empty()) {
      std::ifstream in(fixture() / r["records_file"].get<std::string>());
      for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
    }
    ASSERT_EQ(lines.size(), records.size());
    auto examples = tokenize_alpaca(records, tok, max_len, 0);
    size_t mismatched = 0;
    for (size_t n = 0; n < lines.size(); ++n) {
      if (!parity::same_example(lines[n], examples[n]) && ++mismatched <= 3) ADD_FAILURE() << "record " << n << " differs";
    }
    EXPECT_EQ(mismatched, 0u) << mismatched << " of " << lines.size() << " records differ";
    // Every example ends with the EOS id (or was cut at max_length).
    for (const auto& ex : examples) {
      if (static_cast<int64_t>(ex.input_ids.size()) < max_len) {
        ASSERT_EQ(ex.input_ids.back(), tok.eos_id());
      }
    }
    ++compared_files;
    compared_records += lines.size();
    differing += mismatched;
  }
  EXPECT_EQ(compared_files, 12u);
  std::cout << "[llama2 variants] " << compared_files << " files x " << records.size() << " records = "
            << compared_records << " compared, " << differing << " differ\n";
}

// A saved directory keeps the class's pipeline and loads in transformers 5 with the same ids.
TEST(Llama2Variants, SavedDirectoriesLoadInTransformersWithSameIds) {
  REQUIRE_FIXTURE();
  const json ref = read_json(fixture() / "reference.json");
  TempDir tmp("llama2_variants_save");
  const std::vector<std::string> texts = {"Below is an instruction.\n\n### Response:Sure thing</s>",
                                          "x[PAD]y <s>Hello</s> world", " leading \u2581 space", "日本語 🦙 123"};
  json ours = json::object();
  std::string dirs;
  for (const auto& [name, r] : ref["variants"].items()) {
    Tokenizer tok = load_variant(r);
    tok.add_missing_special_tokens();
    const fs::path out = tmp.path() / name;
    tok.save(out.string());
    Tokenizer back = Tokenizer::load(out.string(), true);
    json ids = json::array();
    for (const auto& t : texts) {
      EXPECT_EQ(back.encode(t), tok.encode(t)) << name << " " << t;
      ids.push_back(tok.encode(t));
    }
    ours[name] = {{"len", tok.vocab_size()}, {"pad", *tok.pad_id()}, {"eos", tok.eos_id()}, {"ids", ids}};
    dirs += " " + out.string();
  }
  expect_auto_tokenizer_agrees(tmp.path(), dirs, texts, ours, /*with_bos_unk=*/false);
}

fs::path tiny_dir(const fs::path& root, const std::string& tag, const json& config) {
  // The fixture's class cases share one tiny tokenizer.json (Lowercase + Digits of its own).
  const fs::path src = fixture() / "class_cases/case0/tokenizer.json";
  fs::path d = root / tag;
  fs::create_directories(d);
  fs::copy_file(src, d / "tokenizer.json", fs::copy_options::overwrite_existing);
  write(d / "tokenizer_config.json", config.dump());
  return d;
}

// Which names transformers 5 rebuilds from the class, and the pipeline each reimplemented class
// builds for every flag setting, against the installed transformers.
TEST(Llama2Variants, ClassTableAndPipelinesMatchTransformers) {
  REQUIRE_FIXTURE();
  const json classes = read_json(fixture() / "classes.json");
  TempDir tmp("llama2_variants_classes");
  // The reimplemented classes (test_tokenizer_classes.cpp checks each against AutoTokenizer and
  // the reason every other class gives).
  const std::set<std::string> supported = {
      "LlamaTokenizer",   "CodeLlamaTokenizer", "GemmaTokenizer",      "Siglip2Tokenizer", "GPT2Tokenizer",
      "CodeGenTokenizer", "GPTNeoXTokenizer",   "CohereTokenizer",     "Qwen2Tokenizer",   "Qwen3_5Tokenizer",
      "RobertaTokenizer", "LukeTokenizer",      "BlenderbotTokenizer", "DebertaTokenizer", "WhisperTokenizer",
      "CLIPTokenizer", "OpenAIGPTTokenizer", "HerbertTokenizer", "ReformerTokenizer", "Tipsv2Tokenizer", "NougatTokenizer", "NllbTokenizer",
      "SeamlessM4TTokenizer", "EsmcTokenizer"};
  // The Unigram and WordPiece classes (also reimplemented) refuse this BPE file, naming the way out; so do
  // MarkupLM without tags_dict and LayoutLMv3 (transformers 5 cannot load / tokenize a text with them).
  for (const auto& [name, cls] : classes["rebuilt"].items()) {
    fs::path d = tiny_dir(tmp.path(), name, {{"tokenizer_class", name + "Fast"}});
    if (supported.count(cls.get<std::string>())) {
      EXPECT_EQ(Tokenizer::load(d.string()).tokenizer_class(), cls.get<std::string>()) << name;
      continue;
    }
    try {
      Tokenizer::load(d.string());
      ADD_FAILURE() << name << ": expected an error (transformers 5 rebuilds " << cls << ")";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("\"PreTrainedTokenizerFast\" in tokenizer_config.json"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(name + "Fast"), std::string::npos) << e.what();
    }
  }
  // Classes without an __init__ of their own keep the file's pipeline; ConvBert and FNet still
  // take their parent's roles and report their own name, as type(AutoTokenizer(...)) does.
  const std::set<std::string> inherited = {"ConvBertTokenizer", "FNetTokenizer"};
  for (const auto& name : classes["as_is"]) {
    fs::path d = tiny_dir(tmp.path(), "as_is_" + name.get<std::string>(), {{"tokenizer_class", name}});
    const std::string expected = inherited.count(name.get<std::string>()) ? name.get<std::string>() : "TokenizersBackend";
    EXPECT_EQ(Tokenizer::load(d.string()).tokenizer_class(), expected) << name;
  }
  size_t i = 0;
  for (const json& c : classes["pipelines"]) {
    fs::path d = tiny_dir(tmp.path(), "pipeline" + std::to_string(i++), c["config"]);
    Tokenizer tok = Tokenizer::load(d.string());
    const fs::path out = d / "saved";
    tok.save(out.string());
    const json built = read_json(out / "tokenizer.json");
    for (const char* k : {"normalizer", "pre_tokenizer", "decoder"})
      EXPECT_EQ(built[k], c[k]) << c["config"].dump() << " " << k;
    for (const auto& [k, v] : c["model"].items())
      EXPECT_EQ(built["model"][k], v) << c["config"].dump() << " model." << k;
  }
  EXPECT_EQ(i, classes["pipelines"].size());
}

// A tokenizer.json whose EOS splits (the 4.28.1 file taken as is): the self-check stops the
// data load with the token, its ids and the file; `preprocess` exits non-zero and writes nothing.
TEST(Llama2Variants, SelfCheckRejectsASplitEos) {
  REQUIRE_FIXTURE();
  const json ref = read_json(fixture() / "reference.json");
  TempDir tmp("llama2_variants_broken");
  const fs::path d = tmp.path() / "broken";
  fs::copy(ref["variants"]["tf428_json"]["dir"].get<std::string>(), d, fs::copy_options::recursive);
  json config = read_json(d / "tokenizer_config.json");
  config["tokenizer_class"] = "PreTrainedTokenizerFast";  // the raw library's pipeline, as is
  write(d / "tokenizer_config.json", config.dump());
  Tokenizer tok = Tokenizer::load(d.string());
  EXPECT_EQ(tok.tokenizer_class(), "TokenizersBackend");
  try {
    tok.check_special_tokens();
    FAIL() << "expected the self-check to fail";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& part : std::vector<std::string>{"eos token \"</s>\" (id 2)", "29879 \"s\" 29958 \">\"",
                                   (d / "tokenizer.json").string(), "never teach the model to stop"})
      EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
  }
  auto records = load_alpaca_records((shared_dir() / "data/alpaca/alpaca_5000.json").string());
  records.resize(3);
  EXPECT_THROW(tokenize_alpaca(records, tok, 512, 1), Error);

  const fs::path out = tmp.path() / "out" / "examples.jsonl";
  fs::create_directories(out.parent_path());
  // `alpaca-train preprocess` of the Alpaca records with the tokenizer in `dir` into `out`.
  std::string log;
  const auto preprocess = [&](const fs::path& dir) {
    return ::alpaca::testing::run_command(::alpaca::testing::train_bin() + " preprocess --data_path " +
                                              (shared_dir() / "data/alpaca/alpaca_5000.json").string() +
                                              " --tokenizer " + dir.string() + " --output " + out.string(),
                                          &log);
  };
  int rc = preprocess(d);
  EXPECT_NE(rc, 0) << log;
  EXPECT_NE(log.find("tokenizer self-check failed: the eos token"), std::string::npos) << log;
  EXPECT_TRUE(fs::is_empty(out.parent_path())) << "preprocess left files behind";

  // The same file with its class rule (LlamaTokenizer) passes, and preprocess shows the EOS.
  const fs::path good = ref["variants"]["tf428_json"]["dir"].get<std::string>();
  rc = preprocess(good);
  EXPECT_EQ(rc, 0) << log;
  EXPECT_NE(log.find("first example ends:"), std::string::npos) << log;
  EXPECT_NE(log.find(" 2 \"</s>\" (eos 2"), std::string::npos) << log;
  EXPECT_NE(log.find("as LlamaTokenizer"), std::string::npos) << log;
}

// The same broken file at `train` level: the run exits non-zero with the token, its ids and the
// file before anything is written to output_dir; the file under its class (LlamaTokenizer) trains.
TEST(Llama2Variants, TrainRefusesASplitEosBeforeWritingOutput) {
  REQUIRE_FIXTURE();
  const json ref = read_json(fixture() / "reference.json");
  TempDir tmp("llama2_variants_train");
  const fs::path cfg = tmp.path() / "config.json", model = tmp.path() / "model";
  write(cfg, R"({"model_type": "llama", "vocab_size": 32000, "hidden_size": 32, "intermediate_size": 64,
      "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 128})");
  std::string log;
  ASSERT_EQ(::alpaca::testing::run_command(::alpaca::testing::train_bin() + " init-model --config " + cfg.string() +
                                               " --output_dir " + model.string() + " 2>&1", &log), 0) << log;
  const fs::path src = ref["variants"]["tf428_json"]["dir"].get<std::string>();
  for (const auto& f : fs::directory_iterator(src))
    fs::copy_file(f.path(), model / f.path().filename(), fs::copy_options::overwrite_existing);
  json config = read_json(model / "tokenizer_config.json");
  const std::string good_class = config.value("tokenizer_class", "");
  config["tokenizer_class"] = "PreTrainedTokenizerFast";  // the raw library's pipeline: </s> splits
  write(model / "tokenizer_config.json", config.dump());
  auto train = [&](const fs::path& out) {
    return ::alpaca::testing::run_command(
        ::alpaca::testing::train_bin() + " train --model_name_or_path " + model.string() + " --data_path " +
            (shared_dir() / "data/alpaca/alpaca_5000.json").string() + " --output_dir " + out.string() +
            " --max_steps 1 --per_device_train_batch_size 2 --model_max_length 64 --save_strategy no"
            " --report_to none --disable_tqdm True 2>&1",
        &log);
  };
  const fs::path bad = tmp.path() / "bad_run";
  EXPECT_NE(train(bad), 0) << log;
  for (const std::string& part : std::vector<std::string>{"tokenizer self-check failed: the eos token \"</s>\" (id 2)",
                                                          "29879 \"s\" 29958 \">\"", (model / "tokenizer.json").string()})
    EXPECT_NE(log.find(part), std::string::npos) << "'" << part << "' not in:\n" << log;
  EXPECT_TRUE(!fs::exists(bad) || fs::is_empty(bad)) << "train wrote into output_dir before refusing";

  config["tokenizer_class"] = good_class;
  write(model / "tokenizer_config.json", config.dump());
  EXPECT_EQ(train(tmp.path() / "good_run"), 0) << log;
}

}  // namespace
}  // namespace alpaca::tokenizer::test_llama2_variants

// A module's test files compile as one unit (tests/CMakeLists.txt): this file's macros end here.
#undef REQUIRE_FIXTURE
