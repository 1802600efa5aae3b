// The alpaca-train binary end to end: grouped --help, exit codes and messages of usage errors,
// subcommand dispatch, the effective arguments printed once and written to output_dir, and
// rank-aware logging driven by the launcher's environment.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

#include "alpaca/cli/flag_table.h"
#include "cli_test_util.h"
#include "test_util.h"

namespace alpaca::cli {
namespace {

namespace fs = std::filesystem;

using test::expect_binary_usage_errors;
using Result = test::BinaryRun;
Result run(const std::string& args, const std::string& env = "") { return test::run_binary(args, env); }

size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) ++n;
  return n;
}

// Inputs that pass the CLI's checks (a directory with config.json and a working tokenizer, which
// the CLI self-checks before writing output_dir, and a data file) but whose model the trainer
// cannot load: the run fails after the CLI has done its part.
std::string unloadable_inputs(const fs::path& dir) {
  fs::create_directories(dir / "model");
  std::ofstream(dir / "model" / "config.json") << "{}";
  fs::copy_file(testing::source_dir() / "data" / "tokenizer" / "tokenizer.model", dir / "model" / "tokenizer.model",
                fs::copy_options::overwrite_existing);
  std::ofstream(dir / "d.json") << "[]";
  return "--model_name_or_path " + (dir / "model").string() + " --data_path " + (dir / "d.json").string();
}

TEST(CliBinary, HelpListsEveryFlagInGroups) {
  for (const char* form : {"--help", "-h", "train --help", "help"}) {
    Result r = run(form);
    EXPECT_EQ(r.rc, 0) << form << "\n" << r.out;
    for (const auto& f : train_flags()) EXPECT_NE(r.out.find("  --" + f.name + " "), std::string::npos) << form << ": --" << f.name;
    for (const char* group : {"Model and data:", "Output and checkpoints:", "Training length and batches:", "Optimizer:",
                              "Learning-rate schedule:", "Precision:", "Distributed and sharding", "Logging:", "Evaluation:"}) {
      EXPECT_NE(r.out.find(group), std::string::npos) << form << ": group " << group;
    }
  }
}

TEST(CliBinary, UsageErrorsExitWithTwoAndSayWhatToDo) {
  expect_binary_usage_errors({
      {"--model_name_or_path m --data_path d --learning_rat 1e-4",
       "alpaca-train: error: unknown flag --learning_rat; did you mean --learning_rate?"},
      {"--model_name_or_path m --data_path d --bf16 True --fp16 True", "choose one mixed-precision mode"},
      {"", "no arguments"},
      {"trian --bf16", "unknown subcommand 'trian'; did you mean 'train'?"},
      {"generate --model_name_or_path m", "give exactly one of --instruction TEXT or --prompts FILE"},
  });
}

// --fsdp_transformer_layer_cls_to_wrap: a tiny mistral / qwen2 model trains one step wrapping its
// own class; another model type's class is refused before anything is written.
TEST(CliBinary, WrapClassMustBeTheModelTypesDecoderLayer) {
  ALPACA_REQUIRE_SHARED("data/llama2-tokenizer/tokenizer.model");
  testing::TempDir dir("cli_wrap_cls");
  std::string text;
  for (int i = 0; i < 8; ++i) text += "the quick brown fox " + std::to_string(i) + ". ";
  std::ofstream(dir.path() / "d.json") << R"([{"instruction": "Say it.", "input": "", "output": ")" << text
                                       << R"("}, {"instruction": "Again.", "input": "", "output": ")" << text << R"("}])";
  for (const auto& [type, cls, wrong] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"mistral", "MistralDecoderLayer", "LlamaDecoderLayer"}, {"qwen2", "Qwen2DecoderLayer", "MistralDecoderLayer"}}) {
    SCOPED_TRACE(type);
    const fs::path cfg = dir.path() / (type + ".json"), model = dir.path() / type;
    std::ofstream(cfg) << R"({"model_type": ")" << type << R"(", "vocab_size": 32000, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 128, "tie_word_embeddings": false})";
    Result r = run("init-model --config " + cfg.string() + " --output_dir " + model.string());
    ASSERT_EQ(r.rc, 0) << r.out;
    fs::copy_file(testing::shared_dir() / "data" / "llama2-tokenizer" / "tokenizer.model", model / "tokenizer.model");
    const std::string args = "train --model_name_or_path " + model.string() + " --data_path " +
                             (dir.path() / "d.json").string() + " --max_steps 1 --per_device_train_batch_size 2 "
                             "--model_max_length 32 --save_strategy no --report_to none --disable_tqdm True "
                             "--fsdp 'full_shard auto_wrap' --fsdp_transformer_layer_cls_to_wrap ";
    const fs::path bad = dir.path() / ("bad_" + type);
    r = run(args + wrong + " --output_dir " + bad.string() + " 2>&1");
    EXPECT_NE(r.rc, 0) << r.out;
    for (const std::string& needle : std::vector<std::string>{wrong, "model_type " + type, cls, (model / "config.json").string()})
      EXPECT_NE(r.out.find(needle), std::string::npos) << needle << " not in:\n" << r.out;
    EXPECT_FALSE(fs::exists(bad / "training_args.json")) << "written before the refusal";
    const fs::path good = dir.path() / ("good_" + type);
    r = run(args + cls + " --output_dir " + good.string() + " 2>&1");
    EXPECT_EQ(r.rc, 0) << r.out;
    EXPECT_TRUE(fs::exists(good / "model.safetensors") || fs::exists(good / "config.json")) << r.out;
  }
}

TEST(CliBinary, PrintsEffectiveArgsOnceAndWritesThemToOutputDir) {
  testing::TempDir dir("cli_binary");
  fs::path out = dir.path() / "run";
  // The model cannot be loaded: whatever the trainer does next, it fails after the CLI has done its part.
  Result r = run("train " + unloadable_inputs(dir.path()) + " --output_dir " + out.string() + " --learning_rate 2e-5 --bf16");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.rc, 2) << "a valid command line is not a usage error:\n" << r.out;
  EXPECT_EQ(count(r.out, "effective arguments"), 1u) << r.out;
  EXPECT_NE(r.out.find("* learning_rate = 2e-05"), std::string::npos) << r.out;
  ASSERT_TRUE(fs::exists(out / "training_args.json")) << r.out;
  std::stringstream json;
  json << std::ifstream(out / "training_args.json").rdbuf();
  EXPECT_NE(json.str().find("\"learning_rate\": 2e-05"), std::string::npos) << json.str();
  EXPECT_NE(json.str().find("\"bf16\": true"), std::string::npos) << json.str();
  EXPECT_FALSE(fs::exists(out / "training_args.json.tmp"));

  // The recorded arguments reproduce the run: they parse back as --config.
  fs::path out2 = dir.path() / "run2";
  r = run("--config " + (out / "training_args.json").string() + " --output_dir " + out2.string());
  EXPECT_NE(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("* learning_rate = 2e-05"), std::string::npos) << r.out;
}

TEST(CliBinary, OnlyRankZeroLogsInfoByDefault) {
  testing::TempDir dir("cli_ranks");
  // A missing model: every rank finds the same input error before anything is written.
  std::string flags = "--model_name_or_path " + (dir.path() / "no-model").string() + " --data_path d.json --output_dir " +
                      (dir.path() / "out").string();
  Result rank1 = run(flags, "OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK=1 OMPI_COMM_WORLD_LOCAL_SIZE=2");
  EXPECT_EQ(rank1.rc, 2) << rank1.out;
  EXPECT_EQ(rank1.out.find("effective arguments"), std::string::npos) << rank1.out;
  EXPECT_EQ(rank1.out.find("error"), std::string::npos) << "rank 0 reports the error every rank finds: " << rank1.out;
  EXPECT_FALSE(fs::exists(dir.path() / "out" / "training_args.json")) << "only rank 0 writes the arguments";

  Result rank0 = run(flags, "OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK=0 OMPI_COMM_WORLD_LOCAL_SIZE=2");
  EXPECT_EQ(rank0.rc, 2) << rank0.out;
  EXPECT_NE(rank0.out.find("[info] [rank 0] run " + (dir.path() / "out").string() + ": effective arguments"), std::string::npos)
      << rank0.out;  // run_name defaults to output_dir
  EXPECT_EQ(count(rank0.out, "alpaca-train: error: --model_name_or_path " + (dir.path() / "no-model").string() +
                                 " is not a directory"), 1u) << rank0.out;
  EXPECT_EQ(rank0.out.find(".cpp:"), std::string::npos) << "a user's error shows no source location: " << rank0.out;
  EXPECT_FALSE(fs::exists(dir.path() / "out")) << "inputs are checked before anything is written to output_dir";

  Result quiet = run(unloadable_inputs(dir.path()) + " --output_dir " + (dir.path() / "out").string() + " --log_level warning");
  EXPECT_EQ(quiet.out.find("effective arguments"), std::string::npos) << quiet.out;
  EXPECT_TRUE(fs::exists(dir.path() / "out" / "training_args.json"));
}

// .ci/run must run exactly the README's test command, so CI proves what a newcomer runs.
TEST(Repo, CiRunsTheReadmeTestCommand) {
  auto read = [](const fs::path& p) {
    std::stringstream ss;
    ss << std::ifstream(p).rdbuf();
    return ss.str();
  };
  std::string readme = read(testing::source_dir() / "README.md");
  std::string ci = read(testing::source_dir() / ".ci" / "run");
  const std::string test_cmd = "bash scripts/install_deps.sh && bash scripts/test.sh";
  size_t test_section = readme.find("## Test");
  ASSERT_NE(test_section, std::string::npos);
  EXPECT_NE(readme.find("    " + test_cmd + "\n", test_section), std::string::npos) << "README's test command changed";
  EXPECT_NE(ci.find("\n" + test_cmd + "\n"), std::string::npos) << ".ci/run does not run the README's test command";
  EXPECT_NE(readme.find("    bash scripts/quickstart.sh\n"), std::string::npos);
  EXPECT_TRUE(fs::exists(testing::source_dir() / "scripts" / "quickstart.sh"));
}

}  // namespace
}  // namespace alpaca::cli
