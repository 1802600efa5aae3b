// Parity with stanford_alpaca's preprocessing: for all 5,000 records of the shared Alpaca sample
// and the LLaMA-2 tokenizer, our input ids and labels equal those of train.py with the slow
// LlamaTokenizer (fixture from tests/reference/alpaca_tokenize_reference.py). Also reports the
// tokenization throughput beside the Python reference's.
#include <gtest/gtest.h>

#include <ctime>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "alpaca/data/alpaca_example.h"
#include "alpaca/util/sys.h"
#include "test_util.h"

namespace alpaca::data::test_alpaca_parity {
using tokenizer::Tokenizer;
namespace {

using ::alpaca::testing::binary_dir;
using ::alpaca::testing::shared_dir;

TEST(AlpacaParity, MatchesTrainPyOnAlpaca5000) {
  ALPACA_REQUIRE_SHARED("data/alpaca/alpaca_5000.json");
  ALPACA_REQUIRE_SHARED("data/llama2-tokenizer/tokenizer.model");
  const auto fixture = binary_dir() / "fixtures/alpaca_tokenize";
  ASSERT_TRUE(std::filesystem::exists(fixture / "examples.jsonl"))
      << "run the fixture first: ctest -R alpaca_parity (fixture_alpaca_tokenize)";

  auto records = load_alpaca_records((shared_dir() / "data/alpaca/alpaca_5000.json").string());
  ASSERT_EQ(records.size(), 5000u);
  Tokenizer tok = Tokenizer::load((shared_dir() / "data/llama2-tokenizer").string());
  tok.set_pad_token("[PAD]");  // train.py's smart_tokenizer_and_embedding_resize
  ASSERT_EQ(tok.pad_id(), 32000);

  // Warm up, then time all threads and one thread.
  tokenize_alpaca({records.begin(), records.begin() + 50}, tok, 512, 0);
  // Wall time is what users wait for; CPU time is steadier on a shared, busy machine.
  auto cpu_now = [] { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; };
  sys::Timer timer;
  double cpu0 = cpu_now();
  TokenizeStats stats;
  auto examples = tokenize_alpaca(records, tok, 512, 0, &stats);
  const double t_all = timer.seconds();
  const double cpu_all = cpu_now() - cpu0;
  timer.reset();
  cpu0 = cpu_now();
  auto serial = tokenize_alpaca(records, tok, 512, 1);
  const double t_one = timer.seconds();
  const double cpu_one = cpu_now() - cpu0;

  std::ifstream in(fixture / "examples.jsonl");
  std::string line;
  size_t i = 0, mismatched = 0;
  int64_t tokens = 0;
  for (; std::getline(in, line); ++i) {
    ASSERT_LT(i, examples.size());
    auto j = nlohmann::json::parse(line);
    auto ids = j["input_ids"].get<std::vector<int64_t>>();
    auto labels = j["labels"].get<std::vector<int64_t>>();
    tokens += static_cast<int64_t>(ids.size());
    bool same = ids == examples[i].input_ids && labels == examples[i].labels &&
                serial[i].input_ids == ids && serial[i].labels == labels;
    if (!same && ++mismatched <= 3) {
      ADD_FAILURE() << "record " << i << " differs: ours " << examples[i].input_ids.size()
                    << " ids, reference " << ids.size();
    }
  }
  EXPECT_EQ(i, records.size());
  EXPECT_EQ(mismatched, 0u) << mismatched << " of " << i << " records differ";

  std::ifstream timing_in(fixture / "timing.json");
  auto timing = nlohmann::json::parse(timing_in);
  const double py = timing["seconds"].get<double>();
  const double py_cpu = timing.value("cpu_seconds", 0.0);
  std::cout << "tokenization of " << records.size() << " records (" << tokens << " tokens): ours "
            << t_all << " s with " << std::thread::hardware_concurrency() << " threads ("
            << records.size() / t_all << " records/s, " << cpu_all << " s CPU), " << t_one
            << " s with 1 thread (" << records.size() / t_one << " records/s, " << cpu_one
            << " s CPU); Python reference (slow tokenizer, 1 thread) " << py << " s ("
            << records.size() / py << " records/s, " << py_cpu << " s CPU); truncated "
            << stats.num_truncated
            << ", no label tokens " << stats.num_no_label_tokens << "\n";
}

}  // namespace
}  // namespace alpaca::data::test_alpaca_parity
