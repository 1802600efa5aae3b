// DistributedBatchSampler: global batches independent of world size and accumulation split,
// HF-compatible shuffling and length grouping, resumption mid-epoch.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <set>

#include "alpaca/data/sampler.h"
#include "alpaca/util/error.h"

namespace alpaca::data::test_sampler {
namespace {

// Every rank's micro-batches of one step, concatenated, as a sorted multiset.
std::vector<int64_t> gather_step(int64_t n, SamplerOptions opt, int64_t epoch, int64_t step) {
  std::vector<int64_t> all;
  for (int64_t r = 0; r < opt.world_size; ++r) {
    opt.rank = r;
    DistributedBatchSampler s(n, opt);
    auto micro = s.micro_batches(epoch, step);
    EXPECT_EQ(static_cast<int64_t>(micro.size()), opt.grad_accum);
    for (const auto& m : micro) {
      EXPECT_EQ(static_cast<int64_t>(m.size()), opt.per_device_batch);
      all.insert(all.end(), m.begin(), m.end());
    }
  }
  std::sort(all.begin(), all.end());
  return all;
}

TEST(Sampler, GlobalBatchesIndependentOfWorldAndAccumulation) {
  const int64_t n = 1003;  // not a multiple of the global batch: exercises the last batch
  const int64_t global = 24;
  // Splits of the same global batch of 24: world x per_device x accum.
  std::vector<std::array<int64_t, 3>> splits = {{1, 24, 1}, {1, 4, 6}, {2, 12, 1}, {2, 3, 4},
                                                {3, 8, 1},  {3, 2, 4}, {4, 6, 1},  {4, 1, 6},
                                                {1, 1, 24}, {4, 3, 2}, {3, 1, 8},  {2, 6, 2}};
  for (bool group : {false, true}) {
    SamplerOptions base;
    base.seed = 7;
    base.group_by_length = group;
    for (int64_t i = 0; i < n; ++i) base.lengths.push_back((i * 37) % 101);
    SamplerOptions ref_opt = base;
    ref_opt.per_device_batch = global;
    DistributedBatchSampler ref(n, ref_opt);
    ASSERT_EQ(ref.steps_per_epoch(), 42);  // ceil(1003 / 24)
    for (const auto& split : splits) {
      SamplerOptions opt = base;
      opt.world_size = split[0];
      opt.per_device_batch = split[1];
      opt.grad_accum = split[2];
      DistributedBatchSampler s(n, opt);
      EXPECT_EQ(s.steps_per_epoch(), ref.steps_per_epoch());
      for (int64_t epoch : {0, 1}) {
        std::set<int64_t> seen;
        for (int64_t step = 0; step < s.steps_per_epoch(); ++step) {
          auto expect = ref.global_batch(epoch, step);
          std::sort(expect.begin(), expect.end());
          auto got = gather_step(n, opt, epoch, step);
          ASSERT_EQ(got, expect) << "world " << split[0] << " B " << split[1] << " accum "
                                 << split[2] << " epoch " << epoch << " step " << step;
          seen.insert(got.begin(), got.end());
        }
        EXPECT_EQ(static_cast<int64_t>(seen.size()), n) << "every example once per epoch";
      }
    }
  }
}

TEST(Sampler, ShufflesLikeTorchRandpermAndPerEpoch) {
  SamplerOptions opt;
  opt.seed = 42;
  opt.per_device_batch = 10;
  DistributedBatchSampler s(100, opt);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(42 + 3);
  at::Tensor perm = at::randperm(100, gen, at::kLong);
  std::vector<int64_t> expect(perm.data_ptr<int64_t>(), perm.data_ptr<int64_t>() + 100);
  EXPECT_EQ(s.epoch_order(3), expect);
  EXPECT_NE(s.epoch_order(0), s.epoch_order(1));
  // The last partial batch wraps to the start of the same epoch order.
  DistributedBatchSampler odd(95, opt);
  EXPECT_EQ(odd.steps_per_epoch(), 10);
  auto last = odd.global_batch(0, 9);
  const auto& order = odd.epoch_order(0);
  EXPECT_EQ(last[4], order[94]);
  EXPECT_EQ(last[5], order[0]);
  opt.drop_last = true;
  EXPECT_EQ(DistributedBatchSampler(95, opt).steps_per_epoch(), 9);
  opt.shuffle = false;
  EXPECT_EQ(DistributedBatchSampler(95, opt).global_batch(0, 1)[0], 10);
}

TEST(Sampler, ResumeMidEpochContinuesWithTheNextExamples) {
  SamplerOptions opt;
  opt.world_size = 3;
  opt.rank = 1;
  opt.per_device_batch = 2;
  opt.grad_accum = 2;
  opt.seed = 11;
  const int64_t n = 100;  // 9 steps per epoch of 12
  DistributedBatchSampler run(n, opt);
  std::vector<std::vector<int64_t>> uninterrupted;
  SamplerPosition pos;
  for (int i = 0; i < 20; ++i, pos = run.next(pos))
    for (const auto& m : run.micro_batches(pos.epoch, pos.step)) uninterrupted.push_back(m);
  // Stop after 13 steps (mid epoch 1), "restart the process" with a new sampler.
  SamplerPosition saved;
  {
    DistributedBatchSampler first(n, opt);
    for (int i = 0; i < 13; ++i) saved = first.next(saved);
  }
  EXPECT_EQ(saved.epoch, 1);
  EXPECT_EQ(saved.step, 4);
  DistributedBatchSampler resumed(n, opt);
  std::vector<std::vector<int64_t>> tail;
  for (int i = 13; i < 20; ++i, saved = resumed.next(saved))
    for (const auto& m : resumed.micro_batches(saved.epoch, saved.step)) tail.push_back(m);
  EXPECT_EQ(tail, std::vector<std::vector<int64_t>>(uninterrupted.begin() + 13 * 2,
                                                    uninterrupted.end()));
}

TEST(Sampler, LengthGroupingMatchesHf) {
  // HF get_length_grouped_indices on a fixed permutation, by hand: n=16, batch 2 ->
  // mega_batch_mult = min(16 // 8, 50) = 2 -> mega-batches of 4, sorted longest first
  // (stable), then the longest overall swapped to the front.
  std::vector<int64_t> perm = {3, 0, 7, 1, 12, 5, 9, 2, 4, 15, 11, 8, 6, 10, 13, 14};
  std::vector<int64_t> lengths = {5, 9, 2, 7, 7, 1, 3, 8, 4, 6, 10, 2, 11, 0, 3, 5};
  auto got = length_grouped_order(perm, lengths, 2);
  // mega-batches: [3,0,7,1]->by len 7,5,8,9 -> [1,7,3,0]; [12,5,9,2]->11,1,6,2 -> [12,9,2,5];
  // [4,15,11,8]->7,5,2,4 -> [4,15,8,11]; [6,10,13,14]->3,10,0,3 -> [10,6,14,13].
  // Longest first element: 12 (len 11) in mega-batch 1: swap with 1.
  std::vector<int64_t> expect = {12, 7, 3, 0, 1, 9, 2, 5, 4, 15, 8, 11, 10, 6, 14, 13};
  EXPECT_EQ(got, expect);
}

// accelerate's BatchSamplerShard (even_batches) and gather_for_metrics, worked by hand from their
// code; tests/train/test_train_parity checks the losses and metrics against the real classes.
TEST(Sampler, EvalBatchesFillTheLastRoundAsAccelerate) {
  const std::vector<int64_t> order = {0, 1, 2, 3, 4};
  // world 1: batches [0,1] [2,3] [4], the last short and kept whole.
  auto one = eval_batches(order, 2, 1, 0);
  ASSERT_EQ(one.size(), 3u);
  EXPECT_EQ(one[2].indices, (std::vector<int64_t>{4}));
  EXPECT_EQ(one[2].loss_weight, 1);
  EXPECT_TRUE(one[2].metrics_counted);
  // world 2, batch 2: round 0 [0,1] | [2,3]; round 1 [4] + filler 0 on rank 0, [1,2] on rank 1;
  // remainder 5 % 4 = 1: one repetition of rank 0's mean, rank 0's scalars only.
  auto r0 = eval_batches(order, 2, 2, 0), r1 = eval_batches(order, 2, 2, 1);
  ASSERT_EQ(r0.size(), 2u);
  ASSERT_EQ(r1.size(), 2u);
  EXPECT_EQ(r0[0].indices, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(r1[0].indices, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(r0[0].loss_weight, 2);
  EXPECT_EQ(r0[1].indices, (std::vector<int64_t>{4, 0}));
  EXPECT_EQ(r1[1].indices, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(r0[1].loss_weight, 1);
  EXPECT_EQ(r1[1].loss_weight, 0);
  EXPECT_TRUE(r0[1].metrics_counted);
  EXPECT_FALSE(r1[1].metrics_counted);
  // 6 examples, world 4, batch 2: one round, rank 3 gets the first batch again; remainder 6 keeps
  // ranks 0-2's losses and all four ranks' scalars (the truncation counts samples, not ranks).
  const std::vector<int64_t> six = {5, 4, 3, 2, 1, 0};
  auto w3 = eval_batches(six, 2, 4, 3);
  ASSERT_EQ(w3.size(), 1u);
  EXPECT_EQ(w3[0].indices, (std::vector<int64_t>{5, 4}));
  EXPECT_EQ(w3[0].loss_weight, 0);
  EXPECT_TRUE(w3[0].metrics_counted);
  EXPECT_EQ(eval_batches(six, 2, 4, 2)[0].loss_weight, 2);
  // Fewer examples than one round: the first batches doubled (3 examples, world 2, batch 2).
  auto s1 = eval_batches({7, 8, 9}, 2, 2, 1);
  EXPECT_EQ(s1[0].indices, (std::vector<int64_t>{9, 7}));
  EXPECT_EQ(s1[0].loss_weight, 1);
  auto t3 = eval_batches({7}, 2, 3, 2);  // initial data [7] doubled to [7,7,7,7,7,7,7,7]
  EXPECT_EQ(t3[0].indices, (std::vector<int64_t>{7, 7}));
  EXPECT_EQ(eval_batches({7}, 2, 3, 0)[0].indices, (std::vector<int64_t>{7, 7}));
  EXPECT_EQ(eval_batches({7}, 2, 3, 0)[0].loss_weight, 1);
  // Without a remainder nothing is filled or dropped.
  for (const auto& eb : eval_batches({0, 1, 2, 3, 4, 5, 6, 7}, 2, 2, 1)) {
    EXPECT_EQ(eb.loss_weight, 2);
    EXPECT_TRUE(eb.metrics_counted);
  }
}

TEST(Sampler, EvalOrderIsSequentialOrLengthGroupedWithTheSeed) {
  EXPECT_EQ(eval_order(4, 2, false, {}, 42), (std::vector<int64_t>{0, 1, 2, 3}));
  const std::vector<int64_t> lengths = {5, 9, 2, 7, 7, 1, 3, 8, 4, 6, 10, 2, 11, 0, 3, 5};
  auto gen = at::make_generator<at::CPUGeneratorImpl>(42);
  const at::Tensor perm = at::randperm(16, gen, at::TensorOptions().dtype(at::kLong));
  const std::vector<int64_t> p(perm.data_ptr<int64_t>(), perm.data_ptr<int64_t>() + 16);
  EXPECT_EQ(eval_order(16, 2, true, lengths, 42), length_grouped_order(p, lengths, 2));
  EXPECT_NE(eval_order(16, 2, true, lengths, 42), eval_order(16, 2, true, lengths, 7));
  EXPECT_THROW(eval_order(16, 2, true, {1, 2}, 42), Error);
}

TEST(Sampler, RejectsBadOptions) {
  SamplerOptions opt;
  opt.world_size = 2;
  opt.rank = 2;
  EXPECT_THROW(DistributedBatchSampler(10, opt), Error);
  opt.rank = 0;
  opt.per_device_batch = 0;
  EXPECT_THROW(DistributedBatchSampler(10, opt), Error);
  opt.per_device_batch = 8;
  opt.drop_last = true;
  EXPECT_THROW(DistributedBatchSampler(10, opt), Error);
  opt.drop_last = false;
  opt.group_by_length = true;
  EXPECT_THROW(DistributedBatchSampler(10, opt), Error);
  opt.group_by_length = false;
  DistributedBatchSampler s(10, opt);
  EXPECT_THROW(s.micro_batches(0, 1), Error);
  EXPECT_THROW(DistributedBatchSampler(0, SamplerOptions{}), Error);
}

}  // namespace
}  // namespace alpaca::data::test_sampler
