// The replica's write-ahead log: the durable half of "durable before sent" (protocol/effects.h).
//
// Layout: a directory of segment files named <index as 16 hex digits>.seg or .base, index increasing.
//   segment = header (24 bytes: magic "BFTWAL01", u64 salt, u32 crc32c(magic || salt), u32 zero) || record*
//   record  = u32 length_and_flags || u32 crc32c(salt || length_and_flags || payload) || payload
// payload is encode_record() bytes (1..kWalRecordBytesMax). Bit 31 of length_and_flags marks the first record
// of a group (one write + one fdatasync). The per-segment random salt keeps bytes that a client chose (an
// operation inside a PrePrepareRecord) from ever looking like a valid record of this log.
//
// Group commit: append() only buffers; sync() writes everything buffered with one write and makes it durable
// with one fdatasync. The runtime calls sync() once per event-loop pass, before it sends anything.
//
// Replay (open): segments are read in index order from the newest .base segment (a compacted snapshot; any
// segment below it is obsolete and deleted). A record that fails its checksum is
//   - a torn tail if it is in the last segment and no valid group-start record follows it: the segment is
//     truncated there (the group was never acknowledged: nothing was sent on its behalf);
//   - corruption otherwise (an older segment, or a later group exists so this group was synced): open fails
//     with the file and offset. Replay never skips over a bad record into what follows.
// A record whose checksum is valid but that does not decode is corruption too (never expected), and so is a
// complete segment header whose own checksum fails (a bad salt would otherwise make every record look torn).
//
// Compaction: when a StableRecord was appended and the log since the last base has grown past
// compact_bytes_min, sync() writes a new .base segment holding, in their original order, only what recovery
// still needs: the latest ViewRecord and StableRecord, CheckpointRecords at or above the stable seq, and
// PrePrepare/Prepared/Committed records above it. The base is written to a temporary name, fsynced and
// renamed (atomic), then the older segments are deleted.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/types.h"
#include "protocol/effects.h"
#include "replica/unique_fd.h"

namespace bftfs {

inline constexpr std::uint32_t kWalRecordBytesMax = 64u << 20;
inline constexpr std::size_t kWalSegmentHeaderBytes = 24;
inline constexpr std::size_t kWalRecordHeaderBytes = 8;

struct WalOptions {
  bool fsync = true;                                   // false only for benchmarks that say "not durable"
  std::uint64_t segment_bytes_max = 64ull << 20;       // roll to a new segment past this size
  std::uint64_t compact_bytes_min = 8ull << 20;        // compact at a StableRecord once the log is this big
};

struct WalStats {
  std::uint64_t records_appended = 0;
  std::uint64_t bytes_appended = 0;
  std::uint64_t syncs = 0;        // write+fdatasync groups
  std::uint64_t sync_ns_total = 0;
  std::uint64_t sync_ns_max = 0;
  std::uint64_t compactions = 0;
  std::uint64_t segments_deleted = 0;
  std::uint64_t replayed_records = 0;
  std::uint64_t torn_tail_bytes = 0;  // bytes truncated from the tail at open
};

class Wal {
 public:
  // Opens (creating if needed) the log in `dir`, replays it into `records` (in log order) and leaves it ready
  // to append. Returns "" or an error naming the file and reason; on error `out` is null.
  [[nodiscard]] static std::string open(const std::string& dir, const WalOptions& options,
                                        std::unique_ptr<Wal>& out, std::vector<PersistRecord>& records);
  ~Wal();
  Wal(const Wal&) = delete;
  Wal& operator=(const Wal&) = delete;

  // Buffers one record; it is durable after the next sync(). Cheap: encodes once.
  void append(const PersistRecord& record);
  // True if records were appended since the last sync().
  bool dirty() const { return !buffer_.empty(); }
  // Writes and fdatasyncs every buffered record (one write, one fdatasync), then rolls or compacts if due.
  // An I/O error here aborts the process: a replica that cannot persist must stop (it could otherwise send a
  // promise it cannot keep after a restart).
  void sync();

  const WalStats& stats() const { return stats_; }
  const std::string& dir() const { return dir_; }
  // Index of the segment records are appended to (tests).
  std::uint64_t active_segment() const { return active_index_; }

 private:
  struct LiveEntry;
  Wal(std::string dir, const WalOptions& options);
  void track_live(const PersistRecord& record, Bytes&& payload);
  void start_segment(std::uint64_t index, bool base);
  void compact();
  void write_all(int fd, const std::uint8_t* data, std::size_t size);
  void frame_into(Bytes& out, std::span<const std::uint8_t> payload, bool group_start) const;

  std::string dir_;
  WalOptions options_;
  UniqueFd dir_fd_;
  UniqueFd fd_;  // active segment
  std::uint64_t active_index_ = 0;
  std::uint64_t active_bytes_ = 0;
  std::uint64_t salt_ = 0;
  std::uint64_t oldest_index_ = 0;        // lowest segment index still on disk
  std::uint64_t bytes_since_base_ = 0;    // all segment bytes from the oldest segment on
  bool stable_since_compact_ = false;
  Bytes buffer_;                          // framed records waiting for sync()
  std::vector<LiveEntry> live_;
  std::uint64_t live_order_ = 0;
  WalStats stats_;
};

}  // namespace bftfs
