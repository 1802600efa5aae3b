// CUDA side of train/throughput.h: the caching allocator's counters and the device name.
#include <c10/cuda/CUDACachingAllocator.h>  // defines: c10::cuda::CUDACachingAllocator::getDeviceStats
#include <c10/cuda/CUDAFunctions.h>         // defines: c10::cuda::device_count
#include <cuda_runtime_api.h>               // defines: cudaGetDeviceProperties

#include "alpaca/train/throughput.h"

namespace alpaca::train {

bool cuda_memory_stats(int device_index, MemoryStats* stats) {
  if (device_index >= static_cast<int>(c10::cuda::device_count())) return false;
  using c10::CachingDeviceAllocator::StatType;
  const auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device_index));
  const auto agg = static_cast<size_t>(StatType::AGGREGATE);
  stats->gpu_allocated_bytes = s.allocated_bytes[agg].current;
  stats->gpu_peak_allocated_bytes = s.allocated_bytes[agg].peak;
  stats->gpu_reserved_bytes = s.reserved_bytes[agg].current;
  stats->gpu_peak_reserved_bytes = s.reserved_bytes[agg].peak;
  return true;
}

void cuda_reset_peak_memory_stats(int device_index) {
  if (device_index >= static_cast<int>(c10::cuda::device_count())) return;
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device_index));
}

void cuda_release_cached_memory() { c10::cuda::CUDACachingAllocator::emptyCache(); }

std::string cuda_device_name(int device_index) {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device_index) != cudaSuccess) return "";
  return prop.name;
}

}  // namespace alpaca::train
