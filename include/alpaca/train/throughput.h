// Throughput, model FLOPs utilisation and memory, the figures a training log reports.
//   flops per token (forward + backward) = 6 * N + 12 * L * D * T   (PaLM appendix B: the dense
//   matmuls plus the attention score/value matmuls over a context of T; causal masking not
//   discounted, as PaLM and nanoGPT count it). MFU = achieved flops / peak flops of the device.
#pragma once

#include <ATen/ATen.h>  // defines: at::Device

#include <cstdint>
#include <optional>
#include <string>

namespace alpaca::train {

double flops_per_token(int64_t num_params, int64_t num_layers, int64_t hidden_size, int64_t seq_len);

// Dense bf16 tensor-core peak (no sparsity) of the named GPU, from its product name as CUDA
// reports it ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", ...). ALPACA_PEAK_FLOPS in the
// environment overrides it. nullopt for an unknown device (MFU is then not reported).
std::optional<double> gpu_peak_bf16_flops(const std::string& device_name);

// MFU of one device: (tokens/s on that device * flops per token) / peak.
double mfu(double tokens_per_second_per_device, double flops_per_token, double peak_flops);

struct MemoryStats {
  int64_t host_rss_bytes = 0;
  int64_t host_peak_rss_bytes = 0;
  // CUDA caching allocator, for `device` when it is a GPU; 0 on CPU.
  int64_t gpu_allocated_bytes = 0;
  int64_t gpu_peak_allocated_bytes = 0;
  int64_t gpu_reserved_bytes = 0;
  int64_t gpu_peak_reserved_bytes = 0;
  // Live CPU tensor bytes and their peak since the last reset (util/tensor_memory.h); 0 when the
  // counting allocator is not installed.
  int64_t cpu_tensor_bytes = 0;
  int64_t cpu_tensor_peak_bytes = 0;
};
MemoryStats memory_stats(const at::Device& device);
// Starts a new measurement phase: the GPU caching allocator's peaks (for a CUDA device) and the
// CPU tensor peak restart from the current values.
void reset_peak_memory_stats(const at::Device& device);
// After a caught out-of-memory error: hands the caching allocator's free blocks back to the
// driver so the next attempt starts unfragmented (no-op on CPU).
void release_cached_memory(const at::Device& device);
// The CUDA device's product name ("" on CPU or without CUDA).
std::string device_name(const at::Device& device);

}  // namespace alpaca::train
