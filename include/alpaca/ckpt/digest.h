// Checkpoint file digests: XXH3-128 (Debian's libxxhash) computed while a file is written, so a
// save never reads its data back. It detects corruption (a flipped byte, a truncated or replaced
// file), it is not a cryptographic signature. Older checkpoints carry SHA-256 digests
// (resume_state.h's sha256_file); checkpoint_problem accepts both.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace alpaca::ckpt {

inline constexpr const char* kDigestAlgorithm = "xxh3_128";

// A streaming XXH3-128 state: update() with the bytes in file order, then hex().
class Xxh3Digest {
 public:
  Xxh3Digest();
  ~Xxh3Digest();
  Xxh3Digest(const Xxh3Digest&) = delete;
  Xxh3Digest& operator=(const Xxh3Digest&) = delete;
  void update(const void* data, size_t n);
  std::string hex() const;  // 32 lowercase hex digits (the canonical big-endian form)
  // The digest as two 64-bit words (high, low), for gathering over a communicator.
  std::pair<uint64_t, uint64_t> words() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

std::string xxh3_hex(uint64_t high, uint64_t low);
// XXH3-128 of a file's bytes as hex. Throws naming the file when it cannot be read.
std::string xxh3_file(const std::string& path);

}  // namespace alpaca::ckpt
