// transformers' Adafactor (ShardedAdamW with options.adafactor: --optim adafactor) against
// transformers itself (tests/reference/adafactor_reference.py: the class with the kwargs its Trainer
// passes, six steps of eight parameters: matrices of several shapes, a one-column one, vectors
// without weight decay, a zero gradient row, steps that clip at the update RMS and steps that do
// not). One flat shard holding every parameter; then the buffer cut into 3 and 50 shards (rows cut by
// shard boundaries, shards shorter than a row) stepped by one thread per rank with an all-reduce
// SUM: every rank keeps the same statistics, and the parameters are those of one rank within
// float rounding. The statistics as a checkpoint names them, and a resume from them.
#include <gtest/gtest.h>

#include <barrier>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "alpaca/fsdp/shard_info.h"
#include "alpaca/io/safetensors.h"
#include "alpaca/optim/adamw.h"
#include "optim_reference.h"
#include "test_util.h"

namespace alpaca::optim::test_adafactor {
namespace {

namespace fs = std::filesystem;

fs::path fixture() { return testing::binary_dir() / "fixtures" / "adafactor"; }

using Reference = test_reference::OptimReference;

Reference load() { return test_reference::load_optim_reference(fixture(), "adafactor.json", "adafactor.safetensors"); }

using Param = test_reference::RefParam;

std::vector<Param> params_of(const nlohmann::json& meta, int64_t* total) { return test_reference::ref_params(meta, total); }

AdamWOptions options_of(const nlohmann::json& meta) {
  AdamWOptions o;
  o.weight_decay = meta["weight_decay"].get<double>();
  o.adafactor = true;
  return o;
}

using Flat = test_reference::RefFlat;

Flat make_flat(const Reference& ref, const std::vector<Param>& params, int64_t total, int world) {
  return test_reference::make_ref_flat(ref, params, total, world, "init.");
}

void set_grads(Flat& f, const Reference& ref, const std::vector<Param>& params, int step) {
  for (const Param& p : params)
    f.grads.narrow(0, p.offset, p.numel).copy_(ref.get("grad." + std::to_string(step) + "." + p.name).reshape({-1}));
}

using Optimizers = std::vector<std::unique_ptr<ShardedAdamW>>;

// `world` ranks over the reference's parameters: the flat buffer, one optimizer per rank with an
// all-reduce SUM between their threads (every rank adds the parts in the same order).
class Ranks {
 public:
  Ranks(const Reference& ref, const std::vector<Param>& params, int64_t total, int world)
      : ref_(ref), params_(params), flat(make_flat(ref, params, total, world)), exchange_(world), sync_(world) {
    for (int r = 0; r < world; ++r) {
      opts.push_back(std::make_unique<ShardedAdamW>(std::vector<OptimShard>{flat.shards[r]}, options_of(ref.meta)));
      if (world > 1)
        opts.back()->set_sum_reducer([this, r, world](at::Tensor& t) {
          exchange_[r] = t.clone();
          sync_.arrive_and_wait();
          at::Tensor sum = at::zeros_like(t);
          for (int k = 0; k < world; ++k) sum.add_(exchange_[k]);
          sync_.arrive_and_wait();
          t.copy_(sum);
        });
    }
  }
  // The reference's steps [first, last), one thread per rank.
  void run(int first, int last) {
    const auto lrs = ref_.meta["lrs"].get<std::vector<double>>();
    for (int step = first; step < last; ++step) {
      set_grads(flat, ref_, params_, step);
      std::vector<std::thread> threads;
      for (size_t r = 0; r < opts.size(); ++r) threads.emplace_back([&, r] { opts[r]->step(lrs[step]); });
      for (auto& t : threads) t.join();
    }
  }

 private:
  const Reference& ref_;
  const std::vector<Param>& params_;

 public:
  Flat flat;
  Optimizers opts;

 private:
  std::vector<at::Tensor> exchange_;
  std::barrier<> sync_;
};

double max_rel_diff(const at::Tensor& a, const at::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item<double>();
}

TEST(Adafactor, TransformersBuildsItWithTheScheduleAsItsLearningRate) {
  const Reference ref = load();
  ASSERT_FALSE(ref.meta.is_null());
  const auto& w = ref.meta["wiring"];
  EXPECT_EQ(w["class"], "transformers.optimization.Adafactor");
  EXPECT_EQ(w["kwargs"]["scale_parameter"], false);
  EXPECT_EQ(w["kwargs"]["relative_step"], false);
  EXPECT_FALSE(w["kwargs"].contains("beta1"));  // no first moment
  // The class defaults adafactor.cpp writes as constants.
  EXPECT_EQ(w["defaults"]["eps"], nlohmann::json::array({1e-30, 1e-3}));
  EXPECT_EQ(w["defaults"]["clip_threshold"].get<double>(), 1.0);
  EXPECT_EQ(w["defaults"]["decay_rate"].get<double>(), -0.8);
  EXPECT_TRUE(w["defaults"]["beta1"].is_null());
}

// One rank holding every parameter: transformers' parameters and statistics after every step.
TEST(Adafactor, OneShardMatchesTransformers) {
  const Reference ref = load();
  ASSERT_FALSE(ref.meta.is_null());
  int64_t total = 0;
  const auto params = params_of(ref.meta, &total);
  Ranks one(ref, params, total, 1);
  const int steps = ref.meta["steps"].get<int>();
  double worst_param = 0, worst_state = 0;
  for (int step = 0; step < steps; ++step) {
    one.run(step, step + 1);
    for (const Param& p : params) {
      const std::string s = std::to_string(step);
      worst_param = std::max(worst_param, max_rel_diff(one.flat.values.narrow(0, p.offset, p.numel),
                                                       ref.get("param." + s + "." + p.name).reshape({-1})));
    }
    for (const auto& st : one.opts[0]->adafactor_state())
      worst_state = std::max(worst_state, max_rel_diff(st.value, ref.get(st.key + "." + std::to_string(step) + "." + st.param)));
  }
  // The statistics are transformers' ops in its order (bit for bit); the update's RMS is a sum of
  // squares where torch takes norm(2), one rounding apart, which the clipped steps carry into the
  // parameters.
  std::printf("one shard vs transformers: parameters within %.3g, statistics within %.3g (relative)\n", worst_param,
              worst_state);
  EXPECT_EQ(worst_state, 0.0);
  EXPECT_LT(worst_param, 5e-7);
}

// The statistics a checkpoint holds, named as torch's Adafactor.state names them.
TEST(Adafactor, StateIsNamedAsTorchNamesIt) {
  const Reference ref = load();
  ASSERT_FALSE(ref.meta.is_null());
  int64_t total = 0;
  const auto params = params_of(ref.meta, &total);
  Ranks one(ref, params, total, 1);
  std::map<std::string, std::vector<std::string>> keys;
  for (const auto& st : one.opts[0]->adafactor_state()) {
    keys[st.param].push_back(st.key);
    const at::Tensor want = ref.get(st.key + ".0." + st.param);
    EXPECT_EQ(st.value.sizes(), want.sizes()) << st.param << " " << st.key;
  }
  for (auto& [name, k] : keys) {
    std::sort(k.begin(), k.end());
    EXPECT_EQ(k, ref.meta["state_keys"][name].get<std::vector<std::string>>()) << name;
  }
  EXPECT_EQ(keys.size(), params.size());
  // rows + columns of a matrix, every element of a vector: what the planner counts.
  int64_t expect = 0;
  for (const Param& p : params) expect += p.shape.size() == 2 ? p.shape[0] + p.shape[1] : p.numel;
  EXPECT_EQ(one.opts[0]->state_bytes(), 4 * expect);
}

class AdafactorShards : public ::testing::TestWithParam<int> {};

// The flat buffer cut into `world` shards, each stepped by its own thread: every rank holds the same
// statistics, and parameters and statistics are those of one rank within float rounding (partial
// sums added in another order).
TEST_P(AdafactorShards, MatchOneRank) {
  const int world = GetParam();
  const Reference ref = load();
  ASSERT_FALSE(ref.meta.is_null());
  int64_t total = 0;
  const auto params = params_of(ref.meta, &total);
  const int steps = ref.meta["steps"].get<int>();
  Ranks one(ref, params, total, 1), many(ref, params, total, world);
  one.run(0, steps);
  many.run(0, steps);
  for (int r = 1; r < world; ++r) {
    const auto a = many.opts[0]->adafactor_state(), b = many.opts[r]->adafactor_state();
    ASSERT_EQ(a.size(), b.size());
    for (size_t k = 0; k < a.size(); ++k) ASSERT_TRUE(at::equal(a[k].value, b[k].value)) << "rank " << r << " " << a[k].param;
  }
  double worst_param = 0, worst_state = 0;
  for (const Param& p : params)
    worst_param = std::max(worst_param, max_rel_diff(many.flat.values.narrow(0, p.offset, p.numel),
                                                     one.flat.values.narrow(0, p.offset, p.numel)));
  const auto a = many.opts[0]->adafactor_state(), b = one.opts[0]->adafactor_state();
  for (size_t k = 0; k < a.size(); ++k) worst_state = std::max(worst_state, max_rel_diff(a[k].value, b[k].value));
  std::printf("%d shards vs one: parameters within %.3g, statistics within %.3g (relative)\n", world, worst_param,
              worst_state);
  EXPECT_LT(worst_param, 5e-7);
  EXPECT_LT(worst_state, 1e-6);
  EXPECT_GT(worst_param + worst_state, 0.0);  // the cut rows did add partial sums across ranks
}

INSTANTIATE_TEST_SUITE_P(Worlds, AdafactorShards, ::testing::Values(3, 50));

// A resume: a fresh optimizer given the statistics (by name) and the step count continues exactly.
TEST(Adafactor, ResumesFromItsNamedStateBitwise) {
  const Reference ref = load();
  ASSERT_FALSE(ref.meta.is_null());
  int64_t total = 0;
  const auto params = params_of(ref.meta, &total);
  const int steps = ref.meta["steps"].get<int>();
  for (int world : {1, 3}) {
    SCOPED_TRACE(world);
    Ranks straight(ref, params, total, world), first(ref, params, total, world), resumed(ref, params, total, world);
    straight.run(0, steps);
    first.run(0, 3);
    std::map<std::string, at::Tensor> saved;  // what a checkpoint holds
    for (const auto& st : first.opts[0]->adafactor_state()) saved[st.key + "." + st.param] = st.value.clone();
    resumed.flat.values.copy_(first.flat.values);
    for (auto& o : resumed.opts) {
      o->set_step_count(3);
      for (const auto& st : o->adafactor_state()) st.value.copy_(saved.at(st.key + "." + st.param));
    }
    resumed.run(3, steps);
    EXPECT_TRUE(at::equal(resumed.flat.values, straight.flat.values));
  }
}

}  // namespace
}  // namespace alpaca::optim::test_adafactor
