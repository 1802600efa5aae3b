// The memory fields of every training log line (and metrics.jsonl): per rank, the peak since the
// previous log line, then the maximum over ranks (one all-reduce), so one line says what the
// busiest rank needed:
//   x_cpu_tensor_peak_bytes      peak live CPU tensor bytes (the counting allocator; on a CPU run
//                                this is the training's tensor memory)
//   x_host_rss_bytes             resident set size now
//   x_host_peak_rss_bytes        peak resident set size since the previous log (VmHWM, reset
//                                after each log through /proc/self/clear_refs)
//   x_host_minor_faults          minor page faults since the previous log (all threads;
//                                sys::minor_page_faults): a step that reuses its buffers takes ~0
//   x_gpu_peak_allocated_bytes   CUDA caching allocator: peak allocated / reserved since the
//   x_gpu_peak_reserved_bytes    previous log (GPU runs only), and the current values
//   x_gpu_allocated_bytes, x_gpu_reserved_bytes
// Collective over `comm`: every rank must call it at the same log.
#pragma once

#include <ATen/ATen.h>  // defines: at::Device

#include "alpaca/train/metrics.h"

namespace alpaca::dist {
class Communicator;
}

namespace alpaca::train {

// Appends the fields above to `entry` and starts the next window (peaks reset on every rank).
void append_memory_fields(LogEntry& entry, dist::Communicator& comm, const at::Device& device);
// Starts a window without logging (call before the first step).
void reset_memory_window(const at::Device& device);

}  // namespace alpaca::train
