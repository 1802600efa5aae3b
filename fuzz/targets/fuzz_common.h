// Shared by the fuzz targets: what counts as a correct outcome. A parser may accept an input or
// reject it with alpaca::Error (the error the user sees, naming the file); anything else that
// escapes (a std::out_of_range, a json::type_error without the file's name, a crash, UB, a leak)
// is a finding: the exception propagates out of LLVMFuzzerTestOneInput and libFuzzer aborts.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "alpaca/util/error.h"

namespace fuzz {

inline std::string as_string(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// A private scratch directory per process (libFuzzer -fork/-jobs run several at once).
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    const char* base = std::getenv("TMPDIR");
    std::filesystem::path d = std::filesystem::path(base && *base ? base : "/tmp") /
                              ("alpaca-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

inline void write_file(const std::filesystem::path& p, std::string_view bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Splits at NUL bytes (never valid inside JSON text): one input carries several files.
inline std::vector<std::string> split_nul(const uint8_t* data, size_t size, size_t parts) {
  std::vector<std::string> out(parts);
  size_t k = 0;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0 && k + 1 < parts) {
      ++k;
      continue;
    }
    out[k].push_back(static_cast<char>(data[i]));
  }
  return out;
}

}  // namespace fuzz

// Runs `body`; alpaca::Error (and cli::UsageError, which is one) is a rejection, anything else
// propagates and is reported by libFuzzer as a crash.
// ALPACA_FUZZ_VERBOSE=1 prints each rejection (to see what a seed runs into).
#define FUZZ_EXPECT_ALPACA_ERRORS(body)                                       \
  try {                                                                       \
    body;                                                                     \
  } catch (const ::alpaca::Error& e) {                                        \
    static const bool verbose = std::getenv("ALPACA_FUZZ_VERBOSE") != nullptr; \
    if (verbose) std::fprintf(stderr, "rejected: %s\n", e.what());            \
  }

namespace fuzz {

// The target of a JSON file we read and write back (config.json, trainer_state.json, our resume
// state): `parse(text, name)` (a static from_json) on the input, then on what to_json() writes of
// the result; an accepted input must survive its own round trip.
template <class Parse>
int round_trip(const uint8_t* data, size_t size, const std::string& name, Parse parse) {
  FUZZ_EXPECT_ALPACA_ERRORS({
    const auto s = parse(as_string(data, size), name);
    const auto again = parse(s.to_json(), name + " (written back)");
    if (again.to_json() != s.to_json()) __builtin_trap();
  });
  return 0;
}

}  // namespace fuzz
