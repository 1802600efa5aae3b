// Alpaca data: a JSON array of records or JSON Lines (the parser picks by the first character).
#include "alpaca/data/alpaca_record.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FUZZ_EXPECT_ALPACA_ERRORS({ (void)alpaca::data::parse_alpaca_records(fuzz::as_string(data, size), "alpaca_data.json"); });
  return 0;
}
