// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of write-ahead log records. It detects
// torn and corrupted records; it is not an authenticator (the log is our own disk, not peer input).
#pragma once

#include <cstdint>
#include <span>

namespace bftfs {

// Extends `crc` (start with 0) over `data`. crc32c(0, "123456789") == 0xE3069283.
std::uint32_t crc32c(std::uint32_t crc, std::span<const std::uint8_t> data);

}  // namespace bftfs
