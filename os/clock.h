// Clock readings for the runtime (never for the pure core: it counts ticks the runtime gives it).
#pragma once

#include <cstdint>
#include <ctime>

namespace bftfs {

inline std::uint64_t clock_ns(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}
// Wall clock, for the agreed batch timestamps and status files.
inline std::uint64_t realtime_ns() { return clock_ns(CLOCK_REALTIME); }
// Monotonic clock, for timeouts and latency measurements.
inline std::uint64_t mono_ns() { return clock_ns(CLOCK_MONOTONIC); }
inline std::uint64_t mono_ms() { return mono_ns() / 1000000; }

}  // namespace bftfs
