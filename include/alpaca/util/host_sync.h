// Deliberate device->host synchronisations, counted (a debug counter the GPU checks assert on:
// at most one per optimizer step outside logging), and the host->device copy that never makes
// the host wait.
//
// count_host_sync() is called at every point where the host waits for a device result: a
// `.item()` / `.cpu()` of a value computed on the compute device, an event synchronize. The
// points are counted whatever the device is, so a CPU run (where such a wait costs nothing)
// counts exactly what a CUDA run of the same code path would wait for, and CPU tests check the
// structure. Reading host data that never left the host (a collated batch, CPU labels) is not a
// synchronisation and is not counted. Counting is one relaxed atomic add.
#pragma once

#include <ATen/ATen.h>  // defines: at::Tensor, at::Device

#include <cstdint>

namespace alpaca::util {

void count_host_sync();
// Synchronisations counted since the process started (thread-safe; tests take differences).
int64_t host_sync_count();

// `t` on `device` without a host wait: a CPU tensor bound for a CUDA device is staged in pinned
// memory (LibTorch's caching host allocator keeps the staging block until the copy is done) and
// copied asynchronously on the current stream; any other move is t.to(device).
at::Tensor to_device_async(const at::Tensor& t, const at::Device& device);

}  // namespace alpaca::util
