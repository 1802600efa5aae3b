// See include/alpaca/util/cpu_features.h.
#include "alpaca/util/cpu_features.h"

#include <cstdlib>
#include <cstring>
#include <fstream>

#include "alpaca/util/error.h"

namespace alpaca::cpu {
namespace {

enum class Cap { kBaseline = 0, kAvx2 = 1, kNative = 2 };

Cap read_cap() {
  const char* env = std::getenv("ALPACA_CPU_ISA");
  if (env == nullptr || *env == '\0' || std::strcmp(env, "native") == 0) return Cap::kNative;
  if (std::strcmp(env, "avx2") == 0) return Cap::kAvx2;
  if (std::strcmp(env, "baseline") == 0) return Cap::kBaseline;
  ALPACA_FAIL("ALPACA_CPU_ISA=" << env << " is not understood; use native (the default), avx2 or baseline");
  return Cap::kNative;
}

Cap cap() {
  static const Cap c = read_cap();
  return c;
}

bool cpu_has(Feature f) {
#if defined(__x86_64__) || defined(__i386__)
  switch (f) {
    case Feature::kAvx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Feature::kAvx512f: return __builtin_cpu_supports("avx512f");
    case Feature::kAvx512bw: return __builtin_cpu_supports("avx512bw");
    case Feature::kAvx512bf16: return __builtin_cpu_supports("avx512bf16");
    case Feature::kAmxBf16: return __builtin_cpu_supports("amx-bf16");
  }
#endif
  (void)f;
  return false;
}

}  // namespace

bool has(Feature f) {
  switch (cap()) {
    case Cap::kBaseline: return false;
    case Cap::kAvx2: return f == Feature::kAvx2 && cpu_has(f);
    case Cap::kNative: return cpu_has(f);
  }
  return false;
}

std::string isa_cap() {
  switch (cap()) {
    case Cap::kBaseline: return "baseline";
    case Cap::kAvx2: return "avx2";
    case Cap::kNative: return "native";
  }
  return "native";
}

std::string model_name() {
  std::string name = "unknown";
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon != std::string::npos) name = line.substr(line.find_first_not_of(" \t", colon + 1));
    break;
  }
  return cap() == Cap::kNative ? name : name + " (capped at " + isa_cap() + ")";
}

}  // namespace alpaca::cpu
