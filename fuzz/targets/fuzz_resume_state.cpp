// checkpoint-<step>/alpaca_resume_state.json: parse, write back, parse again.
#include "alpaca/ckpt/resume_state.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FUZZ_EXPECT_ALPACA_ERRORS({
    const auto s = alpaca::ckpt::ResumeState::from_json(fuzz::as_string(data, size), "alpaca_resume_state.json");
    const auto again = alpaca::ckpt::ResumeState::from_json(s.to_json(), "alpaca_resume_state.json (written back)");
    if (again.to_json() != s.to_json()) __builtin_trap();
  });
  return 0;
}
