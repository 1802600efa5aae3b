// `alpaca-train generate` end to end on a tiny random model (init-model + the bundled
// SentencePiece tokenizer): one streamed instruction, a prompts file to JSON Lines with
// exact match and a summary line, and bad input that must fail clearly with nothing written.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace test_generate_cli {

namespace fs = std::filesystem;
using alpaca::testing::run_command;
using nlohmann::json;

namespace {

void write(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }

std::vector<json> read_jsonl(const fs::path& p) {
  std::ifstream f(p);
  std::vector<json> out;
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

class GenerateCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new alpaca::testing::TempDir("generate_cli");
    model_ = dir_->path() / "model";
    write(dir_->path() / "config.json",
          R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512, "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "bos_token_id": 1, "eos_token_id": 2,
              "initializer_range": 0.1})");
    std::string out;
    ASSERT_EQ(run_command(alpaca::testing::train_bin() + " init-model --config " + (dir_->path() / "config.json").string() +
                              " --output_dir " + model_.string() + " --seed 1",
                          &out),
              0)
        << out;
    for (const auto& e : fs::directory_iterator(alpaca::testing::source_dir() / "data" / "tokenizer"))
      fs::copy_file(e.path(), model_ / e.path().filename());
  }
  static void TearDownTestSuite() { delete dir_; }

  struct Result {
    int rc;
    std::string out;
  };
  // stdout only, or stdout + stderr.
  Result gen(const std::string& args, bool with_stderr = true) const {
    Result r;
    // run_command adds 2>&1 to the whole line; the subshell keeps stderr out when asked.
    r.rc = run_command("(" + alpaca::testing::train_bin() + " generate --model_name_or_path " + model_.string() + " " +
                           args + (with_stderr ? "" : " 2>/dev/null") + ")",
                       &r.out);
    return r;
  }
  fs::path path(const std::string& name) const { return dir_->path() / name; }

  static alpaca::testing::TempDir* dir_;
  static fs::path model_;
};
alpaca::testing::TempDir* GenerateCli::dir_ = nullptr;
fs::path GenerateCli::model_;

TEST_F(GenerateCli, PromptsFileToJsonLinesWithExactMatch) {
  write(path("p.json"), R"([{"instruction": "Say hi", "output": "hi", "id": 7},
                            {"instruction": "Add", "input": "2 3", "output": "5"},
                            {"instruction": "Third", "output": ""}])");
  Result r = gen("--prompts " + path("p.json").string() + " --output " + path("o.jsonl").string() +
                     " --max_new_tokens 6 --batch_size 2 --expected_field output",
                 /*with_stderr=*/false);
  ASSERT_EQ(r.rc, 0) << r.out;
  std::vector<json> lines = read_jsonl(path("o.jsonl"));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["id"], 7);  // the record's own fields are kept
  EXPECT_EQ(lines[1]["input"], "2 3");
  for (const json& l : lines) {
    EXPECT_TRUE(l["generation"].is_string());
    EXPECT_TRUE(l["generation_ids"].is_array());
    EXPECT_LE(l["generation_ids"].size(), 6u);
    EXPECT_TRUE(l["exact_match"].is_boolean());
  }
  // The summary is the last stdout line and agrees with the records.
  json summary = json::parse(r.out.substr(r.out.rfind('{')));
  int correct = 0;
  for (const json& l : lines) correct += l["exact_match"].get<bool>();
  EXPECT_EQ(summary["num_correct"], correct);
  EXPECT_EQ(summary["n"], 3);

  // JSON Lines in gives the same answers; the streamed --instruction text is the same answer too.
  write(path("p.jsonl"), "{\"instruction\": \"Say hi\"}\n\n{\"instruction\": \"Add\", \"input\": \"2 3\"}\n");
  ASSERT_EQ(gen("--prompts " + path("p.jsonl").string() + " --output " + path("o2.jsonl").string() +
                " --max_new_tokens 6").rc, 0);
  std::vector<json> lines2 = read_jsonl(path("o2.jsonl"));
  ASSERT_EQ(lines2.size(), 2u);
  EXPECT_EQ(lines2[0]["generation_ids"], lines[0]["generation_ids"]);
  EXPECT_EQ(lines2[1]["generation_ids"], lines[1]["generation_ids"]);
  Result s = gen("--instruction 'Add' --input '2 3' --max_new_tokens 6", /*with_stderr=*/false);
  ASSERT_EQ(s.rc, 0) << s.out;
  EXPECT_EQ(s.out, lines[1]["generation"].get<std::string>() + "\n");
}

TEST_F(GenerateCli, SamplingFlagsAndSeed) {
  write(path("s.json"), R"([{"instruction": "Tell me something"}])");
  auto answer = [&](const std::string& flags) {
    fs::remove(path("s.jsonl"));
    Result r = gen("--prompts " + path("s.json").string() + " --output " + path("s.jsonl").string() +
                   " --max_new_tokens 16 " + flags);
    EXPECT_EQ(r.rc, 0) << r.out;
    return read_jsonl(path("s.jsonl")).at(0)["generation_ids"];
  };
  json a = answer("--do_sample True --temperature 1.5 --top_k 0 --seed 3");
  EXPECT_EQ(a, answer("--do_sample --temperature 1.5 --top_k 0 --seed 3"));
  EXPECT_NE(a, answer("--do_sample --temperature 1.5 --top_k 0 --seed 4"));
  EXPECT_EQ(answer(""), answer("--do_sample False --top_k 1"));
  // bf16 runs the same path (answers may differ from fp32 by rounding, so only their shape is checked).
  json bf16 = answer("--bf16 True --padding_side right");
  EXPECT_TRUE(bf16.is_array() && !bf16.empty() && bf16.size() <= 16u) << bf16.dump();
}

TEST_F(GenerateCli, BadInputFailsClearlyAndWritesNothing) {
  const fs::path out = path("never.jsonl");
  write(path("empty.json"), "  \n");
  write(path("noinst.json"), R"([{"instruction": "ok"}, {"input": "x", "output": "y"}])");
  write(path("good.json"), R"([{"instruction": "ok"}])");
  fs::create_directories(path("noweights"));
  for (const auto& e : fs::directory_iterator(model_))  // everything but the weights
    if (e.path().extension() != ".safetensors") fs::copy_file(e.path(), path("noweights") / e.path().filename());
  struct Case {
    std::string args;
    int rc;
    std::string message;
  };
  const std::string o = " --output " + out.string();
  std::vector<Case> cases = {
      {"--prompts " + path("empty.json").string() + o, 1, "the prompts file is empty"},
      {"--prompts " + path("noinst.json").string() + o, 1, "record 1 has no \"instruction\" field"},
      {"--prompts " + path("good.json").string() + o + " --top_p 0", 2, "--top_p must be in (0, 1]"},
      {"--prompts " + path("good.json").string() + o + " --top_p 1.5", 2, "--top_p must be in (0, 1]"},
      {"--prompts " + path("good.json").string() + o + " --expected_field output", 1,
       "record 0 has no \"output\" field, which --expected_field asks for"},
      {"--prompts " + path("good.json").string() + o + " --adapter a", 2, "--adapter a is not a directory"},
      {"--prompts " + path("good.json").string(), 2, "--prompts needs --output"},
      {"--instruction hi --prompts " + path("good.json").string() + o, 2, "exactly one of --instruction"},
      {"--prompts " + path("missing.json").string() + o, 1, "cannot read the prompts file"},
      {"--prompts " + path("good.json").string() + o + " --max_new_tokens 0", 2, "--max_new_tokens must be positive"},
  };
  for (const Case& c : cases) {
    Result r = gen(c.args);
    EXPECT_EQ(r.rc, c.rc) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << c.args << "\n" << r.out;
    EXPECT_FALSE(fs::exists(out)) << c.args;
    EXPECT_FALSE(fs::exists(out.string() + ".tmp")) << c.args;
  }
  // A model directory without weights.
  std::string msg;
  int rc = run_command(alpaca::testing::train_bin() + " generate --model_name_or_path " + path("noweights").string() +
                           " --prompts " + path("good.json").string() + o,
                       &msg);
  EXPECT_EQ(rc, 1) << msg;
  EXPECT_NE(msg.find("no weights found"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(out));
}

// generation_config.json as transformers reads it: a file without eos_token_id means no early stop
// (config.json's eos is used only without the file), and max_length (which counts the prompt)
// gives each batch max_length minus its own padded prompt length; no room left is an error.
TEST_F(GenerateCli, GenerationConfigEosAndMaxLengthAsTransformers) {
  const fs::path m2 = path("gc_model");
  fs::create_directories(m2);
  for (const auto& e : fs::directory_iterator(model_)) fs::copy_file(e.path(), m2 / e.path().filename());
  write(path("gc.json"), R"([{"instruction": "Hi"},
                             {"instruction": "Write a long list of every animal in the Andes, with notes on each one"}])");
  auto answers = [&](const std::string& flags, int* rc = nullptr) {
    fs::remove(path("gc.jsonl"));
    Result r;
    r.rc = run_command(alpaca::testing::train_bin() + " generate --model_name_or_path " + m2.string() + " --prompts " +
                           path("gc.json").string() + " --output " + path("gc.jsonl").string() + " " + flags,
                       &r.out);
    if (rc) *rc = r.rc;
    else EXPECT_EQ(r.rc, 0) << flags << "\n" << r.out;
    std::vector<json> out;
    if (r.rc == 0)
      for (const json& l : read_jsonl(path("gc.jsonl"))) out.push_back(l["generation_ids"]);
    return out;
  };
  // Make the first greedy token the eos of config.json.
  fs::remove(m2 / "generation_config.json");
  const std::vector<json> free_run = answers("--max_new_tokens 8 --batch_size 1");
  ASSERT_EQ(free_run.size(), 2u);
  json cfg = json::parse(std::ifstream(m2 / "config.json"));
  cfg["eos_token_id"] = free_run[0][0];
  write(m2 / "config.json", cfg.dump());
  EXPECT_EQ(answers("--max_new_tokens 8 --batch_size 1")[0].size(), 1u) << "no generation_config.json: config.json's eos";
  write(m2 / "generation_config.json", R"({"bos_token_id": 1})");
  EXPECT_EQ(answers("--max_new_tokens 8 --batch_size 1")[0].size(), free_run[0].size()) << "the file has no eos: no stop";

  write(m2 / "generation_config.json", R"({"max_length": 90, "pad_token_id": 0})");
  const std::vector<json> one = answers("--batch_size 1"), two = answers("--batch_size 2");
  ASSERT_EQ(one.size(), 2u);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_GT(one[0].size(), one[1].size()) << "each prompt's own budget at batch 1";
  EXPECT_EQ(two[0].size(), one[1].size()) << "the batch's padded length at batch 2";
  EXPECT_EQ(two[1].size(), one[1].size());
  write(m2 / "generation_config.json", R"({"max_length": 3})");
  int rc = 0;
  EXPECT_TRUE(answers("--batch_size 1", &rc).empty());
  EXPECT_EQ(rc, 1);
  EXPECT_FALSE(fs::exists(path("gc.jsonl")));
  std::string msg;
  run_command(alpaca::testing::train_bin() + " generate --model_name_or_path " + m2.string() + " --instruction Hi", &msg);
  EXPECT_NE(msg.find("leaves no room under max_length 3"), std::string::npos) << msg;
  EXPECT_EQ(answers("--batch_size 1 --max_new_tokens 2")[0].size(), 2u) << "--max_new_tokens wins over max_length";
}

// Past config.json's max_position_embeddings generation goes on with a warning, once, as
// transformers' MaxLengthCriteria warns; within it, none.
TEST_F(GenerateCli, WarnsOncePastMaxPositionEmbeddings) {
  const fs::path m2 = path("short_model");
  fs::create_directories(m2);
  for (const auto& e : fs::directory_iterator(model_)) fs::copy_file(e.path(), m2 / e.path().filename());
  json cfg = json::parse(std::ifstream(m2 / "config.json"));
  cfg["max_position_embeddings"] = 40;  // the Alpaca prompt of "Hi" is under 40 tokens here
  write(m2 / "config.json", cfg.dump());
  write(m2 / "generation_config.json", R"({"bos_token_id": 1})");  // no eos: every run generates its budget
  const std::string warning = "passed the model's max_position_embeddings (40, config.json)";
  auto count = [](const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  Result r;
  r.rc = run_command(alpaca::testing::train_bin() + " generate --model_name_or_path " + m2.string() +
                         " --instruction Hi --max_new_tokens 2",
                     &r.out);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(count(r.out, warning), 0u) << r.out;
  r.rc = run_command(alpaca::testing::train_bin() + " generate --model_name_or_path " + m2.string() +
                         " --instruction Hi --max_new_tokens 60",
                     &r.out);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(count(r.out, warning), 1u) << r.out;
}

}  // namespace

}  // namespace test_generate_cli
