// checkpoint-<step>/alpaca_resume_state.json: parse, write back, parse again.
#include "alpaca/ckpt/resume_state.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return fuzz::round_trip(data, size, "alpaca_resume_state.json", &alpaca::ckpt::ResumeState::from_json);
}
