// GoogleTest entry point shared by every test executable. Keeps LibTorch to the thread count
// the launcher gives each rank (OMP_NUM_THREADS), so multi-rank tests on 2 cores do not crawl.
#include <gtest/gtest.h>

#include <ATen/Parallel.h>  // defines: at::set_num_threads

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (const char* t = std::getenv("OMP_NUM_THREADS")) {
    int n = std::atoi(t);
    if (n > 0) at::set_num_threads(n);
  }
  const int rc = RUN_ALL_TESTS();
  // A module's test files share one executable and ctest selects each file's suites with
  // --gtest_filter (tests/CMakeLists.txt): a filter that matches nothing must fail, not pass.
  if (::testing::UnitTest::GetInstance()->test_to_run_count() == 0) {
    std::fprintf(stderr, "no test matched the filter (%s): a suite was renamed or moved; see alpaca_add_test\n",
                 ::testing::GTEST_FLAG(filter).c_str());
    return 1;
  }
  return rc;
}
