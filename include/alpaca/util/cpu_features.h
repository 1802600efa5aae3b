// The x86 instruction-set extensions our CPU kernels dispatch on, asked in one place, and a cap on
// them for testing and benchmarking: ALPACA_CPU_ISA=avx2 makes every dispatcher of ours act as on an
// AVX2-only CPU (no AVX-512, AVX512-BF16 or AMX: the fused kernels take their AVX2 loops, bf16
// GEMMs go through fp32, attention and decoding keep ATen's paths), =baseline as on an x86-64 CPU
// without AVX2, =native (or unset) what the CPU has. A cap never turns on what the CPU lacks.
// ATen, MKL and oneDNN have switches of their own for the same purpose (ATEN_CPU_CAPABILITY=avx2,
// MKL_ENABLE_INSTRUCTIONS=AVX2, ONEDNN_MAX_CPU_ISA=AVX2); bench/bench.py --cpu_isa avx2 sets all.
#pragma once

#include <string>

namespace alpaca::cpu {

enum class Feature { kAvx2, kAvx512f, kAvx512bw, kAvx512bf16, kAmxBf16 };

// Whether this CPU has `f` and ALPACA_CPU_ISA lets our kernels use it (read once per process; a
// value other than native/avx2/baseline is an error naming the variable).
bool has(Feature f);
// "native", "avx2" or "baseline": the cap in force.
std::string isa_cap();
// The CPU's model name (/proc/cpuinfo), "unknown" where it cannot be read; with the cap when one is
// set ("AMD EPYC (capped at avx2)"), for the lines benchmarks and the training log print.
std::string model_name();

}  // namespace alpaca::cpu
