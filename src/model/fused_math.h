// Scalar helpers of the fused bf16 CPU kernels (fused_ops.cpp, attention_cpu.cpp): bf16 <-> fp32 on
// raw bits and a vectorisable exp, all inlined into each instruction-set copy of the row loops (so
// every copy rounds identically). Internal to src/model/; files that include it are compiled with
// -O3 -ffp-contract=off -fno-trapping-math (CMakeLists.txt).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
#define ALPACA_FUSED_X86 1
#else
#define ALPACA_FUSED_X86 0
#endif
#define ALPACA_INLINE inline __attribute__((always_inline))

// Instantiates KERNELS(namespace, attribute) once per instruction set the row loops are compiled for
// (one source, auto-vectorised per target): isa_base (baseline x86-64, or any other CPU), isa_avx2 and
// isa_avx512 (F+BW). Off x86 the latter two are baseline copies, so the pick below compiles anywhere.
#if ALPACA_FUSED_X86
#define ALPACA_FOR_EACH_CPU_ISA(KERNELS)                 \
  KERNELS(isa_base, )                                    \
  KERNELS(isa_avx2, __attribute__((target("avx2"))))     \
  KERNELS(isa_avx512, __attribute__((target("avx512f,avx512bw"))))
#else
#define ALPACA_FOR_EACH_CPU_ISA(KERNELS) KERNELS(isa_base, ) KERNELS(isa_avx2, ) KERNELS(isa_avx512, )
#endif
// The `kernels` table ALPACA_FOR_EACH_CPU_ISA made for instruction set `isa` (FusedCpuIsa's value:
// 0 baseline, 1 AVX2, 2 AVX-512), in the namespace this is used from.
#define ALPACA_ISA_KERNELS(isa) \
  ((isa) == 2 ? isa_avx512::kernels : (isa) == 1 ? isa_avx2::kernels : isa_base::kernels)

namespace alpaca::model::fused {

using u16 = uint16_t;
// The row loops' operands never overlap (the vectoriser needs to know).
using In = const u16* __restrict;
using Out = u16* __restrict;
using Acc = float* __restrict;

// bf16 <-> fp32 as c10::BFloat16 converts (round to nearest even, NaN to the quiet NaN), written on
// bits so that the loops vectorise.
ALPACA_INLINE float f32(u16 v) {
  const uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
ALPACA_INLINE u16 bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return f != f ? static_cast<u16>(0x7FC0) : static_cast<u16>(r);
}
// The product / sum of two values rounded to bf16 and back: one bf16 ATen op on these values.
ALPACA_INLINE float rnd(float f) { return f32(bf16(f)); }

// exp(x) within ~1 fp32 ulp (Cody-Waite reduction, degree-6 polynomial), x clamped to [-87, 88]
// (so exp(-inf) is ~1.6e-38, not 0: callers that mask select 0 themselves).
ALPACA_INLINE float exp_f(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  const float k = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
  const float r = (x - k * 0.693145751953125f) - k * 1.42860682030941723212e-6f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(k) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

constexpr int kLanes = 16;  // independent partial sums, so the reductions vectorise

// sum_c a[c] * b[c] in fp32 over kLanes partial sums (a == b for a sum of squares: only read).
ALPACA_INLINE float dot_lanes(const u16* a, const u16* b, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += f32(a[i + l]) * f32(b[i + l]);
  float sum = 0;
  for (int l = 0; l < kLanes; ++l) sum += acc[l];
  for (; i < n; ++i) sum += f32(a[i]) * f32(b[i]);
  return sum;
}

}  // namespace alpaca::model::fused
