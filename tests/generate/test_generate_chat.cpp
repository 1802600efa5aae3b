// `alpaca-train generate --chat` against transformers (tests/reference/generate_chat_reference.py):
// on SmolLM2-135M-Instruct, message-list prompts rendered by its chat template with
// add_generation_prompt and tokenized without added special tokens give apply_chat_template's
// ids exactly, the CLI's greedy answers are token-exact with model.generate on them (also for
// --instruction with --chat_template: one user message), template variables (records' tools and
// chat_template_kwargs, --chat_template_kwargs) as apply_chat_template's kwargs. A model
// without a chat template under --chat is a clear error.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "alpaca/chat/chat_template.h"
#include "alpaca/data/conversation_example.h"
#include "alpaca/tokenizer/tokenizer.h"
#include "alpaca/generate/chat_prompt.h"
#include "alpaca/generate/prompt_records.h"
#include "test_util.h"

namespace test_generate_chat {

namespace fs = std::filesystem;
using alpaca::testing::run_command;
using nlohmann::json;

namespace {

class GenerateChat : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = alpaca::testing::binary_dir() / "fixtures" / "generate_chat_ref";
    if (fs::exists(dir_ / "SKIPPED")) {
      std::ifstream f(dir_ / "SKIPPED");
      GTEST_SKIP() << std::string(std::istreambuf_iterator<char>(f), {});
    }
    std::ifstream f(dir_ / "reference.json");
    ASSERT_TRUE(f) << "fixture missing: run ctest (fixture_generate_chat_ref) first; looked in " << dir_;
    ref_ = json::parse(f);
    model_ = ref_["model_dir"].get<std::string>();
  }
  fs::path dir_, model_;
  json ref_;
};

TEST_F(GenerateChat, TemplatedPromptIdsEqualApplyChatTemplate) {
  const auto tmpl = alpaca::chat::ChatTemplate::load(model_);
  const auto tok = alpaca::tokenizer::Tokenizer::load(model_.string());
  std::ifstream f(dir_ / "prompts.jsonl");
  size_t i = 0;
  for (std::string line; std::getline(f, line); ++i) {
    const std::string text = alpaca::generate::chat_prompt(tmpl, json::parse(line)["messages"].dump(),
                                                           alpaca::data::template_special_tokens_json(tok));
    EXPECT_EQ(text, ref_["texts"][i].get<std::string>()) << "conversation " << i;
    EXPECT_EQ(tok.encode(text, /*add_special_tokens=*/false), ref_["prompt_ids"][i].get<std::vector<int64_t>>())
        << "conversation " << i;
  }
  EXPECT_EQ(i, ref_["prompt_ids"].size());
}

TEST_F(GenerateChat, GreedyCliAnswersEqualTransformersGenerate) {
  std::cout << "reference's smallest top-2 logit margin " << ref_["min_margin"] << "\n";
  alpaca::testing::TempDir tmp("generate_chat");
  const fs::path out = tmp.path() / "out.jsonl";
  std::string log;
  // No --chat: records with "messages" always go through the template.
  ASSERT_EQ(run_command(alpaca::testing::train_bin() + " generate --model_name_or_path " + model_.string() +
                            " --prompts " + (dir_ / "prompts.jsonl").string() + " --output " + out.string() +
                            " --max_new_tokens " + std::to_string(ref_["max_new_tokens"].get<int64_t>()),
                        &log),
            0)
      << log;
  std::ifstream f(out);
  size_t i = 0;
  for (std::string line; std::getline(f, line); ++i) {
    const json rec = json::parse(line);
    ASSERT_LT(i, ref_["new_ids"].size());
    EXPECT_EQ(rec["generation_ids"].get<std::vector<int64_t>>(), ref_["new_ids"][i].get<std::vector<int64_t>>())
        << "conversation " << i;
    EXPECT_TRUE(rec.contains("messages")) << "the output line repeats the record";
  }
  EXPECT_EQ(i, ref_["new_ids"].size());
}

// --instruction with --chat_template (which implies --chat): one user message, so the streamed
// answer is conversation 0's.
TEST_F(GenerateChat, InstructionWithChatTemplateIsOneUserMessage) {
  const auto tok = alpaca::tokenizer::Tokenizer::load(model_.string());
  const std::string want = tok.decode(ref_["new_ids"][0].get<std::vector<int64_t>>(), /*skip_special=*/true);
  std::string out;
  ASSERT_EQ(run_command("(" + alpaca::testing::train_bin() + " generate --model_name_or_path " + model_.string() +
                            " --chat_template " + (model_ / "chat_template.jinja").string() +
                            " --instruction 'What is the capital of France?' --max_new_tokens " +
                            std::to_string(ref_["max_new_tokens"].get<int64_t>()) + " 2>/dev/null)",
                        &out),
            0)
      << out;
  EXPECT_EQ(out, want + "\n");
}

// Template variables: records with tools / chat_template_kwargs rendered by Qwen3's template give
// apply_chat_template(..., tools=..., **chat_template_kwargs)'s text and ids (enable_thinking=False
// writes an empty think block into the generation prompt; a null tools there takes the record's away).
TEST_F(GenerateChat, RecordTemplateVariablesEqualApplyChatTemplateKwargs) {
  const auto tmpl = alpaca::chat::ChatTemplate::load(model_, dir_ / "qwen3.jinja");
  const auto tok = alpaca::tokenizer::Tokenizer::load(model_.string());
  const auto records = alpaca::generate::load_prompt_records((dir_ / "kwargs_prompts.jsonl").string(), {});
  ASSERT_EQ(records.size(), ref_["kwargs_texts"].size());
  for (size_t i = 0; i < records.size(); ++i) {
    const std::string text = alpaca::generate::chat_prompt(tmpl, *records[i].messages,
                                                           alpaca::data::template_special_tokens_json(tok),
                                                           records[i].template_variables);
    EXPECT_EQ(text, ref_["kwargs_texts"][i].get<std::string>()) << "record " << i;
    EXPECT_EQ(tok.encode(text, /*add_special_tokens=*/false), ref_["kwargs_ids"][i].get<std::vector<int64_t>>())
        << "record " << i;
  }
}

// --chat_template_kwargs for every conversation: the greedy answer to the instruction asked with
// enable_thinking=False through Qwen3's template is transformers'. Bad values are usage errors.
TEST_F(GenerateChat, ChatTemplateKwargsFlagReachesTheTemplate) {
  const auto tok = alpaca::tokenizer::Tokenizer::load(model_.string());
  const std::string want = tok.decode(ref_["kwargs_new_ids"].get<std::vector<int64_t>>(), /*skip_special=*/true);
  const std::string cmd = alpaca::testing::train_bin() + " generate --model_name_or_path " + model_.string() +
                          " --chat_template " + (dir_ / "qwen3.jinja").string() +
                          " --instruction 'What is the capital of France?' --max_new_tokens " +
                          std::to_string(ref_["max_new_tokens"].get<int64_t>());
  std::string out;
  ASSERT_EQ(run_command("(" + cmd + " --chat_template_kwargs '{\"enable_thinking\": false}' 2>/dev/null)", &out), 0)
      << out;
  EXPECT_EQ(out, want + "\n");
  for (const auto& [flag, needle] : std::vector<std::pair<std::string, std::string>>{
           {"'enable_thinking=False'", "--chat_template_kwargs is not JSON"},
           {"'[1]'", "--chat_template_kwargs is a JSON array; give an object"},
           {"'{\"add_generation_prompt\": false}'", "sets \"add_generation_prompt\", which is not a template variable"}}) {
    std::string log;
    EXPECT_EQ(run_command(cmd + " --chat_template_kwargs " + flag, &log), 2) << log;
    EXPECT_NE(log.find(needle), std::string::npos) << log;
  }
}

TEST_F(GenerateChat, ModelWithoutATemplateIsAClearError) {
  alpaca::testing::TempDir tmp("generate_chat_notemplate");
  for (const char* name : {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                           "tokenizer_config.json"})
    fs::create_symlink(model_ / name, tmp.path() / name);
  std::string log;
  const int rc = run_command(alpaca::testing::train_bin() + " generate --model_name_or_path " + tmp.path().string() +
                                 " --chat --instruction Hello",
                             &log);
  EXPECT_NE(rc, 0) << log;
  EXPECT_NE(log.find("--chat_template"), std::string::npos) << log;
  // --raw_prompt and --chat contradict each other: a usage error (exit 2).
  EXPECT_EQ(run_command(alpaca::testing::train_bin() + " generate --model_name_or_path " + model_.string() +
                            " --chat --raw_prompt --instruction Hello",
                        &log),
            2)
      << log;
}

}  // namespace

}  // namespace test_generate_chat
