// The host-synchronisation counter: counts exactly the calls, from any thread; and the
// asynchronous host->device copy is the identity on CPU (its CUDA path runs in the gpu tests).
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "alpaca/util/host_sync.h"

namespace alpaca::util {
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

}  // namespace
}  // namespace alpaca::util
