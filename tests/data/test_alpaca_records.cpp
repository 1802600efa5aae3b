// Alpaca record loading (strict errors naming file, record and line:column) and the prompt
// templates + label masking of train.py.
#include <gtest/gtest.h>

#include <fstream>

#include "alpaca/data/alpaca_example.h"
#include "alpaca/data/alpaca_record.h"
#include "alpaca/util/error.h"
#include "test_util.h"

namespace alpaca::data::test_alpaca_records {
using tokenizer::Tokenizer;
namespace {

using ::alpaca::testing::TempDir;

// The error message of loading `text` from a file named `name`, or "" if it loaded.
std::string load_error(const std::string& text, const std::string& name = "data.json") {
  TempDir dir("records");
  auto path = dir.path() / name;
  std::ofstream(path, std::ios::binary) << text;
  try {
    load_alpaca_records(path.string());
  } catch (const Error& e) {
    EXPECT_NE(e.message().find(path.string()), std::string::npos)
        << "error does not name the file: " << e.message();
    return e.message();
  }
  return "";
}

void expect_contains(const std::string& s, const std::string& part) {
  EXPECT_NE(s.find(part), std::string::npos) << "'" << part << "' not in: " << s;
}

TEST(AlpacaRecords, LoadsArrayAndJsonLines) {
  TempDir dir("records_ok");
  auto arr = dir.path() / "a.json";
  std::ofstream(arr) << R"([{"instruction": "i0", "input": "x", "output": "o0"},
                            {"instruction": "i1", "output": "o1", "extra": 3}])";
  auto recs = load_alpaca_records(arr.string());
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[0].input, "x");
  EXPECT_EQ(recs[1].input, "");  // missing input = "" as in train.py
  EXPECT_EQ(recs[1].output, "o1");

  auto jsonl = dir.path() / "b.jsonl";
  std::ofstream(jsonl) << "{\"instruction\": \"i0\", \"output\": \"o0\"}\n\n"
                          "{\"instruction\": \"\\u00e9\", \"input\": \"\", \"output\": \"o1\"}\n";
  recs = load_alpaca_records(jsonl.string());
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[1].instruction, "\xC3\xA9");
}

TEST(AlpacaRecords, MalformedJsonNamesLineAndColumn) {
  std::string msg = load_error("[\n {\"instruction\": \"a\", \"output\": \"b\"},\n {\"instruction\": x}\n]");
  expect_contains(msg, "line 3");
  expect_contains(msg, "column 18");
  expect_contains(msg, "record 1");
  msg = load_error("{\"instruction\": \"a\", \"output\": \"b\"}\n{\"instruction\": \"a\",,}\n",
                   "data.jsonl");
  expect_contains(msg, "line 2");
  expect_contains(msg, "record 1");
  expect_contains(msg, "column");
}

TEST(AlpacaRecords, BadRecordsNameTheRecordIndex) {
  const std::string ok = R"({"instruction": "a", "output": "b"})";
  std::string msg = load_error("[" + ok + ", 5]");
  expect_contains(msg, "record 1");
  expect_contains(msg, "expected an object");
  msg = load_error("[" + ok + "," + ok + R"(, {"output": "b"}])");
  expect_contains(msg, "record 2");
  expect_contains(msg, "\"instruction\"");
  msg = load_error("[" + ok + R"(, {"instruction": "a"}])");
  expect_contains(msg, "record 1");
  expect_contains(msg, "\"output\"");
  msg = load_error(R"([{"instruction": "a", "input": 3, "output": "b"}])");
  expect_contains(msg, "record 0");
  expect_contains(msg, "\"input\"");
  expect_contains(msg, "expected a string");
  // null is absent (as the same row read from Parquet): a null input is the no-input prompt, a null
  // output a missing one.
  const auto null_input = parse_alpaca_records(R"([{"instruction": "a", "input": null, "output": "b"}])", "d.json");
  ASSERT_EQ(null_input.size(), 1u);
  EXPECT_EQ(null_input[0].input, "");
  msg = load_error(R"([{"instruction": "a", "output": null}])");
  expect_contains(msg, "\"output\"");
  expect_contains(msg, "record 0");
  msg = load_error(ok + "\n" + R"({"instruction": ["a"], "output": "b"})", "data.jsonl");
  expect_contains(msg, "record 1");
  expect_contains(msg, "\"instruction\"");
}

TEST(AlpacaRecords, InvalidUtf8AndEmpty) {
  std::string msg = load_error("[{\"instruction\": \"a\", \"output\": \"b\"},\n"
                               " {\"instruction\": \"bad \xC3\x28\", \"output\": \"b\"}]");
  expect_contains(msg, "UTF-8");
  expect_contains(msg, "record 1");
  expect_contains(msg, "line 2");
  msg = load_error("{\"instruction\": \"\xFF\", \"output\": \"b\"}\n", "data.jsonl");
  expect_contains(msg, "UTF-8");
  expect_contains(msg, "record 0");
  expect_contains(load_error("[]"), "no records");
  expect_contains(load_error(""), "empty");
  expect_contains(load_error("\n  \n"), "empty");
  EXPECT_THROW(load_alpaca_records("/nonexistent/alpaca.json"), Error);
}

TEST(AlpacaPrompt, TemplatesAreExact) {
  AlpacaRecord with{"Add.", "1 2", "3"};
  EXPECT_EQ(format_alpaca_prompt(with),
            "Below is an instruction that describes a task, paired with an input that provides "
            "further context. Write a response that appropriately completes the request.\n\n"
            "### Instruction:\nAdd.\n\n### Input:\n1 2\n\n### Response:");
  AlpacaRecord without{"Say {hi}.", "", "hi"};
  EXPECT_EQ(format_alpaca_prompt(without),
            "Below is an instruction that describes a task. Write a response that appropriately "
            "completes the request.\n\n### Instruction:\nSay {hi}.\n\n### Response:");
}

TEST(AlpacaPrompt, LabelsMaskThePromptAndTruncateRight) {
  ALPACA_REQUIRE_SHARED("data/llama2-tokenizer/tokenizer.model");
  Tokenizer tok =
      Tokenizer::load((::alpaca::testing::shared_dir() / "data/llama2-tokenizer").string());
  std::vector<AlpacaRecord> recs = {{"Say hi.", "", "Hello there"}, {"Count.", "1 2", "3"}};
  for (int i = 0; i < 200; ++i) recs.push_back({"Repeat " + std::to_string(i), "", "ok"});
  TokenizeStats stats;
  auto ex = tokenize_alpaca(recs, tok, 512, 2, &stats);
  ASSERT_EQ(ex.size(), recs.size());
  std::string source = format_alpaca_prompt(recs[0]);
  auto full = tok.encode(source + "Hello there</s>");
  auto src = tok.encode(source);
  EXPECT_EQ(ex[0].input_ids, full);
  EXPECT_EQ(ex[0].input_ids.back(), tok.eos_id());
  for (size_t t = 0; t < full.size(); ++t)
    EXPECT_EQ(ex[0].labels[t], t < src.size() ? kIgnoreIndex : full[t]) << t;
  EXPECT_EQ(stats.num_truncated, 0);
  EXPECT_EQ(stats.num_no_label_tokens, 0);
  // Threads do not change the result.
  auto serial = tokenize_alpaca(recs, tok, 512, 1);
  for (size_t i = 0; i < recs.size(); ++i) EXPECT_EQ(serial[i].input_ids, ex[i].input_ids);

  // Truncation: window shorter than the prompt -> every label masked, EOS lost.
  auto cut = tokenize_alpaca({recs[0]}, tok, 10, 1, &stats);
  EXPECT_EQ(cut[0].input_ids, std::vector<int64_t>(full.begin(), full.begin() + 10));
  EXPECT_EQ(cut[0].labels, std::vector<int64_t>(10, kIgnoreIndex));
  EXPECT_EQ(stats.num_truncated, 1);
  EXPECT_EQ(stats.num_no_label_tokens, 1);
  // Window that cuts inside the answer keeps the answer's first tokens as labels.
  int64_t n = static_cast<int64_t>(src.size()) + 1;
  cut = tokenize_alpaca({recs[0]}, tok, n, 1, &stats);
  EXPECT_EQ(cut[0].labels.back(), full[n - 1]);
  EXPECT_EQ(stats.num_no_label_tokens, 0);
  EXPECT_THROW(tokenize_alpaca(recs, tok, 0, 1), Error);
}

}  // namespace
}  // namespace alpaca::data::test_alpaca_records
