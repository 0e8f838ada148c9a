#include "storage/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace bftfs {
namespace {

constexpr std::uint32_t kPoly = 0x82F63B78u;

constexpr std::array<std::uint32_t, 256> make_table() {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ kPoly : (c >> 1);
    t[i] = c;
  }
  return t;
}
constexpr std::array<std::uint32_t, 256> kTable = make_table();

std::uint32_t crc32c_soft(std::uint32_t crc, const std::uint8_t* p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) crc = kTable[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
// The SSE4.2 crc32 instruction computes exactly CRC-32C; 8 bytes per instruction.
__attribute__((target("sse4.2"))) std::uint32_t crc32c_hw(std::uint32_t crc, const std::uint8_t* p,
                                                          std::size_t n) {
  std::uint64_t c = crc;
  while (n >= 8) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    n -= 8;
  }
  auto c32 = static_cast<std::uint32_t>(c);
  while (n > 0) {
    c32 = _mm_crc32_u8(c32, *p);
    ++p;
    --n;
  }
  return c32;
}
const bool kHaveHw = __builtin_cpu_supports("sse4.2");
#endif

}  // namespace

std::uint32_t crc32c(std::uint32_t crc, std::span<const std::uint8_t> data) {
  crc = ~crc;
#if defined(__x86_64__)
  if (kHaveHw) return ~crc32c_hw(crc, data.data(), data.size());
#endif
  return ~crc32c_soft(crc, data.data(), data.size());
}

}  // namespace bftfs
