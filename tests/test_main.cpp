// GoogleTest entry point shared by every test executable. Keeps LibTorch to the thread count
// the launcher gives each rank (OMP_NUM_THREADS), so multi-rank tests on 2 cores do not crawl.
#include <gtest/gtest.h>

#include <ATen/Parallel.h>  // defines: at::set_num_threads

#include <cstdlib>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (const char* t = std::getenv("OMP_NUM_THREADS")) {
    int n = std::atoi(t);
    if (n > 0) at::set_num_threads(n);
  }
  return RUN_ALL_TESTS();
}
