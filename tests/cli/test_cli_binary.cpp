// The alpaca-train binary end to end: grouped --help, exit codes and messages of usage errors,
// subcommand dispatch, the effective arguments printed once and written to output_dir, and
// rank-aware logging driven by the launcher's environment.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

#include "alpaca/cli/flag_table.h"
#include "alpaca/io/safetensors.h"
#include "cli_test_util.h"
#include "test_util.h"

namespace alpaca::cli::test_cli_binary {
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

// Inputs that pass the CLI's checks (a directory with a valid config.json and a working tokenizer,
// which the CLI checks before writing output_dir, and a data file) but whose model the trainer
// cannot load (no weights): the run fails after the CLI has done its part.
std::string unloadable_inputs(const fs::path& dir) {
  fs::create_directories(dir / "model");
  std::ofstream(dir / "model" / "config.json") << testing::kTinyLlamaConfigJson;
  fs::copy_file(testing::source_dir() / "data" / "tokenizer" / "tokenizer.model", dir / "model" / "tokenizer.model",
                fs::copy_options::overwrite_existing);
  std::ofstream(dir / "d.json") << "[]";
  return "--model_name_or_path " + (dir / "model").string() + " --data_path " + (dir / "d.json").string();
}

// A tiny random model (init-model) with the test tokenizer and two Alpaca records: a run that trains.
std::string trainable_inputs(const fs::path& dir) {
  fs::create_directories(dir);
  std::ofstream(dir / "tiny.json") << testing::kTinyLlamaConfigJson;
  const Result init = run("init-model --config " + (dir / "tiny.json").string() + " --output_dir " + (dir / "tiny").string());
  EXPECT_EQ(init.rc, 0) << init.out;
  fs::copy_file(testing::source_dir() / "data" / "tokenizer" / "tokenizer.model", dir / "tiny" / "tokenizer.model",
                fs::copy_options::overwrite_existing);
  std::ofstream(dir / "two.json") << R"([{"instruction": "Say it.", "input": "", "output": "the quick brown fox"},
      {"instruction": "Again.", "input": "", "output": "jumps over the lazy dog"}])";
  return "--model_name_or_path " + (dir / "tiny").string() + " --data_path " + (dir / "two.json").string() +
         " --max_steps 1 --per_device_train_batch_size 2 --save_strategy no --report_to none --disable_tqdm True";
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
                             "--model_max_length 64 --save_strategy no --report_to none --disable_tqdm True "
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

// A config.json the modules do not implement (an activation) is refused before output_dir is
// written; Mistral trains with a window its sequences cross and with one they fit.
TEST(CliBinary, UnsupportedModelConfigsAreRefusedBeforeWriting) {
  ALPACA_REQUIRE_SHARED("data/llama2-tokenizer/tokenizer.model");
  testing::TempDir dir("cli_bad_config");
  // Prompt-completion rows: short enough to train inside a 16-token window (stanford_alpaca's
  // prompt alone is longer).
  std::ofstream(dir.path() / "d.json") << R"([{"prompt": "Say it.", "completion": " the quick brown fox"},
      {"prompt": "Again.", "completion": " jumps over the lazy dog"}])";
  const std::string sizes = R"("vocab_size": 32000, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
      "num_attention_heads": 4, "max_position_embeddings": 128)";
  for (const auto& [tag, config, flags, rc, needles] :
       std::vector<std::tuple<std::string, std::string, std::string, int, std::vector<std::string>>>{
           {"gelu", R"({"model_type": "llama", "hidden_act": "gelu", )" + sizes + "}", "", 1, {"hidden_act", "gelu"}},
           {"window", R"({"model_type": "mistral", "sliding_window": 4, )" + sizes + "}", "--model_max_length 32", 0, {}},
           {"fits", R"({"model_type": "mistral", "sliding_window": 16, )" + sizes + "}", "--model_max_length 16", 0, {}}}) {
    SCOPED_TRACE(tag);
    const fs::path model = dir.path() / tag, out = dir.path() / ("out_" + tag), cfg = dir.path() / (tag + ".json");
    std::ofstream(cfg) << config;
    if (rc == 0) {  // weights to train
      Result init = run("init-model --config " + cfg.string() + " --output_dir " + model.string());
      ASSERT_EQ(init.rc, 0) << init.out;
    } else {
      fs::create_directories(model);
      fs::copy_file(cfg, model / "config.json");
    }
    fs::copy_file(testing::shared_dir() / "data" / "llama2-tokenizer" / "tokenizer.model", model / "tokenizer.model");
    const Result r = run("train --model_name_or_path " + model.string() + " --data_path " + (dir.path() / "d.json").string() +
                         " --max_steps 1 --per_device_train_batch_size 2 --save_strategy no --report_to none " +
                         "--disable_tqdm True --output_dir " + out.string() + " " + flags + " 2>&1");
    EXPECT_EQ(r.rc, rc) << r.out;
    for (const auto& needle : needles) EXPECT_NE(r.out.find(needle), std::string::npos) << needle << " not in:\n" << r.out;
    EXPECT_EQ(fs::exists(out / "training_args.json"), rc == 0) << r.out;
  }
}

// train.py's smart_tokenizer_and_embedding_resize: after resize_token_embeddings(len(tokenizer)) the
// last num_new_tokens rows of both embeddings are the mean of the rows before them, whether the
// checkpoint had fewer rows (32000: grown), as many (32001: saved after an earlier resize) or more
// (32003: shrunk). One step at learning rate 0 exports the rows as set up.
TEST(CliBinary, PadRowsAreTheMeanOfTheRowsBeforeThemAsTrainPy) {
  ALPACA_REQUIRE_SHARED("data/llama2-tokenizer/tokenizer.model");
  testing::TempDir dir("cli_pad_rows");
  std::ofstream(dir.path() / "d.json") << R"([{"instruction": "Say it.", "input": "", "output": "the quick brown fox"},
      {"instruction": "Again.", "input": "", "output": "jumps over the lazy dog"}])";
  auto tensors = [](const fs::path& d) {
    auto f = io::SafetensorsFile::open((d / "model.safetensors").string());
    return std::make_pair(f->tensor("model.embed_tokens.weight").clone(), f->tensor("lm_head.weight").clone());
  };
  for (int64_t stored : {32000, 32001, 32003}) {
    SCOPED_TRACE(stored);
    const std::string tag = std::to_string(stored);
    const fs::path cfg = dir.path() / (tag + ".json"), model = dir.path() / tag, out = dir.path() / ("out_" + tag);
    std::ofstream(cfg) << R"({"model_type": "llama", "vocab_size": )" << stored << R"(, "hidden_size": 16,
        "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "tie_word_embeddings": false})";
    Result r = run("init-model --config " + cfg.string() + " --output_dir " + model.string());
    ASSERT_EQ(r.rc, 0) << r.out;
    fs::copy_file(testing::shared_dir() / "data" / "llama2-tokenizer" / "tokenizer.model", model / "tokenizer.model");
    r = run("train --model_name_or_path " + model.string() + " --data_path " + (dir.path() / "d.json").string() +
            " --max_steps 1 --per_device_train_batch_size 2 --learning_rate 0 --save_strategy no --report_to none "
            "--disable_tqdm True --model_max_length 64 --output_dir " + out.string() + " 2>&1");
    ASSERT_EQ(r.rc, 0) << r.out;
    const auto [base_in, base_out] = tensors(model);
    const auto [in, out_w] = tensors(out);
    for (const auto& [got, base] : {std::make_pair(in, base_in), std::make_pair(out_w, base_out)}) {
      ASSERT_EQ(got.size(0), 32001);  // LLaMA-2's 32000 words + [PAD]
      EXPECT_TRUE(at::equal(got.narrow(0, 0, 32000), base.narrow(0, 0, 32000)));
      EXPECT_TRUE(at::allclose(got[32000], base.narrow(0, 0, 32000).mean(0), 1e-5, 1e-7))
          << "the [PAD] row is not the mean of the 32000 rows before it";
    }
  }
}

TEST(CliBinary, PrintsEffectiveArgsOnceAndWritesThemToOutputDir) {
  testing::TempDir dir("cli_binary");
  fs::path out = dir.path() / "run";
  // The model cannot be loaded: the trainer fails after the CLI has done its part, and leaves
  // nothing in output_dir (training_args.json is written once set-up has succeeded).
  Result r = run("train " + unloadable_inputs(dir.path()) + " --output_dir " + out.string() + " --learning_rate 2e-5 --bf16");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.rc, 2) << "a valid command line is not a usage error:\n" << r.out;
  EXPECT_EQ(count(r.out, "effective arguments"), 1u) << r.out;
  EXPECT_NE(r.out.find("* learning_rate = 2e-05"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out / "training_args.json")) << r.out;
  // A run that trains writes them.
  r = run("train " + trainable_inputs(dir.path() / "in") + " --output_dir " + out.string() + " --learning_rate 2e-5 --bf16");
  EXPECT_EQ(r.rc, 0) << r.out;
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

// A --deepspeed scheduler block runs DeepSpeed's class as DeepSpeedEngine steps it: WarmupDecayLR with
// HF's auto fills (warmup max(1, 0) = 1, raised to DeepSpeed's floor of 2; total = max_steps) runs the
// first two optimizer steps at warmup_min_lr 0, so a 2-step run leaves the weights as they were, and
// logs what HF Trainer + DeepSpeed log (get_last_lr after the engine's step: the next step's rate).
TEST(CliBinary, DeepSpeedSchedulerBlockRunsDeepSpeedsClass) {
  testing::TempDir dir("cli_ds_sched");
  const std::string in = trainable_inputs(dir.path() / "in");
  const std::string ds = R"('{"zero_optimization": {"stage": 0}, "gradient_clipping": "auto", "scheduler": {"type": "WarmupDecayLR",
      "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto", "total_num_steps": "auto",
      "warmup_type": "linear"}}}')";
  auto lrs = [](const fs::path& out) {
    std::vector<double> v;
    std::ifstream f(out / "metrics.jsonl");
    for (std::string line; std::getline(f, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j.contains("loss") && j.contains("learning_rate")) v.push_back(j["learning_rate"].get<double>());
    }
    return v;
  };
  const fs::path two = dir.path() / "two", four = dir.path() / "four";
  Result r = run("train " + in + " --max_steps 2 --learning_rate 3e-3 --logging_steps 1 --report_to jsonl --deepspeed " + ds + " --output_dir " +
                 two.string() + " 2>&1");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("DeepSpeed's WarmupDecayLR decides the learning rate"), std::string::npos) << r.out;
  auto base = io::SafetensorsFile::open((dir.path() / "in" / "tiny" / "model.safetensors").string());
  auto trained = io::SafetensorsFile::open((two / "model.safetensors").string());
  int compared = 0;
  for (const auto& name : base->names()) {
    // train.py's resize shrinks the embedding tables to the tokenizer's 512 words + [PAD] (a new row,
    // the mean of the others); the 512 rows kept are compared.
    at::Tensor after = trained->tensor(name), before = base->tensor(name);
    if (after.size(0) != before.size(0)) {
      after = after.narrow(0, 0, after.size(0) - 1);
      before = before.narrow(0, 0, after.size(0));
    }
    EXPECT_TRUE(at::equal(before, after)) << name << " moved at learning rate 0";
    ++compared;
  }
  EXPECT_GT(compared, 3);
  const auto logged_two = lrs(two);  // f(0) = 0, f(1) = 3e-3 * 1/2
  ASSERT_EQ(logged_two.size(), 2u) << r.out;
  EXPECT_EQ(logged_two[0], 0.0);
  EXPECT_NEAR(logged_two[1], 1.5e-3, 1e-15);
  r = run("train " + in + " --max_steps 4 --learning_rate 3e-3 --logging_steps 1 --report_to jsonl --deepspeed " + ds + " --output_dir " +
          four.string() + " 2>&1");
  ASSERT_EQ(r.rc, 0) << r.out;
  // DeepSpeed 0.19.8's get_last_lr after each step (tests/fixtures/deepspeed_lr: W = 2, total 4).
  const auto got = lrs(four);
  ASSERT_EQ(got.size(), 4u) << r.out;
  const std::vector<double> want = {0.0, 1.5e-3, 3e-3, 1.5e-3};
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(got[i], want[i], 1e-15) << "step " << i + 1;
  // An explicit total_num_steps must be the run's length (HF's mismatch check).
  const std::string wrong = R"('{"zero_optimization": {"stage": 0}, "scheduler": {"type": "WarmupDecayLR",
      "params": {"warmup_max_lr": "auto", "total_num_steps": 10}}}')";
  r = run("train " + in + " --max_steps 4 --learning_rate 3e-3 --deepspeed " + wrong + " --output_dir " +
          (dir.path() / "wrong").string() + " 2>&1");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("total_num_steps is 10 but this run makes 4 optimizer steps"), std::string::npos) << r.out;
}

// A dataset whose every response is cut off by --model_max_length trains nothing: an error saying
// so (HF would log loss nan), before anything is written.
TEST(CliBinary, NothingToTrainIsAnErrorNamingTheLength) {
  testing::TempDir dir("cli_nothing");
  const fs::path out = dir.path() / "out";
  const Result r = run("train " + trainable_inputs(dir.path() / "in") + " --model_max_length 8 --output_dir " + out.string() + " 2>&1");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("no token of any example is trained"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--model_max_length 8"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out)) << r.out;
}

// Checkpoint tensors no parameter takes (config.json with fewer layers than the weights) are
// named in a warning, as transformers' load report lists them UNEXPECTED.
TEST(CliBinary, CheckpointTensorsTheModelDoesNotUseAreNamed) {
  testing::TempDir dir("cli_unused");
  const std::string flags = trainable_inputs(dir.path() / "in");
  const fs::path model = dir.path() / "in" / "tiny";
  // Two layers in the weights, one in the config; the test tokenizer's 512 words + [PAD] rows, so
  // the model is built from its config and loaded shard by shard (a vocabulary to shrink would be
  // loaded whole, whose reader names each tensor it ignores too).
  const std::string sizes = R"("model_type": "llama", "vocab_size": 513, "hidden_size": 32, "intermediate_size": 64,
      "num_attention_heads": 4)";
  std::ofstream(model / "config.json") << "{" << sizes << R"(, "num_hidden_layers": 1})";
  std::ofstream(dir.path() / "two.json") << "{" << sizes << R"(, "num_hidden_layers": 2})";
  const fs::path two = dir.path() / "two";
  ASSERT_EQ(run("init-model --config " + (dir.path() / "two.json").string() + " --output_dir " + two.string()).rc, 0);
  fs::copy_file(two / "model.safetensors", model / "model.safetensors", fs::copy_options::overwrite_existing);
  const Result r = run("train " + flags + " --output_dir " + (dir.path() / "out").string() + " 2>&1");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("tensor(s) this model does not use"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("model.layers.1.input_layernorm.weight"), std::string::npos) << r.out;
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

  Result quiet = run(trainable_inputs(dir.path() / "in") + " --output_dir " + (dir.path() / "out").string() + " --log_level warning");
  EXPECT_EQ(quiet.rc, 0) << quiet.out;
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
}  // namespace alpaca::cli::test_cli_binary
