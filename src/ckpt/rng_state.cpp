// The default CPU generator's and the CUDA generators' states as hex (include/alpaca/ckpt/resume_state.h).
#include <ATen/ATen.h>                             // defines: at::Tensor, at::globalContext
#include <ATen/detail/CUDAHooksInterface.h>       // defines: at::detail::getCUDAHooks

#include "alpaca/ckpt/resume_state.h"
#include "alpaca/util/error.h"

namespace alpaca::ckpt {
namespace {

std::string to_hex(const at::Tensor& bytes_u8) {
  const at::Tensor t = bytes_u8.contiguous().cpu();
  const auto* p = t.data_ptr<uint8_t>();
  static const char* kDigits = "0123456789abcdef";
  std::string out(static_cast<size_t>(t.numel()) * 2, '0');
  for (int64_t i = 0; i < t.numel(); ++i) {
    out[2 * i] = kDigits[p[i] >> 4];
    out[2 * i + 1] = kDigits[p[i] & 15];
  }
  return out;
}

at::Tensor from_hex(const std::string& hex, const std::string& what) {
  ALPACA_CHECK(hex.size() % 2 == 0, what << " is not a hex string of even length");
  at::Tensor t = at::empty({static_cast<int64_t>(hex.size() / 2)}, at::kByte);
  auto* p = t.data_ptr<uint8_t>();
  auto nibble = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    ALPACA_FAIL(what << " holds the non-hex character '" << c << "'");
  };
  for (size_t i = 0; i < hex.size() / 2; ++i) p[i] = static_cast<uint8_t>(nibble(hex[2 * i]) * 16 + nibble(hex[2 * i + 1]));
  return t;
}

int cuda_device_count() {
  return at::detail::getCUDAHooks().hasCUDA() ? static_cast<int>(at::detail::getCUDAHooks().deviceCount()) : 0;
}

}  // namespace

std::string capture_cpu_rng_state() { return to_hex(at::detail::getDefaultCPUGenerator().get_state()); }

void restore_cpu_rng_state(const std::string& hex) {
  if (hex.empty()) return;
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  gen.set_state(from_hex(hex, "cpu_rng_state"));
}

std::vector<std::string> capture_cuda_rng_states() {
  std::vector<std::string> out;
  for (int d = 0; d < cuda_device_count(); ++d) {
    at::Generator gen = at::globalContext().defaultGenerator(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(d)));
    out.push_back(to_hex(gen.get_state()));
  }
  return out;
}

namespace {
at::Generator cuda_generator(int device) {
  return at::globalContext().defaultGenerator(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device)));
}
}  // namespace

std::string capture_rank_rng_state(int cuda_device) {
  std::string s = capture_cpu_rng_state();
  if (cuda_device >= 0) s += ":" + to_hex(cuda_generator(cuda_device).get_state());
  return s;
}

void restore_rank_rng_state(const std::string& state, int cuda_device) {
  const size_t colon = state.find(':');
  restore_cpu_rng_state(state.substr(0, colon));
  if (colon == std::string::npos || cuda_device < 0) return;
  at::Generator gen = cuda_generator(cuda_device);
  gen.set_state(from_hex(state.substr(colon + 1), "rank_rng_states"));
}

void restore_cuda_rng_states(const std::vector<std::string>& hex_states) {
  const int n = std::min<int>(cuda_device_count(), static_cast<int>(hex_states.size()));
  for (int d = 0; d < n; ++d) {
    at::Generator gen = at::globalContext().defaultGenerator(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(d)));
    gen.set_state(from_hex(hex_states[d], "cuda_rng_states"));
  }
}

}  // namespace alpaca::ckpt
