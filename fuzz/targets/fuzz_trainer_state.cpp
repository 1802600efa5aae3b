// checkpoint-<step>/trainer_state.json (HF's TrainerState): parse, write back, parse again.
#include "alpaca/ckpt/trainer_state.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FUZZ_EXPECT_ALPACA_ERRORS({
    const auto s = alpaca::ckpt::TrainerState::from_json(fuzz::as_string(data, size), "trainer_state.json");
    const auto again = alpaca::ckpt::TrainerState::from_json(s.to_json(), "trainer_state.json (written back)");
    if (again.to_json() != s.to_json()) __builtin_trap();
  });
  return 0;
}
