// The counting CPU allocator; see include/alpaca/util/tensor_memory.h.
#include "alpaca/util/tensor_memory.h"

#include <c10/core/Allocator.h>      // defines: c10::Allocator, c10::DataPtr
#include <c10/core/CPUAllocator.h>   // defines: c10::SetCPUAllocator
#include <c10/core/impl/alloc_cpu.h> // defines: c10::alloc_cpu, c10::free_cpu
#include <c10/util/Exception.h>      // defines: c10::OutOfMemoryError

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>

#include "alpaca/util/fault.h"

namespace alpaca::util {
namespace {

std::atomic<int64_t> g_current{0};
std::atomic<int64_t> g_peak{0};
std::atomic<int64_t> g_watch_peak{0};
std::atomic<int64_t> g_cap{0};
std::atomic<int64_t> g_refusals{0};
std::atomic<bool> g_installed{false};

// Each block carries its size in a header of one alignment unit, so the data pointer is also the
// context (a "simple" DataPtr: raw_allocate/raw_deallocate and copy-on-write work unchanged) and
// freeing needs no lookup table.
constexpr size_t kHeader = 64;  // c10's CPU alignment: the data stays 64-byte aligned

void raise(std::atomic<int64_t>& peak_var, int64_t now) {
  int64_t peak = peak_var.load(std::memory_order_relaxed);
  while (now > peak && !peak_var.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void raise_peak(int64_t now) {
  raise(g_peak, now);
  raise(g_watch_peak, now);
}

void counted_free(void* data) {
  if (data == nullptr) return;
  char* base = static_cast<char*>(data) - kHeader;
  int64_t n = 0;
  std::memcpy(&n, base, sizeof(n));
  g_current.fetch_sub(n, std::memory_order_relaxed);
  c10::free_cpu(base);
}

class CountingCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    const auto n = static_cast<int64_t>(nbytes);
    const int64_t now = g_current.fetch_add(n, std::memory_order_relaxed) + n;
    const int64_t cap = g_cap.load(std::memory_order_relaxed);
    if (cap > 0 && now > cap) {
      g_current.fetch_sub(n, std::memory_order_relaxed);
      g_refusals.fetch_add(1, std::memory_order_relaxed);
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU tensor memory cap: allocating ", nbytes, " bytes would make ",
                       now, " bytes of live CPU tensors, above the cap of ", cap,
                       " bytes (ALPACA_FAULTS mem.cpu_cap_bytes)");
    }
    raise_peak(now);
    void* base = nullptr;
    try {
      base = c10::alloc_cpu(nbytes + kHeader);
    } catch (...) {
      g_current.fetch_sub(n, std::memory_order_relaxed);
      throw;
    }
    std::memcpy(base, &n, sizeof(n));
    void* data = static_cast<char*>(base) + kHeader;
    return {data, data, &counted_free, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &counted_free; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

}  // namespace

bool install_counting_cpu_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (const auto cap = fault_int("mem.cpu_cap_bytes")) g_cap.store(*cap, std::memory_order_relaxed);
    static CountingCpuAllocator allocator;  // lives for the process: storages outlive main()
    // Priority above the default's 0, so a later SetCPUAllocator at priority 0 cannot displace it.
    c10::SetCPUAllocator(&allocator, /*priority=*/1);
    g_installed.store(true);
  });
  return g_installed.load();
}

bool counting_cpu_allocator_installed() { return g_installed.load(); }
int64_t cpu_tensor_bytes() { return g_current.load(std::memory_order_relaxed); }
int64_t cpu_tensor_peak_bytes() { return g_peak.load(std::memory_order_relaxed); }

int64_t reset_cpu_tensor_peak() {
  const int64_t now = g_current.load(std::memory_order_relaxed);
  return g_peak.exchange(now, std::memory_order_relaxed);
}

int64_t begin_cpu_tensor_watch() {
  const int64_t now = g_current.load(std::memory_order_relaxed);
  g_watch_peak.store(now, std::memory_order_relaxed);
  return now;
}
int64_t cpu_tensor_watch_peak_bytes() { return g_watch_peak.load(std::memory_order_relaxed); }

void set_cpu_tensor_cap_bytes(int64_t cap) { g_cap.store(cap > 0 ? cap : 0, std::memory_order_relaxed); }
int64_t cpu_tensor_cap_bytes() { return g_cap.load(std::memory_order_relaxed); }
int64_t cpu_tensor_cap_refusals() { return g_refusals.load(std::memory_order_relaxed); }

}  // namespace alpaca::util
