// The bundled default data (data/): it loads strictly, its splits are disjoint, its tokenizer
// is small, lossless on the data, loadable by transformers with the same ids, and the files are
// exactly what scripts/make_data.py makes.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "alpaca/data/alpaca_example.h"
#include "alpaca/data/alpaca_record.h"
#include "alpaca/tokenizer/tokenizer.h"
#include "test_util.h"

namespace alpaca::data::test_default_data {
using tokenizer::Tokenizer;
namespace {

using namespace ::alpaca::testing;  // the harness: TempDir, run_command, source_dir, ...

TEST(DefaultData, LoadsAndSplitsAreDisjoint) {
  auto train = load_alpaca_records((source_dir() / "data/synthetic_train.json").string());
  auto eval = load_alpaca_records((source_dir() / "data/synthetic_eval.json").string());
  EXPECT_EQ(train.size(), 4000u);
  EXPECT_EQ(eval.size(), 400u);
  std::set<std::pair<std::string, std::string>> seen;
  int64_t with_input = 0;
  for (const auto& r : train) {
    seen.insert({r.instruction, r.input});
    with_input += !r.input.empty();
  }
  for (const auto& r : eval)
    EXPECT_EQ(seen.count({r.instruction, r.input}), 0u) << "held-out record in train: " << r.instruction;
  EXPECT_GT(with_input, 1000);  // both prompt templates are exercised
  EXPECT_LT(with_input, 3000);
}

TEST(DefaultData, TokenizerIsSmallAndLossless) {
  Tokenizer tok = Tokenizer::load((source_dir() / "data/tokenizer").string());
  EXPECT_EQ(tok.vocab_size(), 512);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_FALSE(tok.pad_id().has_value());  // like LLaMA: training adds [PAD] = 512
  auto records = load_alpaca_records((source_dir() / "data/synthetic_eval.json").string());
  int64_t max_len = 0;
  for (const auto& r : records) {
    std::string text = format_alpaca_prompt(r) + r.output;
    auto ids = tok.encode(text);
    EXPECT_EQ(tok.decode(ids), text);
    for (int64_t id : ids) EXPECT_NE(id, tok.unk_id());
    max_len = std::max<int64_t>(max_len, ids.size());
  }
  EXPECT_LT(max_len, 128) << "examples should fit a short context";
}

TEST(DefaultData, TransformersLoadsTheTokenizerWithTheSameIds) {
  Tokenizer tok = Tokenizer::load((source_dir() / "data/tokenizer").string());
  auto records = load_alpaca_records((source_dir() / "data/synthetic_eval.json").string());
  TempDir dir("default_data_hf");
  // Our own save() (with [PAD] added, as training does) must agree with the committed files.
  Tokenizer padded = tok;
  padded.set_pad_token("[PAD]");
  padded.save((dir.path() / "saved").string());
  EXPECT_EQ(padded.pad_id(), 512);
  {
    std::ofstream texts(dir.path() / "texts.json");
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& r : records) arr.push_back(format_alpaca_prompt(r) + r.output + "</s>");
    texts << arr.dump();
    std::ofstream py(dir.path() / "check.py");
    py << "import json, sys\n"
          "from transformers import AutoTokenizer\n"
          "texts = json.load(open(sys.argv[1]))\n"
          "out = {}\n"
          "for d in sys.argv[2:]:\n"
          "    t = AutoTokenizer.from_pretrained(d)\n"
          "    out[d] = {'ids': [t(s)['input_ids'] for s in texts], 'len': len(t), 'pad': t.pad_token_id}\n"
          "merges = [json.load(open(d + '/tokenizer.json'))['model']['merges'] for d in sys.argv[2:]]\n"
          "out['same_merges'] = merges[0] == merges[1]\n"
          "print(json.dumps(out))\n";
  }
  const std::string committed = (source_dir() / "data/tokenizer").string();
  const std::string saved = (dir.path() / "saved").string();
  std::string out;
  int rc = run_command(python() + " " + (dir.path() / "check.py").string() + " " +
                           (dir.path() / "texts.json").string() + " " + committed + " " + saved +
                           " 2>/dev/null",
                       &out);
  ASSERT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out.substr(out.find('{')));
  EXPECT_TRUE(j["same_merges"].get<bool>()) << "C++ and Python tokenizer.json writers disagree";
  EXPECT_EQ(j[committed]["len"].get<int64_t>(), 512);
  EXPECT_EQ(j[saved]["len"].get<int64_t>(), 513);
  EXPECT_EQ(j[saved]["pad"].get<int64_t>(), 512);
  for (size_t i = 0; i < records.size(); ++i) {
    auto ours = tok.encode(format_alpaca_prompt(records[i]) + records[i].output + "</s>");
    ASSERT_EQ(j[committed]["ids"][i].get<std::vector<int64_t>>(), ours) << "record " << i;
    ASSERT_EQ(j[saved]["ids"][i].get<std::vector<int64_t>>(), ours) << "record " << i;
  }
}

TEST(DefaultData, IsReproducibleByTheScript) {
  std::string out;
  int rc = run_command(python() + " " + (source_dir() / "scripts/make_data.py").string() +
                           " --check 2>&1",
                       &out);
  EXPECT_EQ(rc, 0) << out;
}

}  // namespace
}  // namespace alpaca::data::test_default_data
