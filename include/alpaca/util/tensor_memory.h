// Measured tensor memory on the host. `install_counting_cpu_allocator()` replaces LibTorch's CPU
// allocator (c10::SetCPUAllocator) with one that allocates exactly as the default does
// (c10::alloc_cpu, 64-byte aligned) and counts the bytes of every live CPU tensor storage: the
// current total, the peak since the last reset (reset it at a phase boundary: "peak of this
// step", "peak since the last log line"), and an optional cap. An allocation that would take the
// live total above the cap fails with c10::OutOfMemoryError, the same exception type the CUDA
// caching allocator throws, so CPU tests can provoke an out-of-memory exactly where a GPU would.
// Storages allocated before installation are not counted (they free through their own deleter).
//
// The cap comes from the fault point `mem.cpu_cap_bytes=N` (util/fault.h) at installation, or
// set_cpu_tensor_cap_bytes(). Counting costs one relaxed atomic add per allocation and free.
#pragma once

#include <cstdint>

namespace alpaca::util {

// Idempotent and thread-safe; returns true when the allocator is (now) installed.
bool install_counting_cpu_allocator();
bool counting_cpu_allocator_installed();

// Bytes of live CPU tensor storage allocated since installation (0 when not installed).
int64_t cpu_tensor_bytes();
// The largest cpu_tensor_bytes() since installation or the last reset_cpu_tensor_peak().
int64_t cpu_tensor_peak_bytes();
// Starts a new phase: the peak becomes the current total. Returns the peak of the phase that ended.
int64_t reset_cpu_tensor_peak();
// A watch for one operation that leaves the phase peak above alone (e.g. "what did saving the
// adapter add"): begin returns the current total and starts a second peak from it; the watch
// peak is the largest total since. One watch at a time (a new begin restarts it).
int64_t begin_cpu_tensor_watch();
int64_t cpu_tensor_watch_peak_bytes();
// Allocations that would exceed this live total fail with c10::OutOfMemoryError; 0 = no cap.
void set_cpu_tensor_cap_bytes(int64_t cap);
int64_t cpu_tensor_cap_bytes();
// How many allocations the cap has refused since installation.
int64_t cpu_tensor_cap_refusals();

}  // namespace alpaca::util
