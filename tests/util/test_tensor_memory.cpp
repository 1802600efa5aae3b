// The counting CPU allocator: live bytes, phase peaks, the cap (OutOfMemoryError), and that
// tensors behave as with the default allocator.
#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include "alpaca/util/sys.h"
#include "alpaca/util/tensor_memory.h"

namespace alpaca::util::test_tensor_memory {
namespace {

class TensorMemory : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(install_counting_cpu_allocator());
    set_cpu_tensor_cap_bytes(0);
  }
  void TearDown() override { set_cpu_tensor_cap_bytes(0); }
};

TEST_F(TensorMemory, CountsLiveStorageAndFrees) {
  const int64_t before = cpu_tensor_bytes();
  {
    at::Tensor a = at::empty({1000}, at::kFloat);
    EXPECT_EQ(cpu_tensor_bytes() - before, 4000);
    at::Tensor v = a.narrow(0, 10, 100);  // a view shares the storage: no new bytes
    EXPECT_EQ(cpu_tensor_bytes() - before, 4000);
    at::Tensor b = at::zeros({10, 10}, at::kDouble);
    EXPECT_EQ(cpu_tensor_bytes() - before, 4800);
  }
  EXPECT_EQ(cpu_tensor_bytes(), before);
}

TEST_F(TensorMemory, PeakIsPerPhase) {
  reset_cpu_tensor_peak();
  const int64_t base = cpu_tensor_bytes();
  { at::Tensor big = at::empty({1 << 20}, at::kFloat); }  // 4 MiB, freed again
  EXPECT_GE(cpu_tensor_peak_bytes() - base, 4 << 20);
  const int64_t ended = reset_cpu_tensor_peak();
  EXPECT_GE(ended - base, 4 << 20);
  EXPECT_EQ(cpu_tensor_peak_bytes(), cpu_tensor_bytes());  // the new phase starts at the live total
  at::Tensor small = at::empty({256}, at::kFloat);
  EXPECT_EQ(cpu_tensor_peak_bytes() - base, 1024);
}

TEST_F(TensorMemory, OperatorTemporariesAreCounted) {
  at::Tensor a = at::randn({64, 64}), b = at::randn({64, 64});
  reset_cpu_tensor_peak();
  const int64_t base = cpu_tensor_bytes();
  at::Tensor c = at::mm(a, b).exp_().sum();
  EXPECT_GE(cpu_tensor_peak_bytes() - base, 64 * 64 * 4);  // the (64, 64) product existed
  EXPECT_NEAR(c.item<double>(), at::mm(a, b).exp().sum().item<double>(), 1e-3);
}

TEST_F(TensorMemory, CapRaisesOutOfMemoryAndKeepsCountsRight) {
  const int64_t base = cpu_tensor_bytes();
  set_cpu_tensor_cap_bytes(base + (1 << 20));  // 1 MiB of headroom
  at::Tensor fits = at::empty({(1 << 18) - 64}, at::kFloat);  // just under 1 MiB
  const int64_t refused = cpu_tensor_cap_refusals();
  EXPECT_THROW(at::empty({1 << 18}, at::kFloat), c10::OutOfMemoryError);
  EXPECT_EQ(cpu_tensor_cap_refusals(), refused + 1);
  EXPECT_EQ(cpu_tensor_bytes() - base, ((1 << 18) - 64) * 4);  // the refused bytes were not counted
  try {
    at::Tensor t = at::ones({1 << 20}, at::kFloat);
    FAIL() << "the cap did not refuse 4 MiB";
  } catch (const c10::OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("mem.cpu_cap_bytes"), std::string::npos) << e.what();
  }
  fits = at::Tensor();
  at::Tensor now_fits = at::empty({1 << 18}, at::kFloat);  // freed bytes are available again
  set_cpu_tensor_cap_bytes(0);
  at::Tensor uncapped = at::empty({1 << 22}, at::kFloat);
  EXPECT_EQ(cpu_tensor_cap_bytes(), 0);
}

TEST_F(TensorMemory, RawAllocateAndCloneWork) {
  c10::Allocator* a = c10::GetCPUAllocator();
  const int64_t base = cpu_tensor_bytes();
  void* p = a->raw_allocate(512);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  EXPECT_EQ(cpu_tensor_bytes() - base, 512);
  a->raw_deallocate(p);
  EXPECT_EQ(cpu_tensor_bytes(), base);
  at::Tensor x = at::arange(100, at::kFloat);
  at::Tensor y = x.clone();
  EXPECT_TRUE(at::equal(x, y));
}

TEST(PeakRssWindow, ResetStartsAWindowAndKeepsTheLifetimePeak) {
#if defined(__SANITIZE_ADDRESS__)
  // AddressSanitizer keeps freed blocks resident in its quarantine, so a free never lowers RSS.
  GTEST_SKIP() << "under AddressSanitizer a free does not return memory (quarantine)";
#endif
  {
    at::Tensor big = at::ones({64 << 18}, at::kFloat);  // 64 MiB, touched, then freed (munmap)
    EXPECT_GT(big.sum().item<double>(), 0);
  }
  const int64_t lifetime = sys::peak_rss_bytes();
  sys::reset_peak_rss_window();
  const int64_t window = sys::window_peak_rss_bytes();
  EXPECT_LT(window, lifetime - (32 << 20)) << "the window should start near the current RSS";
  EXPECT_GE(sys::peak_rss_bytes(), lifetime);  // the closed window still counts for the lifetime
}

// A save beside training steps measures its window with an RssPeakWatch: the training log resets
// the kernel's window every step, and the watch must still see a peak from before such a reset.
TEST(PeakRssWindow, WatchKeepsItsPeakAcrossOtherResets) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "under AddressSanitizer a free does not return memory (quarantine)";
#endif
  sys::RssPeakWatch watch;
  const int64_t start = sys::rss_bytes();
  {
    at::Tensor big = at::ones({64 << 18}, at::kFloat);  // 64 MiB, touched, then freed (munmap)
    EXPECT_GT(big.sum().item<double>(), 0);
  }
  sys::reset_peak_rss_window();  // as the training log does
  EXPECT_LT(sys::window_peak_rss_bytes(), start + (32 << 20)) << "the reset window must not hold the 64 MiB";
  EXPECT_GE(watch.peak(), start + (60 << 20)) << "the watch lost the peak from before the reset";
}

}  // namespace
}  // namespace alpaca::util::test_tensor_memory
