// NumPy's default_rng(seed).permutation(n) (numpy/random: bit_generator.pyx SeedSequence,
// pcg64.h, distributions.c random_interval, _generator.pyx shuffle), written out because nothing
// we link has it; tests/data/test_shuffle.cpp checks it against NumPy and datasets.
#include "alpaca/data/shuffle.h"

#include <array>

#include "alpaca/util/error.h"

namespace alpaca::data {
namespace {

using u128 = unsigned __int128;

// SeedSequence's constants (bit_generator.pyx).
constexpr uint32_t kInitA = 0x43b0d7e5, kMultA = 0x931e8875, kInitB = 0x8b51f9dd, kMultB = 0x58f38ded;
constexpr uint32_t kMixMultL = 0xca01f9dd, kMixMultR = 0x4973f715;
constexpr int kXShift = 16;  // 4 * 8 / 2 bits
constexpr int kPoolSize = 4;

uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  value ^= value >> kXShift;
  return value;
}

uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t r = kMixMultL * x - kMixMultR * y;
  r ^= r >> kXShift;
  return r;
}

// SeedSequence(seed).generate_state(4, np.uint64), as 8 uint32 words.
std::array<uint32_t, 8> seed_sequence_state(uint64_t seed) {
  std::vector<uint32_t> entropy;  // _int_to_uint32_array: little-endian 32-bit words, [0] for 0
  if (seed == 0) entropy.push_back(0);
  for (uint64_t s = seed; s > 0; s >>= 32) entropy.push_back(static_cast<uint32_t>(s & 0xffffffffu));
  std::array<uint32_t, kPoolSize> pool{};
  uint32_t hash_const = kInitA;
  for (size_t i = 0; i < pool.size(); ++i) pool[i] = hashmix(i < entropy.size() ? entropy[i] : 0u, hash_const);
  for (size_t src = 0; src < pool.size(); ++src)
    for (size_t dst = 0; dst < pool.size(); ++dst)
      if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src], hash_const));
  for (size_t src = pool.size(); src < entropy.size(); ++src)
    for (size_t dst = 0; dst < pool.size(); ++dst) pool[dst] = mix(pool[dst], hashmix(entropy[src], hash_const));
  std::array<uint32_t, 8> state{};
  uint32_t hash_b = kInitB;
  for (size_t i = 0; i < state.size(); ++i) {
    uint32_t v = pool[i % pool.size()];
    v ^= hash_b;
    hash_b *= kMultB;
    v *= hash_b;
    v ^= v >> kXShift;
    state[i] = v;
  }
  return state;
}

// PCG64 (pcg64.h: setseq 128-bit LCG, XSL-RR output) with BitGenerator's buffered 32-bit draws.
class Pcg64 {
 public:
  explicit Pcg64(uint64_t seed) {
    const auto w = seed_sequence_state(seed);
    auto word64 = [&](int k) { return static_cast<uint64_t>(w[2 * k]) | static_cast<uint64_t>(w[2 * k + 1]) << 32; };
    const u128 initstate = static_cast<u128>(word64(0)) << 64 | word64(1);
    const u128 initseq = static_cast<u128>(word64(2)) << 64 | word64(3);
    state_ = 0;
    inc_ = initseq << 1 | 1;
    step();
    state_ += initstate;
    step();
  }
  uint64_t next64() {
    step();
    const auto hi = static_cast<uint64_t>(state_ >> 64), lo = static_cast<uint64_t>(state_);
    const unsigned rot = static_cast<unsigned>(state_ >> 122);
    const uint64_t x = hi ^ lo;
    return (x >> rot) | (x << ((64 - rot) & 63));
  }
  uint32_t next32() {
    if (has32_) {
      has32_ = false;
      return buffered_;
    }
    const uint64_t v = next64();
    has32_ = true;
    buffered_ = static_cast<uint32_t>(v >> 32);
    return static_cast<uint32_t>(v & 0xffffffffu);
  }

 private:
  void step() {
    constexpr u128 kMult = static_cast<u128>(2549297995355413924ULL) << 64 | 4865540595714422341ULL;
    state_ = state_ * kMult + inc_;
  }
  u128 state_ = 0, inc_ = 0;
  bool has32_ = false;
  uint32_t buffered_ = 0;
};

// distributions.c random_interval: a uniform value in [0, max] by masked rejection.
uint64_t random_interval(Pcg64& g, uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;
  for (int s = 1; s <= 32; s *= 2) mask |= mask >> s;
  uint64_t value = 0;
  if (max <= 0xffffffffULL) {
    while ((value = (g.next32() & mask)) > max) {
    }
  } else {
    while ((value = (g.next64() & mask)) > max) {
    }
  }
  return value;
}

}  // namespace

std::vector<int64_t> numpy_permutation(uint64_t seed, int64_t n) {
  ALPACA_CHECK(n >= 0, "numpy_permutation: negative length " << n);
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[static_cast<size_t>(i)] = i;
  Pcg64 g(seed);
  // Generator.shuffle (_shuffle_raw, first = 1): i from n - 1 down to 1, swap with j in [0, i].
  for (int64_t i = n - 1; i >= 1; --i) {
    const auto j = static_cast<int64_t>(random_interval(g, static_cast<uint64_t>(i)));
    std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(j)]);
  }
  return p;
}

}  // namespace alpaca::data
