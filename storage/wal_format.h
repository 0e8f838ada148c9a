// Private to the write-ahead log's two files: wal.cc (appending, group commit, preallocation, roll-over,
// compaction) and wal_open.cc (open and replay). The constants of the segment format that both sides must
// agree on, and the few helpers both use. The format itself is described in wal.h.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "storage/wal.h"

namespace bftfs::wal_format {

inline constexpr std::uint8_t kSegmentMagicV1[8] = {'B', 'F', 'T', 'W', 'A', 'L', '0', '1'};
inline constexpr std::uint8_t kSegmentMagic[8] = {'B', 'F', 'T', 'W', 'A', 'L', '0', '2'};
// Bits of a record's length_and_flags word.
inline constexpr std::uint32_t kGroupStart = 0x80000000u;
inline constexpr std::uint32_t kSeal = 0x40000000u;
inline constexpr std::uint32_t kLengthMask = 0x3FFFFFFFu;
static_assert(kWalRecordBytesMax <= kLengthMask);
static_assert(kWalSealBytes == kWalRecordHeaderBytes + 8);

// The next segment while it is being preallocated. The name ends in .tmp, so open() deletes a leftover one:
// after a crash nothing says how much of it reached the disk, and it holds no records.
inline constexpr char kNextSegmentName[] = "next.prealloc.tmp";

inline std::size_t align_down(std::size_t v) { return v - v % kWalDirectAlign; }
inline std::size_t align_up(std::size_t v) { return align_down(v + kWalDirectAlign - 1); }

// The checksum of one record: crc32c over the segment's salt, the length_and_flags word and the payload.
std::uint32_t record_crc(std::uint64_t salt, std::uint32_t length_and_flags, std::span<const std::uint8_t> payload);

// "<index as 16 hex digits>.seg", or ".base" for a compacted base.
std::string segment_name(std::uint64_t index, bool base);

// Logs what failed (with errno's text) and aborts: a log that cannot persist must stop the process.
[[noreturn]] void die(const char* what, const std::string& where);

// Writes `size` zero bytes at `offset` (not yet durable); aborts on an I/O error.
void write_zeros_or_die(int fd, std::uint64_t offset, std::uint64_t size, const std::string& what);

}  // namespace bftfs::wal_format
