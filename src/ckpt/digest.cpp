#include "alpaca/ckpt/digest.h"

#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "alpaca/util/error.h"

namespace alpaca::ckpt {

struct Xxh3Digest::State {
  XXH3_state_t* s = nullptr;
};

Xxh3Digest::Xxh3Digest() : state_(std::make_unique<State>()) {
  state_->s = XXH3_createState();
  ALPACA_CHECK(state_->s != nullptr && XXH3_128bits_reset(state_->s) == XXH_OK, "cannot start an XXH3 digest (out of memory)");
}

Xxh3Digest::~Xxh3Digest() { XXH3_freeState(state_->s); }

void Xxh3Digest::update(const void* data, size_t n) {
  if (n) XXH3_128bits_update(state_->s, data, n);
}

std::pair<uint64_t, uint64_t> Xxh3Digest::words() const {
  const XXH128_hash_t h = XXH3_128bits_digest(state_->s);
  return {h.high64, h.low64};
}

std::string Xxh3Digest::hex() const {
  const auto [hi, lo] = words();
  return xxh3_hex(hi, lo);
}

std::string xxh3_hex(uint64_t high, uint64_t low) {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(high), static_cast<unsigned long long>(low));
  return buf;
}

std::string xxh3_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  ALPACA_CHECK(f, "cannot open " << path << " to verify it: " << std::strerror(errno));
  Xxh3Digest d;
  std::vector<char> buf(size_t{4} << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) d.update(buf.data(), n);
  const bool bad = std::ferror(f);
  std::fclose(f);
  ALPACA_CHECK(!bad, "read error in " << path << " while verifying it; check the disk");
  return d.hex();
}

}  // namespace alpaca::ckpt
