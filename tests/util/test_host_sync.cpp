// The host-synchronisation counter: counts exactly the calls, from any thread; the asynchronous
// host->device copy is the identity on CPU (its CUDA path runs in the gpu tests); and the hot
// path's points count what a CUDA run waits for.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "alpaca/model/loss.h"
#include "alpaca/optim/grad_clip.h"
#include "alpaca/util/host_sync.h"

namespace alpaca::util::test_host_sync {
namespace {

TEST(HostSync, CountsEveryCallFromEveryThread) {
  const int64_t before = host_sync_count();
  count_host_sync();
  EXPECT_EQ(host_sync_count() - before, 1);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([] {
      for (int i = 0; i < 1000; ++i) count_host_sync();
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(host_sync_count() - before, 4001);
}

TEST(HostSync, ToDeviceAsyncOnCpuIsTheSameTensor) {
  const at::Tensor t = at::arange(7, at::kLong);
  const int64_t before = host_sync_count();
  const at::Tensor u = to_device_async(t, at::Device(at::kCPU));
  EXPECT_TRUE(u.is_same(t));
  EXPECT_FALSE(to_device_async(at::Tensor(), at::Device(at::kCPU)).defined());
  EXPECT_EQ(host_sync_count(), before);  // a copy is not a synchronisation
}

// The hot path's points: the gradient norm over many shards is one read (not one per shard) and
// exactly the host loop's fp64 sum; the non-finite check is one read; the fused loss with labels
// on the host reads nothing from the device.
TEST(HostSync, GradNormIsOneReadAndTheFp64Sum) {
  at::Generator gen = at::detail::createCPUGenerator(5);
  std::vector<at::Tensor> shards;
  for (int64_t n : {7, 0, 130, 1, 4099}) shards.push_back(at::randn({n}, gen) * (n + 1));
  shards.push_back(at::Tensor());
  double sq = 0;  // a host loop over the shards, in fp64
  for (const auto& g : shards) {
    if (!g.defined() || g.numel() == 0) continue;
    sq += g.to(at::kDouble).square().sum().item<double>();
  }
  const int64_t before = host_sync_count();
  const double got = optim::global_grad_norm(shards, nullptr);
  EXPECT_EQ(host_sync_count() - before, 1);
  EXPECT_NEAR(got, std::sqrt(sq), 1e-6 * std::sqrt(sq));
  EXPECT_FALSE(optim::any_non_finite(shards, nullptr));
  EXPECT_EQ(host_sync_count() - before, 2);
  shards[2][5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(optim::any_non_finite(shards, nullptr));
}

TEST(HostSync, FusedLossWithHostLabelsReadsNothingFromTheDevice) {
  at::Generator gen = at::detail::createCPUGenerator(6);
  const at::Tensor h = at::randn({2, 5, 8}, gen), w = at::randn({11, 8}, gen);
  at::Tensor labels = at::randint(11, {2, 5}, gen, at::kLong);
  labels[0][1] = -100;
  const int64_t before = host_sync_count();
  const model::LossSum ls = model::causal_lm_head_loss_sum(h, w, labels);
  EXPECT_EQ(host_sync_count(), before);
  EXPECT_EQ(ls.num_tokens, 7);  // 2 rows x 4 shifted positions, one ignored
  EXPECT_TRUE(at::allclose(ls.sum, model::causal_lm_loss_sum(at::matmul(h, w.t()), labels).sum, 1e-5, 1e-5));
}

}  // namespace
}  // namespace alpaca::util::test_host_sync
