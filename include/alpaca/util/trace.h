// Named regions for profilers: an at::RecordFunction of scope USER_SCOPE, the same mechanism as
// Python's torch.profiler.record_function, so LibTorch's profiler and any RecordFunction observer
// (bench/train_profile.cpp) see where a step's time goes (phases, FSDP collectives, the model's
// elementwise blocks). With no observer installed a region costs one thread-local check.
#pragma once

#include <ATen/core/Tensor.h>         // defines: at::Tensor
#include <ATen/record_function.h>  // defines: at::RecordFunction

#include <cstdint>
#include <initializer_list>

namespace alpaca::util {

class TraceScope {
 public:
  // `name` must outlive the scope (a string literal).
  explicit TraceScope(const char* name) : rf_(at::RecordScope::USER_SCOPE) {
    if (rf_.isActive()) rf_.before(name, c10::ArrayRef<const c10::IValue>{});
  }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  at::RecordFunction rf_;
};

// A kernel of ours that ATen does not see (the fused row loops, the GEMM attention, the loss rows, the
// reduce-scatter folds), for profilers that count the bytes of each op's operands: an at::RecordFunction
// of scope FUNCTION named `name` (an op to an observer) whose one input, when the observer asks for
// inputs, is `bytes`: what the code reads of its operands, as an ATen op's tensor inputs count
// (bench/train_profile.cpp's "operand bytes").
class TraceBytes {
 public:
  TraceBytes(const char* name, int64_t bytes) : bytes_(bytes), rf_(at::RecordScope::FUNCTION) {
    if (!rf_.isActive()) return;
    if (rf_.needsInputs()) {
      rf_.before(name, c10::ArrayRef<const c10::IValue>(&bytes_, 1));
    } else {
      rf_.before(name, c10::ArrayRef<const c10::IValue>{});
    }
  }
  TraceBytes(const TraceBytes&) = delete;
  TraceBytes& operator=(const TraceBytes&) = delete;

 private:
  c10::IValue bytes_;  // outlives rf_ (members end in reverse order): observers may read it at the end
  at::RecordFunction rf_;
};

// The bytes of `tensors` (undefined ones count 0).
inline int64_t nbytes_of(std::initializer_list<at::Tensor> tensors) {
  int64_t n = 0;
  for (const at::Tensor& t : tensors) n += t.defined() ? static_cast<int64_t>(t.nbytes()) : 0;
  return n;
}

}  // namespace alpaca::util

#define ALPACA_TRACE_CAT2(a, b) a##b
#define ALPACA_TRACE_CAT(a, b) ALPACA_TRACE_CAT2(a, b)
// ALPACA_TRACE("phase:forward"); marks the rest of the enclosing block.
#define ALPACA_TRACE(name) ::alpaca::util::TraceScope ALPACA_TRACE_CAT(alpaca_trace_, __LINE__)(name)
// ALPACA_TRACE_BYTES("alpaca::rms_norm", bytes); the rest of the block is that kernel, reading `bytes`.
#define ALPACA_TRACE_BYTES(name, bytes) \
  ::alpaca::util::TraceBytes ALPACA_TRACE_CAT(alpaca_trace_bytes_, __LINE__)(name, bytes)
