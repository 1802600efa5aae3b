// `alpaca-train preprocess` end to end: the written examples equal tokenize_alpaca's, the report
// has the counts, and bad flags/data are errors with a non-zero exit.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "alpaca/data/alpaca_example.h"
#include "alpaca/data/shuffle.h"
#include "test_util.h"

namespace alpaca::data::test_preprocess {
using tokenizer::Tokenizer;
namespace {

using namespace ::alpaca::testing;  // the harness: TempDir, run_command, source_dir, ...

std::vector<nlohmann::json> read_lines(const std::filesystem::path& p) {
  std::vector<nlohmann::json> out;
  std::ifstream in(p);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST(Preprocess, WritesTheTrainingExamplesAndReports) {
  TempDir dir("preprocess");
  const auto data = source_dir() / "data/synthetic_eval.json";
  const auto tok_dir = source_dir() / "data/tokenizer";
  const auto out_path = dir.path() / "tokens.jsonl";
  std::string out;
  int rc = run_command(train_bin() + " preprocess --data_path " + data.string() +
                           " --model_name_or_path " + tok_dir.string() + " --output " +
                           out_path.string() + " --model_max_length 40 2>&1",
                       &out);
  ASSERT_EQ(rc, 0) << out;
  for (const char* key : {"records:            400", "truncated:", "no label tokens:", "p50",
                          "p99", "pad id 512"})
    EXPECT_NE(out.find(key), std::string::npos) << key << " missing from:\n" << out;

  Tokenizer tok = Tokenizer::load(tok_dir.string());
  tok.set_pad_token("[PAD]");
  TokenizeStats stats;
  auto expect = tokenize_alpaca(load_alpaca_records(data.string()), tok, 40, 1, &stats);
  auto lines = read_lines(out_path);
  ASSERT_EQ(lines.size(), expect.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i]["input_ids"].get<std::vector<int64_t>>(), expect[i].input_ids) << i;
    EXPECT_EQ(lines[i]["labels"].get<std::vector<int64_t>>(), expect[i].labels) << i;
  }
  EXPECT_NE(out.find("truncated:          " + std::to_string(stats.num_truncated)),
            std::string::npos)
      << out;

  const auto packed_path = dir.path() / "packed.jsonl";
  rc = run_command(train_bin() + " preprocess --data_path " + data.string() + " --tokenizer " +
                       tok_dir.string() + " --output " + packed_path.string() +
                       " --packing True --model_max_length 128 2>&1",
                   &out);
  ASSERT_EQ(rc, 0) << out;
  auto packed = read_lines(packed_path);
  EXPECT_LT(packed.size(), 400u);
  EXPECT_TRUE(packed[0].contains("segment_ids"));
  EXPECT_NE(out.find("packed blocks:"), std::string::npos) << out;
  // TRL's third strategy is refused by name, before anything is written.
  const auto split_path = dir.path() / "split.jsonl";
  rc = run_command(train_bin() + " preprocess --data_path " + data.string() + " --tokenizer " + tok_dir.string() +
                       " --output " + split_path.string() + " --packing True --packing_strategy bfd_split 2>&1",
                   &out);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("--packing_strategy bfd_split"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(split_path));
  // --shuffle_dataset: the same examples in datasets' shuffle order (data/shuffle.h) for --seed.
  const auto shuffled_path = dir.path() / "shuffled.jsonl";
  rc = run_command(train_bin() + " preprocess --data_path " + data.string() + " --model_name_or_path " +
                       tok_dir.string() + " --output " + shuffled_path.string() +
                       " --model_max_length 40 --shuffle_dataset True --seed 7 2>&1",
                   &out);
  ASSERT_EQ(rc, 0) << out;
  const auto shuffled = read_lines(shuffled_path);
  const auto perm = numpy_permutation(7, static_cast<int64_t>(lines.size()));
  ASSERT_EQ(shuffled.size(), lines.size());
  for (size_t i = 0; i < shuffled.size(); ++i) EXPECT_EQ(shuffled[i], lines[static_cast<size_t>(perm[i])]) << i;
  EXPECT_NE(shuffled[0], lines[0]);
}

// --dataset_text_field (TRL's dataset_text_field): text rows read from the named field give the
// examples the same texts give under "text"; an empty name is a usage error before anything is written.
TEST(Preprocess, TextFieldFlagReadsTheNamedField) {
  TempDir dir("preprocess_text_field");
  const auto text = dir.path() / "text.jsonl", body = dir.path() / "body.jsonl";
  {
    std::ofstream t(text), b(body);
    for (const char* s : {"Alpacas hum.", "Llamas and alpacas are camelids.", "  spaces\tand a tab"}) {
      t << nlohmann::json{{"text", s}}.dump() << "\n";
      b << nlohmann::json{{"body", s}, {"text", "not this one"}}.dump() << "\n";
    }
  }
  const auto tok_dir = source_dir() / "data/tokenizer";
  auto preprocess = [&](const std::filesystem::path& data, const std::string& extra, const std::filesystem::path& out_path,
                        std::string* out) {
    return run_command(train_bin() + " preprocess --data_path " + data.string() + " --tokenizer " + tok_dir.string() +
                           " --output " + out_path.string() + extra + " 2>&1",
                       out);
  };
  std::string out;
  ASSERT_EQ(preprocess(text, "", dir.path() / "a.jsonl", &out), 0) << out;
  ASSERT_EQ(preprocess(body, " --dataset_text_field body", dir.path() / "b.jsonl", &out), 0) << out;
  const auto a = read_lines(dir.path() / "a.jsonl"), b = read_lines(dir.path() / "b.jsonl");
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a, b);
  // Without the flag the "text" decoy is read: different tokens.
  ASSERT_EQ(preprocess(body, "", dir.path() / "c.jsonl", &out), 0) << out;
  EXPECT_NE(read_lines(dir.path() / "c.jsonl"), a);
  EXPECT_NE(preprocess(body, " --dataset_text_field ''", dir.path() / "d.jsonl", &out), 0) << out;
  EXPECT_NE(out.find("--dataset_text_field is empty"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "d.jsonl"));
}

// Tokenized rows (TRL's processed datasets) are written as given, no EOS added, cut at
// --model_max_length; an id outside the tokenizer is an error naming the row, before anything is written.
TEST(Preprocess, TokenizedRowsPassThrough) {
  TempDir dir("preprocess_tokenized");
  const auto data = dir.path() / "ids.jsonl", bad = dir.path() / "bad.jsonl";
  std::ofstream(data) << R"({"input_ids": [10, 11, 12, 13, 14, 15], "labels": [-100, -100, 12, 13, 14, 15]})" << "\n"
                      << R"({"input_ids": [20, 21], "labels": [20, 21]})" << "\n";
  std::ofstream(bad) << R"({"input_ids": [10, 11]})" << "\n" << R"({"input_ids": [10, 99999]})" << "\n";
  const auto tok_dir = source_dir() / "data/tokenizer";
  std::string out;
  const auto out_path = dir.path() / "out.jsonl";
  ASSERT_EQ(run_command(train_bin() + " preprocess --data_path " + data.string() + " --tokenizer " + tok_dir.string() +
                            " --output " + out_path.string() + " --model_max_length 4 2>&1",
                        &out),
            0)
      << out;
  const auto lines = read_lines(out_path);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["input_ids"].get<std::vector<int64_t>>(), (std::vector<int64_t>{10, 11, 12, 13}));
  EXPECT_EQ(lines[0]["labels"].get<std::vector<int64_t>>(), (std::vector<int64_t>{-100, -100, 12, 13}));
  EXPECT_EQ(lines[1]["input_ids"].get<std::vector<int64_t>>(), (std::vector<int64_t>{20, 21}));
  // TRL's --max_length is the same flag.
  const auto alias_path = dir.path() / "alias.jsonl";
  ASSERT_EQ(run_command(train_bin() + " preprocess --data_path " + data.string() + " --tokenizer " + tok_dir.string() +
                            " --output " + alias_path.string() + " --max_length 4 2>&1",
                        &out),
            0)
      << out;
  EXPECT_EQ(read_lines(alias_path), lines);
  const auto bad_out = dir.path() / "bad_out.jsonl";
  EXPECT_NE(run_command(train_bin() + " preprocess --data_path " + bad.string() + " --tokenizer " + tok_dir.string() +
                            " --output " + bad_out.string() + " 2>&1",
                        &out),
            0);
  EXPECT_NE(out.find("row 1: \"input_ids\"[1] is 99999, outside the tokenizer's"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(bad_out));
}

TEST(Preprocess, BadInputFailsWithoutWriting) {
  TempDir dir("preprocess_bad");
  const auto bad = dir.path() / "bad.json";
  std::ofstream(bad) << R"([{"instruction": "a", "output": "b"}, {"instruction": 1, "output": "b"}])";
  const auto out_path = dir.path() / "tokens.jsonl";
  std::string out;
  int rc = run_command(train_bin() + " preprocess --data_path " + bad.string() + " --tokenizer " +
                           (source_dir() / "data/tokenizer").string() + " --output " +
                           out_path.string() + " 2>&1",
                       &out);
  EXPECT_EQ(rc, 1) << out;  // a user error: the message alone, no source file:line
  EXPECT_NE(out.find("alpaca-train: error: " + bad.string() + ": field \"instruction\" of record 1"), std::string::npos)
      << out;
  EXPECT_EQ(out.find(".cpp:"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(out_path));
  rc = run_command(train_bin() + " preprocess --data_path " + bad.string() + " --output " +
                       out_path.string() + " 2>&1",
                   &out);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("--model_name_or_path"), std::string::npos) << out;
}

// Conversation data follows TRL's SFTTrainer rather than train.py: no special token is added (the
// tokenizer's eos pads), rows keep their keys in file order when the template prints them (tool
// arguments, schemas), ShareGPT may name the roles user/assistant, a template that is not
// prefix-stable still truncates (TRL's plain cut) without --assistant_only_loss, and
// --assistant_only_loss on data without conversations is an error (TRL raises too).
TEST(Preprocess, ConversationDataFollowsTrl) {
  TempDir dir("preprocess_trl");
  const auto tok_dir = source_dir() / "data/tokenizer";
  Tokenizer tok = Tokenizer::load(tok_dir.string());
  const int64_t vocab = tok.vocab_size();
  const auto tmpl = dir.path() / "t.jinja";
  std::ofstream(tmpl) << "{% for m in messages %}{{ m.role }}: {{ m.content }}{% if m.tool_calls %} "
                         "{{ m.tool_calls[0].function.arguments | tojson }}{% endif %}\n{% endfor %}";
  std::ofstream(dir.path() / "m.jsonl")
      << R"({"messages": [{"role": "user", "content": "weather"}, {"role": "assistant", "content": "ok", )"
      << R"("tool_calls": [{"type": "function", "function": {"name": "w", "arguments": {"unit": "c", "city": "paris"}}}]}]})" << "\n";
  std::ofstream(dir.path() / "s.jsonl")
      << R"({"conversations": [{"from": "user", "value": "weather"}, {"from": "assistant", "value": "ok"}]})" << "\n";
  std::string out;
  auto preprocess = [&](const std::string& data, const std::string& extra, const std::filesystem::path& to) {
    return run_command(train_bin() + " preprocess --data_path " + (dir.path() / data).string() + " --tokenizer " +
                           tok_dir.string() + " --chat_template " + tmpl.string() + " --output " + to.string() + " " +
                           extra + " 2>&1", &out);
  };
  ASSERT_EQ(preprocess("m.jsonl", "", dir.path() / "m.out"), 0) << out;
  EXPECT_NE(out.find("vocab " + std::to_string(vocab) + ", pad id " + std::to_string(tok.eos_id())), std::string::npos)
      << "no [PAD] added; the eos pads, as TRL:\n" << out;
  const auto ids = read_lines(dir.path() / "m.out").at(0)["input_ids"].get<std::vector<int64_t>>();
  // (trim_blocks, as transformers renders: the newline after {% endif %} goes.)
  EXPECT_EQ(ids, tok.encode("user: weatherassistant: ok {\"unit\": \"c\", \"city\": \"paris\"}", false))
      << "the arguments' keys in the file's order";
  ASSERT_EQ(preprocess("s.jsonl", "", dir.path() / "s.out"), 0) << out;
  EXPECT_EQ(read_lines(dir.path() / "s.out").at(0)["input_ids"].get<std::vector<int64_t>>(),
            tok.encode("user: weatherassistant: ok", false));
  // Not prefix-stable: the last message renders differently, so no assistant span can be found by
  // prefix rendering; a fully trained row still cuts at --model_max_length as TRL does.
  std::ofstream(tmpl) << "{% for m in messages %}{% if loop.last %}LAST {% endif %}{{ m.role }}: {{ m.content }}\n{% endfor %}";
  ASSERT_EQ(preprocess("s.jsonl", "--model_max_length 4", dir.path() / "cut.out"), 0) << out;
  const auto cut = read_lines(dir.path() / "cut.out").at(0);
  EXPECT_EQ(cut["input_ids"].size(), 4u);
  EXPECT_EQ(cut["labels"], cut["input_ids"]);
  // --assistant_only_loss on Alpaca records: nothing it could act on.
  std::ofstream(dir.path() / "a.json") << R"([{"instruction": "a", "input": "", "output": "b"}])";
  EXPECT_NE(preprocess("a.json", "--assistant_only_loss True", dir.path() / "a.out"), 0);
  EXPECT_NE(out.find("--assistant_only_loss True needs conversation rows"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "a.out"));
  // TRL's --eos_token: text rows end with it (and the tokenizer, without a pad, pads with it); a
  // token the vocabulary lacks is refused naming the flag, nothing written.
  std::ofstream(dir.path() / "t.jsonl") << R"({"text": "hello"})" << "\n";
  ASSERT_EQ(preprocess("t.jsonl", "--eos_token '<s>'", dir.path() / "t.out"), 0) << out;
  EXPECT_EQ(read_lines(dir.path() / "t.out").at(0)["input_ids"].back(), tok.bos_id()) << "ends with the new eos <s>";
  EXPECT_NE(out.find("pad id " + std::to_string(tok.bos_id())), std::string::npos) << out;
  ASSERT_EQ(preprocess("t.jsonl", "", dir.path() / "t0.out"), 0) << out;
  EXPECT_EQ(read_lines(dir.path() / "t0.out").at(0)["input_ids"].back(), tok.eos_id());
  EXPECT_EQ(preprocess("t.jsonl", "--eos_token '<|nope|>'", dir.path() / "t1.out"), 1) << out;
  EXPECT_NE(out.find("--eos_token '<|nope|>' is not in the vocabulary of"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "t1.out"));
}

}  // namespace
}  // namespace alpaca::data::test_preprocess
