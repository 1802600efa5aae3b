// safetensors header and file: the fuzz input is the whole file. Every tensor the header accepts
// is then read byte by byte from the input buffer, so an accepted byte range outside the file
// is an ASan heap-buffer-overflow here (the reader maps the file, where it would read past it).
#include "alpaca/io/safetensors_header.h"

#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FUZZ_EXPECT_ALPACA_ERRORS({
    const alpaca::io::SafetensorsHeader h = alpaca::io::parse_safetensors_header(data, size, "fuzz.safetensors");
    volatile uint8_t sink = 0;
    for (const auto& t : h.tensors) {
      const uint8_t* p = data + h.data_offset + t.data_begin;
      for (int64_t i = 0; i < t.nbytes(); ++i) sink = sink ^ p[i];
      (void)t.numel();
      (void)alpaca::io::safetensors_dtype_name(t.dtype);
    }
  });
  return 0;
}
