#include "alpaca/train/throughput.h"

#include <cstdlib>
#include <utility>
#include <vector>

#include "alpaca/util/error.h"
#include "alpaca/util/sys.h"
#include "alpaca/util/tensor_memory.h"

namespace alpaca::train {

#ifdef ALPACA_WITH_CUDA
// Implemented in throughput_cuda.cpp (compiled only when LibTorch has CUDA).
bool cuda_memory_stats(int device_index, MemoryStats* stats);
void cuda_reset_peak_memory_stats(int device_index);
void cuda_release_cached_memory();
std::string cuda_device_name(int device_index);
#endif

double flops_per_token(int64_t num_params, int64_t num_layers, int64_t hidden_size, int64_t seq_len) {
  return 6.0 * static_cast<double>(num_params) +
         12.0 * static_cast<double>(num_layers) * static_cast<double>(hidden_size) * static_cast<double>(seq_len);
}

std::optional<double> gpu_peak_bf16_flops(const std::string& name) {
  if (const char* env = std::getenv("ALPACA_PEAK_FLOPS"); env && *env) {
    char* end = nullptr;
    const double v = std::strtod(env, &end);
    ALPACA_CHECK(end && *end == '\0' && v > 0, "ALPACA_PEAK_FLOPS='" << env << "' is not a positive number of flop/s (e.g. 989e12)");
    return v;
  }
  // Vendor datasheets, dense bf16. Order matters: more specific names first.
  static const std::vector<std::pair<std::string, double>> kTable = {
      {"GH200", 989e12}, {"H200", 989e12},  {"H100 PCIe", 756e12}, {"H100", 989e12}, {"H800", 989e12},
      {"B200", 2250e12}, {"B100", 1750e12}, {"A100", 312e12},      {"A800", 312e12}, {"A10G", 70e12},
      {"A10", 125e12},   {"L40S", 362e12},  {"L40", 181e12},       {"L4", 121e12},   {"A6000", 155e12},
      {"4090", 165e12},  {"3090", 71e12},   {"V100", 125e12},  // V100 has no bf16: fp16 tensor peak
  };
  for (const auto& [key, flops] : kTable)
    if (name.find(key) != std::string::npos) return flops;
  return std::nullopt;
}

double mfu(double tokens_per_second_per_device, double fpt, double peak_flops) {
  return peak_flops > 0 ? tokens_per_second_per_device * fpt / peak_flops : 0.0;
}

MemoryStats memory_stats(const at::Device& device) {
  MemoryStats s;
  s.host_rss_bytes = sys::rss_bytes();
  s.host_peak_rss_bytes = sys::peak_rss_bytes();
#ifdef ALPACA_WITH_CUDA
  if (device.is_cuda()) cuda_memory_stats(device.has_index() ? device.index() : 0, &s);
#endif
  s.cpu_tensor_bytes = util::cpu_tensor_bytes();
  s.cpu_tensor_peak_bytes = util::cpu_tensor_peak_bytes();
  return s;
}

void reset_peak_memory_stats(const at::Device& device) {
#ifdef ALPACA_WITH_CUDA
  if (device.is_cuda()) cuda_reset_peak_memory_stats(device.has_index() ? device.index() : 0);
#endif
  util::reset_cpu_tensor_peak();
}

void release_cached_memory(const at::Device& device) {
#ifdef ALPACA_WITH_CUDA
  if (device.is_cuda()) cuda_release_cached_memory();
#endif
}

std::string device_name(const at::Device& device) {
#ifdef ALPACA_WITH_CUDA
  if (device.is_cuda()) return cuda_device_name(device.has_index() ? device.index() : 0);
#endif
  return "";
}

}  // namespace alpaca::train
