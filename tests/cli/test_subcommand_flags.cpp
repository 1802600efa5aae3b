// Every subcommand's flags come from one table (cli/subcommand_flags.h, train_flags.inc for
// train): a bad or misspelt flag is a usage error, exit 2, naming the flag, in all seven subcommands;
// a missing required flag and a bad value too; --help of each lists its flags; the top-level help
// lists every subcommand; --version prints the version, the git commit, LibTorch's version and the CPU.
#include <gtest/gtest.h>

#include <regex>

#include "cli_test_util.h"

namespace test_subcommand_flags {

namespace {

using Result = alpaca::cli::test::BinaryRun;
Result run(const std::string& args) { return alpaca::cli::test::run_binary(args); }

}  // namespace

TEST(SubcommandFlags, ABadFlagIsAUsageErrorInEverySubcommand) {
  for (const char* sub : {"train", "init-model", "preprocess", "merge", "consolidate", "generate", "estimate-memory"}) {
    const std::string train_inputs = std::string(sub) == "train" ? " --model_name_or_path m --data_path d" : "";
    const Result r = run(std::string(sub) + train_inputs + " --no_such_flag 1");
    EXPECT_EQ(r.rc, 2) << sub << ": " << r.out;
    EXPECT_NE(r.out.find("alpaca-train: error: "), std::string::npos) << sub << ": " << r.out;
    EXPECT_NE(r.out.find("unknown flag --no_such_flag"), std::string::npos) << sub << ": " << r.out;
    EXPECT_EQ(r.out.find(".cpp:"), std::string::npos) << sub << ": a usage error shows no source location: " << r.out;
  }
  // A near miss gets a suggestion; a missing required flag and a bad value are usage errors too.
  alpaca::cli::test::expect_binary_usage_errors({
      {"init-model --confg c.json --output_dir o", "did you mean --config?"},
      {"merge --model_name_or_path b --adapter a", "merge: --output_dir is required"},
      {"init-model --config c.json --output_dir o --seed many", "--seed needs an integer, got 'many'"},
      {"preprocess --data_path d.json --output o.jsonl --packing maybe", ""},
      {"consolidate only_one_argument", "consolidate: expected CHECKPOINT and OUT"},
      {"generate --model_name_or_path m --top_k", "--top_k needs a value"},
      // TRL's names of the sequence length are preprocess's too; one flag under two names is named.
      {"preprocess --data_path d.json --output o.jsonl --model_max_length 8 --max_length 4",
       "preprocess: --max_length and --model_max_length are the same flag; give only --model_max_length"},
      {"preprocess --data_path d.json --output o.jsonl --max_seq_length 8 --max_length 4",
       "preprocess: --max_seq_length and --max_length are the same flag"},
      {"preprocess --data_path d.json --output o.jsonl --max_lenght 4", "did you mean --max_length?"},
  });
}

TEST(SubcommandFlags, HelpListsEverySubcommandAndEachSubcommandsFlags) {
  Result r = run("--help");
  ASSERT_EQ(r.rc, 0) << r.out;
  for (const char* sub : {"init-model", "preprocess", "merge", "consolidate", "generate", "estimate-memory", "--version"})
    EXPECT_NE(r.out.find(std::string("alpaca-train ") + sub), std::string::npos) << sub << "\n" << r.out;
  const std::vector<std::pair<std::string, std::vector<std::string>>> flags = {
      {"init-model", {"--config", "--output_dir", "--seed", "--dtype", "--save_max_shard_size"}},
      {"preprocess", {"--data_path", "--tokenizer", "--output", "--packing", "--num_threads"}},
      {"merge", {"--model_name_or_path", "--adapter", "--output_dir"}},
      {"consolidate", {"--save_max_shard_size"}},
      {"generate", {"--instruction", "--prompts", "--top_p", "--bf16", "--device"}},
      {"estimate-memory", {"--num_gpus", "--num_cpu_ranks", "--gpu_memory_gb", "--json"}}};
  for (const auto& [sub, names] : flags) {
    r = run(sub + " --help");
    EXPECT_EQ(r.rc, 0) << sub << "\n" << r.out;
    EXPECT_NE(r.out.find("Usage: alpaca-train " + sub), std::string::npos) << r.out;
    for (const auto& n : names) EXPECT_NE(r.out.find("  " + n + " "), std::string::npos) << sub << ": " << n << "\n" << r.out;
  }
  r = run("preprocess --help");
  EXPECT_NE(r.out.find("Aliases: --max_length, --max_seq_length."), std::string::npos) << r.out;
}

TEST(SubcommandFlags, VersionPrintsVersionCommitAndLibTorch) {
  const Result r = run("--version");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(^alpaca-train \d+\.\d+\.\d+\n)"))) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(\ngit commit ([0-9a-f]{7,40}|unknown)\n)"))) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(\nLibTorch \d+\.\d+\.\d+\n)"))) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(\nCPU .+\n)"))) << r.out;
}

}  // namespace test_subcommand_flags
