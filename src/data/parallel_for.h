// Private to src/data: run fn(i) for i in [0, n) on a small thread pool, in chunks so threads
// stay balanced when items vary in cost. The first exception stops the pool and is rethrown.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace alpaca::data::detail {

// `num_threads` <= 0 uses every core.
template <typename Fn>
void parallel_for(int64_t n, int num_threads, Fn&& fn) {
  int threads = num_threads > 0 ? num_threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = static_cast<int>(std::min<int64_t>(threads, std::max<int64_t>(n, 1)));
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mu;
  auto worker = [&] {
    try {
      constexpr int64_t kChunk = 16;
      for (int64_t b = next.fetch_add(kChunk); b < n; b = next.fetch_add(kChunk))
        for (int64_t i = b; i < std::min(n, b + kChunk); ++i) fn(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mu);
      if (!error) error = std::current_exception();
      next = n;
    }
  };
  if (threads <= 1) {
    worker();
  } else {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) pool.emplace_back(worker);
    for (auto& t : pool) t.join();
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace alpaca::data::detail
