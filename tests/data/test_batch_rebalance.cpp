// transformers 5's train_sampling_strategy "batch_rebalance" (data/sampler.h), against the real
// BatchRebalanceSampler (tests/reference/sampler_reference.py): every rank's micro-batches of two
// epochs, index for index, for fourteen shapes of data and split (uniform, long-tailed, a few
// very long rows among short ones, all equal, ties, one where CPython's set order decides; 1 to 8 ranks, accumulation 1 to 8, drop_last
// and the short last batch filled up to one row per micro-batch), and how HF's Trainer builds it
// (its effective batch and the seed 42 it keeps whatever TrainingArguments' seed).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "alpaca/data/sampler.h"
#include "alpaca/util/error.h"
#include "test_util.h"

namespace test_batch_rebalance {

using nlohmann::json;
using namespace alpaca::data;

namespace {

json load_fixture() {
  const auto path = std::filesystem::path(alpaca::testing::binary_dir()) / "fixtures/sampler/batch_rebalance.json";
  EXPECT_TRUE(std::filesystem::exists(path)) << path << ": run the fixture_sampler test first";
  return std::filesystem::exists(path) ? json::parse(std::ifstream(path)) : json();
}

SamplerOptions rebalance_options(const json& c, int64_t rank) {
  SamplerOptions o;
  o.world_size = c["world"].get<int64_t>();
  o.grad_accum = c["grad_accum"].get<int64_t>();
  o.per_device_batch = c["effective"].get<int64_t>() / (o.world_size * o.grad_accum);
  o.rank = rank;
  o.seed = 42;  // what Trainer passes (the class default; see the "trainer" record)
  o.drop_last = c["drop_last"].get<bool>();
  o.batch_rebalance = true;
  o.lengths = c["lengths"].get<std::vector<int64_t>>();
  return o;
}

}  // namespace

TEST(BatchRebalance, EveryRanksMicroBatchesAsTransformers) {
  const json fx = load_fixture();
  ASSERT_FALSE(fx.is_null());
  size_t micro = 0, varied = 0, set_order = 0;
  for (const auto& c : fx["cases"]) {
    const auto n = static_cast<int64_t>(c["lengths"].size());
    SCOPED_TRACE(c["kind"].get<std::string>() + ", " + std::to_string(n) + " examples, effective " +
                 c["effective"].dump() + ", world " + c["world"].dump() + ", accumulation " + c["grad_accum"].dump() +
                 (c["drop_last"].get<bool>() ? ", drop_last" : ""));
    set_order += c["set_order_matters"].get<bool>();
    for (size_t epoch = 0; epoch < c["epochs"].size(); ++epoch) {
      for (int64_t r = 0; r < c["world"].get<int64_t>(); ++r) {
        SCOPED_TRACE("epoch " + std::to_string(epoch) + ", rank " + std::to_string(r));
        const DistributedBatchSampler s(n, rebalance_options(c, r));
        std::vector<std::vector<int64_t>> got;
        for (int64_t step = 0; step < s.steps_per_epoch(); ++step)
          for (auto& mb : s.micro_batches(static_cast<int64_t>(epoch), step)) got.push_back(std::move(mb));
        const auto want = c["epochs"][epoch][static_cast<size_t>(r)].get<std::vector<std::vector<int64_t>>>();
        ASSERT_EQ(got, want);
        micro += got.size();
        for (const auto& mb : got) varied += mb.size() != static_cast<size_t>(rebalance_options(c, r).per_device_batch);
      }
    }
  }
  // The balancing moved rows between micro-batches (a check that the cases exercise it).
  EXPECT_GT(varied, micro / 4) << varied << " of " << micro;
  // A case where the order a frozen slot's groups are topped up in (CPython's set order) decides.
  EXPECT_GE(set_order, 1u);
  std::cout << "[batch_rebalance] " << fx["cases"].size() << " cases, " << micro << " micro-batches identical ("
            << varied << " not of the per-device size)\n";
}

TEST(BatchRebalance, GlobalBatchesAreTheRandomSamplersAndTheTailIsItsOwn) {
  const json fx = load_fixture();
  ASSERT_FALSE(fx.is_null());
  const json& c = fx["cases"][0];  // 97 examples, global batch 16: six full batches and a tail of 1
  const auto n = static_cast<int64_t>(c["lengths"].size());
  SamplerOptions plain = rebalance_options(c, 0);
  plain.batch_rebalance = false;
  const DistributedBatchSampler reb(n, rebalance_options(c, 0)), ran(n, plain);
  ASSERT_EQ(reb.steps_per_epoch(), ran.steps_per_epoch());
  for (int64_t step = 0; step < reb.steps_per_epoch(); ++step) {
    auto a = reb.global_batch(1, step), b = ran.global_batch(1, step);
    if (step + 1 == reb.steps_per_epoch()) {
      // The tail: its one example, filled up to world x accumulation (4) from the epoch's start.
      const auto order = reb.epoch_order(1);
      EXPECT_EQ(a, (std::vector<int64_t>{order[96], order[0], order[1], order[2]}));
      continue;
    }
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    EXPECT_EQ(a, b) << "step " << step;
  }
}

TEST(BatchRebalance, TrainerBuildsItAsTransformers) {
  const json fx = load_fixture();
  ASSERT_FALSE(fx.is_null());
  const json& t = fx["trainer"];
  // HF: train_batch_size x accumulation x world, and the class' own seed, not TrainingArguments'.
  EXPECT_EQ(t["effective"].get<int64_t>(),
            t["per_device_train_batch_size"].get<int64_t>() * t["gradient_accumulation_steps"].get<int64_t>());
  EXPECT_EQ(t["sampler_seed"].get<int64_t>(), 42);
  EXPECT_NE(t["seed"].get<int64_t>(), 42);
  EXPECT_TRUE(t["shuffle"].get<bool>());
  EXPECT_FALSE(t["drop_last"].get<bool>());
}

TEST(BatchRebalance, RejectsWhatItCannotBalance) {
  SamplerOptions o;
  o.batch_rebalance = true;
  o.lengths = {3, 1};
  EXPECT_THROW(DistributedBatchSampler(3, o), alpaca::Error);  // a length per example
  o.lengths = {3, 1, 2};
  o.group_by_length = true;
  EXPECT_THROW(DistributedBatchSampler(3, o), alpaca::Error);  // two strategies
  EXPECT_THROW(rebalance_global_batch({0, 1}, {3, 1}, 2, 2, 4), alpaca::Error);  // 2 rows for 4 micro-batches
  EXPECT_THROW(rebalance_global_batch({0, 5}, {3, 1}, 1, 1, 2), alpaca::Error);  // no length for 5
}

}  // namespace test_batch_rebalance
