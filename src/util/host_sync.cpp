// The host-synchronisation counter and the asynchronous host->device copy; see
// include/alpaca/util/host_sync.h.
#include "alpaca/util/host_sync.h"

#include <atomic>

namespace alpaca::util {
namespace {
std::atomic<int64_t> g_host_syncs{0};
}  // namespace

void count_host_sync() { g_host_syncs.fetch_add(1, std::memory_order_relaxed); }

int64_t host_sync_count() { return g_host_syncs.load(std::memory_order_relaxed); }

at::Tensor to_device_async(const at::Tensor& t, const at::Device& device) {
  if (!t.defined() || t.device() == device) return t;
  if (t.is_cpu() && device.is_cuda()) {
    // A blocking copy from pageable memory synchronises the stream; pinned + non_blocking does not.
    const at::Tensor pinned = t.is_pinned() ? t : t.contiguous().pin_memory();
    return pinned.to(device, /*non_blocking=*/true);
  }
  return t.to(device);
}

}  // namespace alpaca::util
