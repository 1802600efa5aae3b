// A 2-rank fine-tune of SmolLM2-135M-Instruct on conversations (issue 28): 64 Alpaca records as
// {messages: [user, assistant]} rows (tests/reference/conversation_masks_reference.py), trained with
// --assistant_only_loss through the model's own chat template; the held-out loss of the assistant
// tokens (eval on 16 other rows, same masks) goes down, and the log states the trained share.
// (16 held-out rows, not 32: the two evaluations take 24 s of the run rather than 65 on the AVX2
// machine; the loss still drops 0.067 in 6 steps where 0.03 is asked.)
// `generate --chat` of the result is token-exact with transformers' generate. And TRL's attention
// mask on rows whose pad token is part of the text: the first step's loss and gradient norm.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "train_test_util.h"

namespace test_conversation_train {

namespace fs = std::filesystem;
using namespace alpaca::testing;

namespace {

const fs::path kFixture = fixture_dir("conversation_masks");

std::string args(const fs::path& out) {
  return TrainFlags(kFixture, out)
      .model(source_dir() / "models/smollm2-135m-instruct")
      .set("--data_path", (kFixture / "chat_train.jsonl").string())
      .set("--eval_data_path", (kFixture / "chat_eval.jsonl").string())
      .set("--assistant_only_loss True --model_max_length 512 --save_strategy no --per_device_eval_batch_size 4")
      .set("--eval_strategy steps --per_device_train_batch_size 2 --bf16 True")
      .set(kFullShard);
}

// The eval_loss entries of a run's metrics.jsonl: {step, loss}.
std::vector<std::pair<double, double>> eval_losses(const fs::path& out) {
  std::vector<std::pair<double, double>> v;
  for (const auto& m : read_metrics(out))
    if (m.count("eval_loss")) v.emplace_back(m.at("step"), m.at("eval_loss"));
  return v;
}

TEST(ConversationTrain, TwoRankAssistantOnlyFineTuneLowersHeldOutAssistantLoss) {
  ALPACA_SKIP_IF_FIXTURE_SKIPPED(kFixture);
  if (!fs::exists(kFixture / "chat_train.jsonl")) GTEST_SKIP() << "no shared Alpaca data";
  TempDir after_dir("conv_after");
  std::string log;
  // One run: --eval_on_start evaluates before the first step (HF's sanity check), then after step 6.
  ASSERT_EQ(run_trainer(args(after_dir.path()) + " --max_steps 6 --eval_steps 6 --learning_rate 1e-4 --warmup_steps 1"
                                                 " --lr_scheduler_type constant_with_warmup --eval_on_start True",
                        2, &log),
            0)
      << log;
  std::smatch m;  // the log states the share of tokens the masks train
  ASSERT_TRUE(std::regex_search(log, m, std::regex("trained ([0-9]+) of ([0-9]+) tokens"))) << log;
  EXPECT_LT(std::stoll(m[1]), std::stoll(m[2]));
  EXPECT_GT(std::stoll(m[1]), 0);
  // ... and of the eval data (--eval_data_path) too
  ASSERT_TRUE(std::regex_search(log, m, std::regex("tokenized eval [^\n]*: trained ([0-9]+) of ([0-9]+) tokens"))) << log;
  EXPECT_GT(std::stoll(m[1]), 0);
  const auto evals = eval_losses(after_dir.path());
  ASSERT_EQ(evals.size(), 2u) << log;
  EXPECT_EQ(evals[0].first, 0);  // logged at the starting step
  EXPECT_EQ(evals[1].first, 6);
  const double before = evals[0].second, after = evals[1].second;
  std::cout << "[conversation_train] held-out assistant-token loss before " << before << ", after 6 steps on 2 ranks "
            << after << "\n";
  ASSERT_GT(before, 0);
  EXPECT_LT(after, before - 0.03);

  // The fine-tuned directory carries the chat template it was trained with, and `generate --chat`
  // on it is token-exact with transformers' greedy generate on the chat-templated prompts
  // (tests/reference/generate_chat_reference.py, run on this run's output).
  ASSERT_TRUE(fs::exists(after_dir.path() / "chat_template.jinja"));
  const fs::path ref = after_dir.path() / "reference";
  ASSERT_EQ(run_command(python() + " " + (source_dir() / "tests/reference/generate_chat_reference.py").string() +
                            " --smollm2 " + after_dir.path().string() + " --out " + ref.string(),
                        &log),
            0)
      << log;
  const nlohmann::json want = nlohmann::json::parse(read_text(ref / "reference.json"));
  const fs::path answers = after_dir.path() / "answers.jsonl";
  ASSERT_EQ(run_command(train_bin() + " generate --chat --model_name_or_path " + after_dir.path().string() + " --prompts " +
                            (ref / "prompts.jsonl").string() + " --output " + answers.string() + " --max_new_tokens " +
                            std::to_string(want["max_new_tokens"].get<int64_t>()),
                        &log),
            0)
      << log;
  std::istringstream lines(read_text(answers));
  size_t i = 0;
  for (std::string line; std::getline(lines, line); ++i)
    EXPECT_EQ(nlohmann::json::parse(line)["generation_ids"].get<std::vector<int64_t>>(),
              want["new_ids"][i].get<std::vector<int64_t>>())
        << "conversation " << i << " (reference's smallest top-2 logit margin " << want["min_margin"] << ")";
  EXPECT_EQ(i, want["new_ids"].size());
}

// TRL's collator attends to every token of a row; only padding is masked. SmolLM2's pad token is its
// eos <|im_end|>, which ends every turn, so train.py's rule (ids != pad) would hide 21 tokens of these
// rows from the tokens after them. First-step loss and gradient norm of a tiny model against TRL's
// (tests/reference/conversation_masks_reference.py, trl_loss_case), unpacked and packed (bfd).
TEST(ConversationTrain, AttentionCoversThePadTokenInsideTheTextAsTrl) {
  ALPACA_SKIP_IF_FIXTURE_SKIPPED(kFixture);
  const nlohmann::json fx = nlohmann::json::parse(read_text(kFixture / "masks.json"))["trl_loss"];
  for (const std::string& set : {std::string("unpacked"), std::string("packed")}) {
    const nlohmann::json& want = fx[set];
    ASSERT_GT(want["pad_tokens_in_text"].get<int64_t>(), 0) << "the case needs pad tokens inside the text";
    TempDir out("trl_loss_" + set);
    std::string log;
    const std::string flags = TrainFlags(kFixture, out.path())
                                  .model(kFixture / fx["model_dir"].get<std::string>())
                                  .set("--data_path", (kFixture / fx["data"].get<std::string>()).string())
                                  .set("--model_max_length", std::to_string(fx["max_length"].get<int64_t>()))
                                  .batch(want["rows"].get<int64_t>(), 1)
                                  .steps(1)
                                  .set("--packing", set == "packed" ? "True" : "False")
                                  .set("--save_strategy no --learning_rate 1e-3");
    ASSERT_EQ(run_trainer(flags, 1, &log), 0) << log;
    const auto steps = read_step_logs(out.path());
    ASSERT_EQ(steps.size(), 1u) << log;
    const double loss = want["loss"], norm = want["grad_norm"];
    EXPECT_NEAR(steps[0].loss, loss, 2e-6 * loss) << set;
    EXPECT_NEAR(steps[0].grad_norm, norm, 2e-5 * norm) << set;
  }
}

// --eos_token / --pad_token (SFTConfig's): what TRL's SFTTrainer mirrors onto the saved model and
// tokenizer (trl_token_configs_case: its save_model) is what our output_dir holds: config.json's and
// generation_config.json's eos/pad/bos ids (the new eos first in the generation list) and the
// tokenizer's roles.
TEST(ConversationTrain, EosAndPadTokensReachTheSavedConfigsAsTrl) {
  ALPACA_SKIP_IF_FIXTURE_SKIPPED(kFixture);
  const nlohmann::json fx = nlohmann::json::parse(read_text(kFixture / "masks.json"))["trl_token_configs"];
  const nlohmann::json loss_fx = nlohmann::json::parse(read_text(kFixture / "masks.json"))["trl_loss"];
  for (const auto& [name, want] : fx.items()) {
    TempDir out("trl_tokens_" + name);
    TrainFlags flags(kFixture, out.path());
    flags.model(kFixture / loss_fx["model_dir"].get<std::string>())
        .set("--data_path", (kFixture / "trl_text_language_modelling.jsonl").string())
        .batch(1, 1)
        .steps(1)
        .set("--save_strategy no");
    for (const auto& [flag, value] : want["flags"].items()) flags.set("--" + flag, "'" + value.get<std::string>() + "'");
    std::string log;
    ASSERT_EQ(run_trainer(flags, 1, &log), 0) << log;
    const auto config = nlohmann::json::parse(read_text(out.path() / "config.json"));
    const auto gen = nlohmann::json::parse(read_text(out.path() / "generation_config.json"));
    const auto tok = nlohmann::json::parse(read_text(out.path() / "tokenizer_config.json"));
    for (const auto& [key, value] : want["config"].items())
      EXPECT_EQ(config.value(key, nlohmann::json()), value) << name << ": config.json " << key;
    for (const auto& [key, value] : want["generation_config"].items())
      EXPECT_EQ(gen.value(key, nlohmann::json()), value) << name << ": generation_config.json " << key;
    for (const auto& [key, value] : want["tokenizer"].items())
      EXPECT_EQ(tok.value(key, nlohmann::json()), value) << name << ": tokenizer_config.json " << key;
  }
}

}  // namespace

}  // namespace test_conversation_train
