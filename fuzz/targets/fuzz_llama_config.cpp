// config.json of a HF LLaMA checkpoint: parse, validate, and write back (an accepted config must
// survive its own round trip).
#include "alpaca/model/config.h"

#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return fuzz::round_trip(data, size, "config.json", &alpaca::model::LlamaConfig::from_json_string);
}
