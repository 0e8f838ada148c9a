// A small seeded PRNG (xoshiro256**, seeded by splitmix64) for the pure core and the simulator. Never
// std::rand or std::random_device in protocol code: one seed must reproduce a whole run.
#pragma once

#include <cstdint>

#include "common/assert.h"

namespace bftfs {

class Prng {
 public:
  explicit Prng(std::uint64_t seed) {
    std::uint64_t x = seed;
    for (auto& s : s_) s = splitmix(x);
  }
  std::uint64_t next() {
    const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, bound). Precondition: bound > 0.
  std::uint64_t below(std::uint64_t bound) {
    BFT_ASSERT(bound > 0);
    return next() % bound;  // bias is negligible for the small bounds used here
  }
  // Uniform in [lo, hi]. Precondition: lo <= hi.
  std::uint64_t range(std::uint64_t lo, std::uint64_t hi) {
    BFT_ASSERT(lo <= hi);
    return lo + below(hi - lo + 1);
  }
  // True with probability num/den.
  bool chance(std::uint64_t num, std::uint64_t den) { return below(den) < num; }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  static std::uint64_t splitmix(std::uint64_t& x) {
    std::uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  std::uint64_t s_[4];
};

}  // namespace bftfs
