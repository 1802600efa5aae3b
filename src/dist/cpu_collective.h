// Internal to src/dist: small pieces the CPU communicators (mpi_communicator.cpp,
// gloo_communicator.cpp) share: 16-bit floats reduce in fp32, inputs must be CPU tensors,
// ReduceOp::kAvg is a sum divided by the world size, and a dropped handle still completes.
#pragma once

#include <exception>
#include <iostream>
#include <string>

#include <ATen/ATen.h>

#include "alpaca/dist/communicator.h"
#include "alpaca/util/error.h"

namespace alpaca::dist::detail {

inline bool is_16bit_float(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf;
}

inline void check_cpu_tensor(const at::Tensor& t, const char* backend, const char* op, const char* name) {
  ALPACA_CHECK(t.defined() && t.device().is_cpu(), op << ": " << name << " must be a CPU tensor for the " << backend
                                                      << " backend, got "
                                                      << (t.defined() ? t.device().str() : std::string("undefined")));
}

// Divides a summed tensor by the world size in place (ReduceOp::kAvg); integers truncate.
inline void finish_avg(at::Tensor& t, int world) {
  if (at::isFloatingType(t.scalar_type())) {
    t.div_(world);
  } else {
    t.div_(world, "trunc");
  }
}

// For a Work's destructor when wait() was never called: completes the collective before its
// buffers go away; a failure can then only be reported (a destructor must not throw).
inline void complete_unwaited(Work& work, const std::string& what) {
  try {
    work.wait();
  } catch (const std::exception& e) {
    std::cerr << "alpaca-train: error while completing an unwaited " << what << ": " << e.what() << "\n";
  }
}

}  // namespace alpaca::dist::detail
