// Deriving independent random streams from one seed: mix(seed, salt) is the seed of the stream named by `salt`
// (splitmix64's finalizer over both). Each concern of a run draws from a stream of its own, so that a change to
// how one of them draws leaves every other stream, and so every other seed's scenario and run, as it was.
#pragma once

#include <cstdint>

namespace bftfs::sim {

inline std::uint64_t mix(std::uint64_t a, std::uint64_t b) {
  std::uint64_t z = a * 0x9E3779B97F4A7C15ull + b + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace bftfs::sim
