// checkpoint-<step>/trainer_state.json (HF's TrainerState): parse, write back, parse again.
#include "alpaca/ckpt/trainer_state.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return fuzz::round_trip(data, size, "trainer_state.json", &alpaca::ckpt::TrainerState::from_json);
}
