// config.json of a HF LLaMA checkpoint: parse, validate, and write back (an accepted config must
// survive its own round trip).
#include "alpaca/model/config.h"

#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FUZZ_EXPECT_ALPACA_ERRORS({
    const auto c = alpaca::model::LlamaConfig::from_json_string(fuzz::as_string(data, size), "config.json");
    const auto again = alpaca::model::LlamaConfig::from_json_string(c.to_json(), "config.json (written back)");
    if (again.to_json() != c.to_json()) __builtin_trap();
  });
  return 0;
}
