// Shared by the checkpoint tests that damage a sealed checkpoint (test_checkpoint_faults,
// test_sharded_resume): a fresh copy to damage, and a flipped byte the digest must catch.
#pragma once

#include <filesystem>
#include <fstream>

namespace alpaca::testing {

// A copy of the checkpoint directory `good` as <dir>/bad/<its name>, any earlier copy removed.
inline std::filesystem::path fresh_copy(const std::filesystem::path& good, const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  const fs::path bad = dir / "bad" / good.filename();
  fs::remove_all(bad.parent_path());
  fs::create_directories(bad.parent_path());
  fs::copy(good, bad, fs::copy_options::recursive);
  return bad;
}

// Flips one bit of the byte 100 bytes before the end of `file` (inside the tensor data).
inline void flip_byte_near_end(const std::filesystem::path& file) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-100, std::ios::end);
  const char c = static_cast<char>(f.get());
  f.seekp(-100, std::ios::end);
  f.put(static_cast<char>(c ^ 0x10));
}

}  // namespace alpaca::testing
