// Named regions for profilers: an at::RecordFunction of scope USER_SCOPE, the same mechanism as
// Python's torch.profiler.record_function, so LibTorch's profiler and any RecordFunction observer
// (bench/train_profile.cpp) see where a step's time goes (phases, FSDP collectives, the model's
// elementwise blocks). With no observer installed a region costs one thread-local check.
#pragma once

#include <ATen/record_function.h>  // defines: at::RecordFunction

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

}  // namespace alpaca::util

#define ALPACA_TRACE_CAT2(a, b) a##b
#define ALPACA_TRACE_CAT(a, b) ALPACA_TRACE_CAT2(a, b)
// ALPACA_TRACE("phase:forward"); marks the rest of the enclosing block.
#define ALPACA_TRACE(name) ::alpaca::util::TraceScope ALPACA_TRACE_CAT(alpaca_trace_, __LINE__)(name)
