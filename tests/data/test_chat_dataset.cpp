// Dataset formats and files (issue 28): the same rows written by tests/reference/
// chat_dataset_reference.py as JSON, JSON Lines, Parquet (pyarrow), a datasets.save_to_disk
// directory and a JSONL + Parquet pair normalise to exactly the rows the reference computed
// (the template context byte for byte); and every kind of bad input is an error naming the file,
// the row and the fix.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "alpaca/data/conversation.h"
#include "alpaca/util/error.h"
#include "test_util.h"

namespace alpaca::data::test_chat_dataset {
namespace {

namespace fs = std::filesystem;
using ::alpaca::testing::TempDir;

fs::path fixture() { return ::alpaca::testing::binary_dir() / "fixtures" / "chat_dataset"; }

void expect_row(const ConversationRow& got, const nlohmann::json& want, const std::string& where) {
  EXPECT_EQ(dataset_format_name(got.format), want["format"].get<std::string>()) << where;
  EXPECT_EQ(got.conversation_json, want["conversation_json"].get<std::string>()) << where;
  std::vector<char> train;
  for (const auto& t : want["train"]) train.push_back(t.get<bool>() ? 1 : 0);
  EXPECT_EQ(got.train_message, train) << where;
  EXPECT_EQ(got.num_prompt_messages, want["num_prompt_messages"].get<int64_t>()) << where;
  EXPECT_EQ(got.prompt, want["prompt"].get<std::string>()) << where;
  EXPECT_EQ(got.completion, want["completion"].get<std::string>()) << where;
  if (!want["alpaca"].is_null()) {
    EXPECT_EQ(got.alpaca.instruction, want["alpaca"][0].get<std::string>()) << where;
    EXPECT_EQ(got.alpaca.input, want["alpaca"][1].get<std::string>()) << where;
    EXPECT_EQ(got.alpaca.output, want["alpaca"][2].get<std::string>()) << where;
  }
}

TEST(ChatDataset, EveryFileKindGivesTheReferenceRows) {
  ALPACA_SKIP_IF_FIXTURE_SKIPPED(fixture());
  int64_t compared = 0;
  for (const char* name_c : {"alpaca", "messages", "sharegpt", "pc_text", "pc_messages"}) {
    const std::string name = name_c;
    nlohmann::json want;
    std::ifstream(fixture() / (name + ".expected.json")) >> want;
    ASSERT_GT(want.size(), 300u) << name;
    const std::string base = (fixture() / name).string();
    for (const std::string& paths : {base + ".json", base + ".jsonl", base + ".parquet", base + "_disk",
                                    base + "_a.jsonl," + base + "_b.parquet"}) {
      SCOPED_TRACE(paths);
      Dataset d = load_dataset(paths);
      ASSERT_EQ(d.rows.size(), want.size());
      for (const auto& [path, format] : d.files)
        EXPECT_EQ(dataset_format_name(format), want[0]["format"].get<std::string>()) << path;
      for (size_t i = 0; i < want.size(); ++i) expect_row(d.rows[i], want[i], d.rows[i].source);
      compared += static_cast<int64_t>(want.size());
      // The detected format and an explicit one agree.
      Dataset forced = load_dataset(paths, parse_dataset_format(want[0]["format"].get<std::string>()));
      ASSERT_EQ(forced.rows.size(), want.size());
      EXPECT_EQ(forced.rows.back().conversation_json, d.rows.back().conversation_json);
    }
  }
  std::cout << "compared " << compared << " rows (5 datasets x 5 file kinds) with the reference\n";
}

TEST(ChatDataset, AlpacaRowsAreTheAlpacaLoadersRecords) {
  ALPACA_SKIP_IF_FIXTURE_SKIPPED(fixture());
  const std::string json = (fixture() / "alpaca.json").string();
  const auto expect = load_alpaca_records(json);
  for (const std::string& path : {json, (fixture() / "alpaca.parquet").string(), (fixture() / "alpaca_disk").string()}) {
    Dataset d = load_dataset(path);
    ASSERT_TRUE(d.all_alpaca()) << path;
    const auto got = d.alpaca_records();
    ASSERT_EQ(got.size(), expect.size()) << path;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].instruction, expect[i].instruction) << path << " " << i;
      EXPECT_EQ(got[i].input, expect[i].input) << path << " " << i;
      EXPECT_EQ(got[i].output, expect[i].output) << path << " " << i;
    }
  }
}

// CSV (a header row): pandas' DataFrame.to_csv of the Alpaca and prompt-completion rows, and a
// hand-written file with quoted commas, doubled quotes, newlines and CRLF inside fields, a BOM, a
// blank line, empty cells, "NA" / "null" / "n/a" cells, an extra column and non-ASCII text. Every
// cell is its text (the reference checked that datasets reads the same but for the cells pandas
// makes missing); the Alpaca rows are those of the JSON file the CSV was written from.
TEST(ChatDataset, CsvRowsAreTheirCellsText) {
  ALPACA_SKIP_IF_FIXTURE_SKIPPED(fixture());
  for (const char* name : {"tricky", "alpaca", "pc_text"}) {
    SCOPED_TRACE(name);
    nlohmann::json want;
    std::ifstream(fixture() / (std::string(name) + "_csv.expected.json")) >> want;
    ASSERT_GE(want.size(), 7u);
    Dataset d = load_dataset((fixture() / (std::string(name) + ".csv")).string());
    ASSERT_EQ(d.rows.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) expect_row(d.rows[i], want[i], d.rows[i].source);
  }
  Dataset tricky = load_dataset((fixture() / "tricky.csv").string());
  ASSERT_TRUE(tricky.all_alpaca());
  const auto t = tricky.alpaca_records();
  EXPECT_EQ(t[2].instruction, "Quote \"this\"");
  EXPECT_EQ(t[2].output, "multi\nline\r\nanswer");
  EXPECT_EQ(t[3].input, "NA");      // pandas: missing
  EXPECT_EQ(t[4].output, "3.50");   // pandas (a numbers-only column): 3.5
  EXPECT_EQ(t[5].input, "  spaced  ");
  const auto from_json = load_alpaca_records((fixture() / "alpaca.json").string());
  const auto from_csv = load_dataset((fixture() / "alpaca.csv").string()).alpaca_records();
  ASSERT_EQ(from_csv.size(), from_json.size());
  for (size_t i = 0; i < from_csv.size(); ++i) {
    EXPECT_EQ(from_csv[i].instruction, from_json[i].instruction) << i;
    EXPECT_EQ(from_csv[i].input, from_json[i].input) << i;
    EXPECT_EQ(from_csv[i].output, from_json[i].output) << i;
  }
}

TEST(ChatDataset, PeekNamesEachFilesFormat) {
  ALPACA_SKIP_IF_FIXTURE_SKIPPED(fixture());
  const std::string paths = (fixture() / "alpaca.jsonl").string() + "," + (fixture() / "sharegpt_disk").string() +
                            "," + (fixture() / "pc_messages.parquet").string();
  FileFormats f = peek_dataset_formats(paths);
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[0].second, DatasetFormat::kAlpaca);
  EXPECT_EQ(f[1].second, DatasetFormat::kShareGpt);
  EXPECT_EQ(f[2].second, DatasetFormat::kPromptCompletion);
}

// The error of loading `text` written to a file named `name` (with `format`), or "" if it loaded.
std::string load_error(const std::string& text, const std::string& name = "d.jsonl", const RowFormat& format = {}) {
  TempDir dir("chat_bad");
  const auto path = dir.path() / name;
  std::ofstream(path, std::ios::binary) << text;
  try {
    load_dataset(path.string(), format);
  } catch (const Error& e) {
    EXPECT_NE(e.message().find(path.string()), std::string::npos) << "error does not name the file: " << e.message();
    return e.message();
  }
  return "";
}

#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << "'" << (part) << "' not in: " << (msg)

// TRL's language-modelling rows {"text"}: detected after Alpaca (the hub's tatsu-lab/alpaca rows carry
// a formatted "text" beside instruction/output and stay Alpaca records).
TEST(ChatDataset, TextRowsAreLanguageModellingRowsAfterAlpaca) {
  TempDir dir("chat_text");
  const auto text = dir.path() / "t.jsonl", alpaca = dir.path() / "a.jsonl";
  std::ofstream(text) << R"({"text": "one"})" << "\n" << R"({"text": "two", "source": "x"})" << "\n";
  std::ofstream(alpaca) << R"({"instruction": "i", "input": "", "output": "o", "text": "### Instruction: i"})" << "\n";
  const Dataset d = load_dataset(text.string() + "," + alpaca.string());
  ASSERT_EQ(d.rows.size(), 3u);
  EXPECT_EQ(d.rows[0].format, DatasetFormat::kText);
  EXPECT_EQ(d.rows[1].completion, "two");
  EXPECT_TRUE(d.rows[1].prompt.empty());
  EXPECT_FALSE(d.rows[1].is_conversational());
  EXPECT_EQ(d.rows[2].format, DatasetFormat::kAlpaca);
  EXPECT_EQ(parse_dataset_format("text"), DatasetFormat::kText);
  EXPECT_HAS(load_error(R"({"text": ["a"]})"), "row 0: \"text\" is a array, expected a string");
  EXPECT_HAS(load_error(R"({"text": "a"})" "\n" R"({"body": "b"})"), "row 1 has no \"text\" field");
}

// TRL's dataset_text_field (--dataset_text_field): the text of a language-modelling row in another
// field, detected by that field, a "text" beside it ignored; errors name the field and the flag.
TEST(ChatDataset, TextFieldNamesTheColumnOfTextRows) {
  TempDir dir("chat_text_field");
  const auto body = dir.path() / "b.jsonl";
  std::ofstream(body) << R"({"body": "one", "text": "not this"})" << "\n" << R"({"body": "two"})" << "\n";
  const RowFormat field = parse_row_format("auto", "body");
  const Dataset d = load_dataset(body.string(), field);
  ASSERT_EQ(d.rows.size(), 2u);
  EXPECT_EQ(d.rows[0].format, DatasetFormat::kText);
  EXPECT_EQ(d.rows[0].completion, "one");
  EXPECT_EQ(d.rows[1].completion, "two");
  EXPECT_EQ(peek_dataset_formats(body.string(), field).at(0).second, DatasetFormat::kText);
  EXPECT_FALSE(follows_train_py_tokens(body.string(), "", field));  // TRL's token rule, as for "text"
  // The same rows under the default field: "text" is read, and row 1 has none.
  EXPECT_HAS(load_error(R"({"body": "one", "text": "t"})" "\n" R"({"body": "two"})"), "row 1 has no \"text\" field");
  // Named format, field missing: the error names the field and the flag.
  EXPECT_HAS(load_error(R"({"text": "a"})", "d.jsonl", parse_row_format("text", "body")),
             "row 0 has no \"body\" field; every row of a text dataset needs one (--dataset_text_field)");
  // Detection: rows of neither kind list the field that was looked for.
  const std::string m = load_error(R"({"text": "a"})", "d.jsonl", field);
  EXPECT_HAS(m, "match no dataset format");
  EXPECT_HAS(m, "text rows here: {body}");
  EXPECT_HAS(m, "--dataset_text_field");
  // Other formats are detected first, as TRL checks messages / prompt-completion first.
  EXPECT_EQ(parse_dataset_rows(R"({"messages": [{"role": "user", "content": "hi"}], "body": "b"})", "m", field)
                .at(0)
                .format,
            DatasetFormat::kMessages);
  EXPECT_THROW(parse_row_format("auto", ""), Error);
}

// Rows already tokenized (TRL: an input_ids column skips tokenization), detected before every other
// format; labels and masks one per token, masks 0/1 (or booleans); pre-packed rows refused.
TEST(ChatDataset, TokenizedRowsAreReadAsGiven) {
  const auto rows = parse_dataset_rows(
      R"({"input_ids": [5, 6, 7], "completion_mask": [0, 1, 1], "messages": "ignored", "text": "ignored"})" "\n"
      R"({"input_ids": [8], "completion_mask": [true]})",
      "t.jsonl");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].format, DatasetFormat::kTokenized);
  EXPECT_EQ(rows[0].token_ids, (std::vector<int64_t>{5, 6, 7}));
  EXPECT_EQ(rows[0].completion_mask, (std::vector<char>{0, 1, 1}));
  EXPECT_TRUE(rows[0].assistant_masks.empty());
  EXPECT_TRUE(rows[0].token_labels.empty());
  EXPECT_EQ(rows[1].completion_mask, (std::vector<char>{1}));
  const auto labelled = parse_dataset_rows(R"({"input_ids": [1, 2], "labels": [-100, 2]})", "l.jsonl");
  EXPECT_EQ(labelled.at(0).token_labels, (std::vector<int64_t>{-100, 2}));
  EXPECT_EQ(parse_dataset_format("tokenized"), DatasetFormat::kTokenized);
  EXPECT_TRUE(is_dataset_format_name("tokenized"));
  EXPECT_FALSE(is_dataset_format_name("tokenised"));
  EXPECT_HAS(load_error(R"({"input_ids": []})"), "row 0: \"input_ids\" is empty");
  EXPECT_HAS(load_error(R"({"input_ids": "1 2"})"), "\"input_ids\" is a string, expected a list of integers");
  EXPECT_HAS(load_error(R"({"input_ids": [1, 2.5]})"), "\"input_ids\"[1] is a number, expected an integer");
  EXPECT_HAS(load_error(R"({"input_ids": [1, -3]})"), "\"input_ids\"[1] is -3, a negative id");
  EXPECT_HAS(load_error(R"({"input_ids": [1, 2], "labels": [1]})"), "\"labels\" has 1 entries and \"input_ids\" 2");
  EXPECT_HAS(load_error(R"({"input_ids": [1, 2], "labels": [1, -1]})"), "\"labels\"[1] is -1; a label is an id or -100");
  EXPECT_HAS(load_error(R"({"input_ids": [1, 2], "assistant_masks": [1, 2]})"), "\"assistant_masks\"[1] is 2, expected 0 or 1");
  EXPECT_HAS(load_error(R"({"input_ids": [1, 2], "completion_mask": [1]})"), "\"completion_mask\" has 1 entries");
  EXPECT_HAS(load_error(R"({"input_ids": [1, 2], "seq_lengths": [2]})"), "rows packed beforehand are not read");
  EXPECT_HAS(load_error(R"({"input_ids": [1]})" "\n" R"({"messages": []})"), "row 1: \"input_ids\" is missing");
}

// TRL passes a row's chat_template_kwargs to apply_chat_template: they join the template context
// (over the row's tools), nulls left out as everywhere; apply_chat_template's own arguments are
// refused. The rendering itself is checked against SFTTrainer in test_conversation_masks.
TEST(ChatDataset, ChatTemplateKwargsBecomeTemplateVariables) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}])";
  std::vector<ConversationRow> rows;  // one format per file: one parse per row
  for (const std::string& row :
       {"{" + msgs + R"(, "tools": [{"name": "a"}], "chat_template_kwargs": {"enable_thinking": false, "tools": "[{\"name\": \"b\"}]", "x": {"y": null, "z": 1}, "gone": null}})",
        std::string(R"({"prompt": [{"role": "user", "content": "p"}], "completion": [{"role": "assistant", "content": "c"}], "chat_template_kwargs": {"reasoning_effort": "low"}})"),
        std::string(R"({"prompt": "p", "completion": "c", "chat_template_kwargs": {"enable_thinking": false}})")})
    rows.push_back(parse_dataset_rows(row, "k.jsonl").at(0));
  const auto ctx = nlohmann::json::parse(rows[0].conversation_json);
  EXPECT_EQ(ctx["enable_thinking"], false);
  EXPECT_EQ(ctx["tools"], nlohmann::json::parse(R"([{"name": "b"}])"));  // the kwargs' tools win, parsed
  EXPECT_EQ(ctx["x"], nlohmann::json::parse(R"({"z": 1})"));
  EXPECT_FALSE(ctx.contains("gone"));
  EXPECT_EQ(nlohmann::json::parse(rows[1].conversation_json)["reasoning_effort"], "low");
  EXPECT_TRUE(rows[2].conversation_json.empty());  // string prompts: no template, as in TRL
  // TRL merges {"tools": row's, **chat_template_kwargs}: a null "tools" there takes the row's away.
  EXPECT_FALSE(nlohmann::json::parse(
                   parse_dataset_rows("{" + msgs + R"(, "tools": [{"name": "a"}], "chat_template_kwargs": {"tools": null}})",
                                      "k.jsonl")
                       .at(0)
                       .conversation_json)
                   .contains("tools"));

  EXPECT_HAS(load_error("{" + msgs + R"(, "chat_template_kwargs": "enable_thinking=False"})"),
             "row 0: \"chat_template_kwargs\" is a string, expected an object of template variables");
  for (const char* key : {"add_generation_prompt", "messages", "chat_template", "continue_final_message"})
    EXPECT_HAS(load_error("{" + msgs + R"(, "chat_template_kwargs": {")" + key + R"(": true}})"),
               std::string("\"chat_template_kwargs\" sets \"") + key + "\", which is not a template variable");
  EXPECT_HAS(load_error("{" + msgs + R"(, "chat_template_kwargs": {"tools": 3}})"), "\"tools\" is a number");
}

TEST(ChatDataset, BadRowsAreErrorsNamingTheRow) {
  std::string m = load_error(R"({"question": "q", "answer": "a"})");
  EXPECT_HAS(m, "match no dataset format");
  EXPECT_HAS(m, "[question, answer]");
  EXPECT_HAS(m, "sharegpt {conversations");
  EXPECT_HAS(m, "--dataset_format");

  const std::string ok = R"({"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]})";
  m = load_error(ok + "\n" + R"({"messages": [{"content": "u"}]})");
  EXPECT_HAS(m, "row 1, messages[0]: message has no \"role\"");
  m = load_error(ok + "\n" + R"({"messages": [{"role": "user"}]})");
  EXPECT_HAS(m, "row 1, messages[0]: message has no \"content\"");
  m = load_error(R"({"messages": [{"role": "robot", "content": "x"}]})");
  EXPECT_HAS(m, "row 0, messages[0]: unknown role \"robot\"; known roles: system, developer, user, assistant, tool, ipython");
  m = load_error(ok + "\n" + ok + "\n" + R"({"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": null}]})");
  EXPECT_HAS(m, "row 2, messages[1]: an assistant turn with no content");
  m = load_error(R"({"messages": [{"role": "user", "content": "u", "train": "no"}]})");
  EXPECT_HAS(m, "\"train\" is a string, expected true or false");
  m = load_error(ok + "\n" + R"({"prompt": "p", "completion": "c"})");
  EXPECT_HAS(m, "row 1 has no \"messages\" field");
  m = load_error(R"({"messages": []})");
  EXPECT_HAS(m, "row 0: \"messages\" is empty");

  m = load_error(R"({"conversations": [{"from": "human", "value": "h"}, {"from": "bot", "value": "b"}]})");
  EXPECT_HAS(m, "row 0, conversations[1]: unknown role (\"from\") \"bot\"");
  m = load_error(R"({"conversations": [{"from": "gpt", "value": "b"}]})");
  EXPECT_HAS(m, "\"gpt\" where a human or observation turn belongs");
  m = load_error(R"({"conversations": [{"from": "human", "value": "h"}, {"from": "gpt"}]})");
  EXPECT_HAS(m, "an assistant turn (gpt) with no \"value\"");
  m = load_error(R"({"conversations": [{"from": "human", "value": "h"}, {"from": "function_call", "value": "not json"}]})");
  EXPECT_HAS(m, "a function_call's value is not JSON");

  m = load_error(R"({"prompt": "p", "completion": [{"role": "assistant", "content": "c"}]})");
  EXPECT_HAS(m, "give both as strings or both as lists");
  m = load_error(R"({"prompt": "p"})");
  EXPECT_HAS(m, "row 0 has no \"completion\" field");

  m = load_error(R"({"instruction": "i", "output": "o"})", "d.jsonl", DatasetFormat::kMessages);
  EXPECT_HAS(m, "row 0 has no \"messages\" field");
  // Alpaca rows keep the Alpaca loader's messages.
  m = load_error(R"([{"instruction": "a", "output": "b"}, {"instruction": 1, "output": "b"}])", "d.json");
  EXPECT_HAS(m, "field \"instruction\" of record 1 is a number, expected a string");
  m = load_error(R"({"instruction": "a"})");
  EXPECT_HAS(m, "record 0 has no \"output\" field");
}

TEST(ChatDataset, FilesThatAreNotWhatTheirNameSaysAreErrors) {
  std::string m = load_error("PAR1 this is no json", "d.json");
  EXPECT_HAS(m, "is a Parquet file but its name says JSON");
  m = load_error("PAR1 junk PAR1", "d.csv");
  EXPECT_HAS(m, "is a Parquet file but its name says CSV");
  m = load_error("instruction,output\n\"unclosed,b\n", "d.csv");
  EXPECT_HAS(m, "d.csv: not a readable CSV file");
  m = load_error("instruction,output\na,b,c\n", "d.csv");
  EXPECT_HAS(m, "d.csv: not a readable CSV file");
  m = load_error("instruction,output\n", "d.csv");
  EXPECT_HAS(m, "the dataset has no records");
  m = load_error(R"({"instruction": "a", "output": "b"})", "d.parquet");
  EXPECT_HAS(m, "is named .parquet but is not a Parquet file");
  m = load_error("PAR1 truncated junk PAR1", "d.parquet");
  EXPECT_HAS(m, "not a readable Parquet file");
  m = load_error("[1, 2]", "d.arrow");
  EXPECT_HAS(m, "is named .arrow but is not an Arrow IPC file or stream");

  TempDir dir("chat_paths");
  EXPECT_THROW(load_dataset((dir.path() / "missing.json").string()), Error);
  EXPECT_THROW(split_data_paths("a.json,,b.json"), Error);
  fs::create_directories(dir.path() / "not_a_dataset");
  try {
    load_dataset((dir.path() / "not_a_dataset").string());
    ADD_FAILURE() << "a plain directory loaded";
  } catch (const Error& e) {
    EXPECT_HAS(e.message(), "not a datasets.save_to_disk directory");
  }
  // DatasetDict.save_to_disk: dataset_dict.json and one directory per split.
  fs::create_directories(dir.path() / "dd" / "train");
  fs::create_directories(dir.path() / "dd" / "test");
  std::ofstream(dir.path() / "dd" / "dataset_dict.json") << R"({"splits": ["test", "train"]})";
  try {
    load_dataset((dir.path() / "dd").string());
    ADD_FAILURE() << "a DatasetDict loaded";
  } catch (const Error& e) {
    EXPECT_HAS(e.message(), "is a datasets DatasetDict (save_to_disk of several splits: test, train); give one split's "
                            "directory, e.g. " + (dir.path() / "dd" / "train").string());
  }
  EXPECT_THROW(parse_dataset_format("chatml"), Error);
}

// Until the chat template is applied, train and preprocess refuse conversation rows before they
// write anything.
// Conversation rows need a chat template: a model directory without one (data/tokenizer has none)
// is refused by preprocess and train, naming the files looked at and --chat_template, before
// anything is written.
TEST(ChatDataset, ConversationsWithoutAChatTemplateAreRefusedBeforeWriting) {
  TempDir dir("chat_cli");
  const auto data = dir.path() / "chat.jsonl";
  std::ofstream(data) << R"({"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]})"
                      << "\n";
  const auto tok = ::alpaca::testing::source_dir() / "data/tokenizer";
  const auto out = dir.path() / "tokens.jsonl";
  std::string log;
  int rc = ::alpaca::testing::run_command(::alpaca::testing::train_bin() + " preprocess --data_path " +
                                              data.string() + " --tokenizer " + tok.string() + " --output " +
                                              out.string(), &log);
  EXPECT_NE(rc, 0) << log;
  EXPECT_HAS(log, "--chat_template");
  EXPECT_FALSE(fs::exists(out));

  fs::create_directories(dir.path() / "model");
  std::ofstream(dir.path() / "model" / "config.json") << ::alpaca::testing::kTinyLlamaConfigJson;
  fs::copy_file(tok / "tokenizer.model", dir.path() / "model" / "tokenizer.model");
  const auto run_dir = dir.path() / "run";
  rc = ::alpaca::testing::run_command(::alpaca::testing::train_bin() + " train --model_name_or_path " +
                                          (dir.path() / "model").string() + " --data_path " + data.string() +
                                          " --output_dir " + run_dir.string(), &log);
  EXPECT_NE(rc, 0) << log;
  EXPECT_HAS(log, "--chat_template");
  EXPECT_FALSE(fs::exists(run_dir / "training_args.json")) << log;
}

}  // namespace
}  // namespace alpaca::data::test_chat_dataset

// A module's test files compile as one unit (tests/CMakeLists.txt): this file's macros end here.
#undef EXPECT_HAS
