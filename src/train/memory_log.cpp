// Memory fields of the training log; see include/alpaca/train/memory_log.h.
#include "alpaca/train/memory_log.h"

#include "alpaca/dist/communicator.h"
#include "alpaca/train/throughput.h"
#include "alpaca/util/sys.h"

namespace alpaca::train {
namespace {
int64_t g_faults_at_window_start = 0;  // sys::minor_page_faults() at the last reset
}

void reset_memory_window(const at::Device& device) {
  reset_peak_memory_stats(device);
  sys::reset_peak_rss_window();
  g_faults_at_window_start = sys::minor_page_faults();
}

void append_memory_fields(LogEntry& entry, dist::Communicator& comm, const at::Device& device) {
  MemoryStats m = memory_stats(device);
  m.host_peak_rss_bytes = sys::window_peak_rss_bytes();  // this window's, not the lifetime peak
  at::Tensor v = at::tensor({m.cpu_tensor_peak_bytes, m.host_rss_bytes, m.host_peak_rss_bytes,
                             m.gpu_peak_allocated_bytes, m.gpu_peak_reserved_bytes, m.gpu_allocated_bytes,
                             m.gpu_reserved_bytes, sys::minor_page_faults() - g_faults_at_window_start},
                            at::kLong)
                     .to(comm.device());
  if (comm.world_size() > 1) comm.all_reduce(v, dist::ReduceOp::kMax)->wait();
  v = v.cpu();
  const auto* p = v.data_ptr<int64_t>();
  entry.emplace_back("x_cpu_tensor_peak_bytes", p[0]);
  entry.emplace_back("x_host_rss_bytes", p[1]);
  entry.emplace_back("x_host_peak_rss_bytes", p[2]);
  entry.emplace_back("x_host_minor_faults", p[7]);  // this window's, the most of any rank
  if (device.is_cuda()) {
    entry.emplace_back("x_gpu_peak_allocated_bytes", p[3]);
    entry.emplace_back("x_gpu_peak_reserved_bytes", p[4]);
    entry.emplace_back("x_gpu_allocated_bytes", p[5]);
    entry.emplace_back("x_gpu_reserved_bytes", p[6]);
  }
  reset_memory_window(device);
}

}  // namespace alpaca::train
