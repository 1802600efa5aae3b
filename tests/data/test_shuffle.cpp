// datasets' Dataset.shuffle(seed) (data/shuffle.h: NumPy's default_rng(seed).permutation) and TRL's
// --shuffle_dataset pipeline (shuffle, pack, shuffle), against tests/reference/shuffle_reference.py:
// NumPy's permutations and datasets' row orders for seeds of one, two and three 32-bit words, and
// every packed block of TRL's _prepare_dataset order, bfd and wrapped.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "alpaca/data/alpaca_example.h"
#include "alpaca/data/packing.h"
#include "alpaca/data/shuffle.h"
#include "test_util.h"

namespace test_shuffle {

using nlohmann::json;
using namespace alpaca::data;

namespace {

json load_fixture() {
  const auto path = std::filesystem::path(alpaca::testing::binary_dir()) / "fixtures/shuffle/shuffle.json";
  if (!std::filesystem::exists(path)) return json();
  return json::parse(std::ifstream(path));
}

}  // namespace

TEST(Shuffle, NumpyPermutationAndDatasetsOrder) {
  const json fx = load_fixture();
  if (fx.is_null()) GTEST_SKIP() << "fixture not written";
  size_t n_cases = 0;
  for (const auto& c : fx["permutations"]) {
    const uint64_t seed = std::stoull(c["seed"].get<std::string>());
    const int64_t n = c["n"].get<int64_t>();
    SCOPED_TRACE("seed " + std::to_string(seed) + ", n " + std::to_string(n));
    const auto got = numpy_permutation(seed, n);
    EXPECT_EQ(got, c["perm"].get<std::vector<int64_t>>());
    std::vector<int64_t> rows(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) rows[static_cast<size_t>(i)] = i;
    EXPECT_EQ(datasets_shuffle(rows, seed), c["datasets"].get<std::vector<int64_t>>());
    ++n_cases;
  }
  EXPECT_EQ(n_cases, 10u);
  EXPECT_TRUE(numpy_permutation(5, 0).empty());
}

TEST(Shuffle, TrlShuffleDatasetPackingOrder) {
  const json fx = load_fixture();
  if (fx.is_null()) GTEST_SKIP() << "fixture not written";
  const json& trl = fx["trl"];
  std::vector<Example> rows(trl["rows"]["input_ids"].size());
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i].input_ids = trl["rows"]["input_ids"][i].get<std::vector<int64_t>>();
    rows[i].labels = trl["rows"]["labels"][i].get<std::vector<int64_t>>();
  }
  const auto seed = trl["seed"].get<uint64_t>();
  for (const char* name : {"bfd", "wrapped"}) {
    SCOPED_TRACE(name);
    PackingStats st;
    const auto blocks =
        pack_and_shuffle(rows, parse_packing_strategy(name), trl["seq_length"].get<int64_t>(), &st, seed);
    const json& want = trl["packed"][name];
    ASSERT_EQ(blocks.size(), want.size());
    for (size_t i = 0; i < blocks.size(); ++i) {
      EXPECT_EQ(blocks[i].input_ids, want[i]["input_ids"].get<std::vector<int64_t>>()) << "block " << i;
      EXPECT_EQ(blocks[i].labels, want[i]["labels"].get<std::vector<int64_t>>()) << "block " << i;
      if (want[i].contains("position_ids")) {
        EXPECT_EQ(blocks[i].position_ids, want[i]["position_ids"].get<std::vector<int64_t>>()) << "block " << i;
      }
    }
    // Not the unshuffled packing's order (the check can fail).
    const auto plain = pack_examples(rows, trl["seq_length"].get<int64_t>(), &st, parse_packing_strategy(name));
    EXPECT_NE(plain.front().input_ids, want[0]["input_ids"].get<std::vector<int64_t>>());
    std::cout << "[shuffle] TRL shuffle_dataset + " << name << " packing: " << blocks.size() << " blocks identical\n";
  }
}

}  // namespace test_shuffle
