// CRIU's statistics files (`stats-dump`, `stats-restore` in an images directory), decoded.
//
// CRIU writes them after every dump and restore: a service-image header (two 32-bit little-endian magics), a
// 32-bit length and one protobuf `stats_entry` (CRIU's images/stats.proto) whose `dump` or `restore` field holds
// the timings in microseconds. The bytes come from another program, so decoding checks every length and tag and
// returns a reason instead of trusting them. Pure: the caller reads the file.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace bftfs::criu {

struct DumpStats {
  std::uint32_t freezing_us = 0;  // from the start of freezing until every task was stopped
  std::uint32_t frozen_us = 0;    // how long the tasks stayed frozen
  std::uint32_t memdump_us = 0;
  std::uint32_t memwrite_us = 0;
  std::uint64_t pages_written = 0;
};

struct RestoreStats {
  std::uint32_t forking_us = 0;
  std::uint32_t restore_us = 0;
  std::uint64_t pages_restored = 0;
};

inline constexpr std::uint32_t kImgServiceMagic = 0x55105940;
inline constexpr std::uint32_t kStatsMagic = 0x57093306;

// Decodes a `stats-dump` file. Returns "" or why the bytes are not one.
[[nodiscard]] std::string decode_dump_stats(std::string_view file, DumpStats& out);
// Decodes a `stats-restore` file. Returns "" or why the bytes are not one.
[[nodiscard]] std::string decode_restore_stats(std::string_view file, RestoreStats& out);

}  // namespace bftfs::criu
