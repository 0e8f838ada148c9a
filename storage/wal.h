// The replica's write-ahead log: the durable half of "durable before sent" (protocol/effects.h).
//
// Layout: a directory of segment files named <index as 16 hex digits>.seg or .base, index increasing.
//   segment = header || record* || [seal] || zero bytes*
//   header  = 24 bytes: magic "BFTWAL02", u64 salt, u32 crc32c(magic || salt), u32 zero
//   record  = u32 length_and_flags || u32 crc32c(salt || length_and_flags || payload) || payload
//   seal    = a record with the seal flag whose 8-byte payload is its own offset: "this segment ends here"
// payload is encode_record() bytes (1..kWalRecordBytesMax). Bit 31 of length_and_flags marks the first record
// of a group (one write made durable at once; a seal is a group of its own), bit 30 marks the seal. The
// per-segment random salt keeps bytes that a client chose (an operation inside a PrePrepareRecord) from ever
// looking like a valid record of this log.
//
// Why the zeros (the speed of a group commit): every segment is preallocated before it receives a record, by
// writing it full of zeros and fsyncing it, so a group commit is an overwrite of blocks that are allocated and
// initialized, made durable with one pwritev2(RWF_DSYNC): the data block and a cache flush, nothing else. An
// append must also make the new file size durable (a journal commit on a journalling ext4; on this machine
// kind's ext4, which has no journal, a separate inode write), and so must a first write into fallocate's
// unwritten extents. Measured here with a small group: about 140-200 us appending against 90-140 us
// overwriting, one writer alone; 260-350 us against 145-260 us with four writers at once, as four replicas
// are. The file size therefore no longer says where the data ends; the records do.
//
// Group commit: append() only buffers; sync() writes everything buffered at the end of the data with one
// pwritev2(RWF_DSYNC). sync() is also available in three steps so that the write can run on another thread
// while the caller's loop goes on (the replica runtime's sync thread): begin_group() takes everything buffered
// as one group and reserves its place at the end of the data (the caller's thread), write_group() makes it
// durable (any thread; the only step that touches the disk), complete_group() accounts for it (the caller's
// thread again). Appending continues while a group is being written, into the next group; at most one group is
// in flight, so groups reach the disk in log order. maintain() runs between groups (see below).
//
// Replay (open): segments are read in index order from the newest .base segment (a compacted snapshot; any
// segment below it is obsolete and deleted). Records are read until the first one that is not valid (bad
// length, bad checksum) or a seal. Then:
//   - a seal: the segment is complete; everything after it must be zero, else corruption;
//   - a segment that is not the last one (sealed by its successor) must end with its seal: a segment that
//     just stops, whatever follows, is corruption (its synced tail was lost or damaged);
//   - in the last segment, if only zeros follow, that is the normal end of the log (never-written
//     preallocated space). If non-zero bytes follow, they are a torn tail when no valid group-start record
//     (or seal) starts anywhere in them: the group was never acknowledged (nothing was sent on its behalf),
//     and open overwrites those bytes with zeros, durably, before anything is appended (so that no stale
//     record of the torn group can ever line up behind a later group and be replayed). If a valid group start
//     follows, a later group was written after this one was synced: corruption.
// Corruption makes open fail with the file and offset; replay never skips over a bad record into what follows.
// A record whose checksum is valid but that does not decode is corruption too (never expected), and so is a
// complete segment header whose own checksum fails (a bad salt would otherwise make every record look torn).
// Segments of format 1 ("BFTWAL01", written by an older bftfs without preallocation or seals) are read too:
// a sealed one must end exactly at the end of its file; a torn tail of a last one is truncated as before, and
// the log continues in a new segment.
//
// Preallocation and roll-over happen in maintain(), never in sync(). The next segment is written full of
// zeros under a temporary name (next.prealloc.tmp, deleted by open() if a crash left it) in bounded steps,
// one per maintain() call, with writeback started at each step and one fsync at the end. It is started when
// the active segment is half full (or compaction is half due), so most loop passes do no preallocation at all;
// each step writes at least prealloc_chunk_bytes and at most 256 KiB, paced at four times the rate the log
// grows (scaled by the two segments' sizes), so the next segment is ready before the active one is three
// quarters full. A segment is at most four times the size of the one before it (1, 4, 16 MiB by default), so
// that pace stays within 16 times the log's. When the active segment is nearly full (or compaction is due) and the next one is ready,
// maintain() seals the active segment (seal written and made durable), writes the next one's header at offset
// 0, makes it durable, renames it to its segment name and fsyncs the directory. A new segment that open() must
// create (first start, or after a sealed or format-1 last segment) is preallocated at once, up to
// kWalFirstSegmentBytes. A last segment shorter than a header (a creation by an older bftfs that was
// interrupted) held no records: open() removes it.
//
// Direct I/O (the cost of a durable write on a virtual disk): a group is written through a second descriptor of
// the active segment opened with O_DIRECT | O_DSYNC, not through the page cache with RWF_DSYNC. The bytes on
// disk are the same; what changes is the path: no page-cache copy and no writeback of dirty pages before the
// cache flush. Measured here (`make bench-fsync-floor`, four writers at once as four replicas, 4 KiB
// overwrites of preallocated blocks, four runs): p50 311-420 us against 345-482 us, and 68-85 us of CPU per
// write against 83-101 us; most of the gain is CPU, which the four replicas share. O_DIRECT needs
// offset, length and memory aligned to the device's blocks (kWalDirectAlign covers 512-byte and 4 KiB ones),
// so a group is written from the start of the block that holds the end of the data before it (the log keeps
// that partial block's bytes in memory, `tail_`) up to the next block boundary (zeros after the group, which
// is what the preallocated space holds anyway). Rewriting that partial block is what the page cache did
// too: a buffered write at an unaligned offset writes back the whole page. Where the file system refuses
// O_DIRECT (tmpfs: EINVAL at open) or a direct write fails with EINVAL, the log says so once and goes on with
// RWF_DSYNC. Every other write (zeros, segment headers, compacted bases, seals, a torn tail's zeros) stays
// buffered: they are rare, and the kernel keeps the page cache coherent with direct writes.
//
// Compaction: when a StableRecord was appended and the log since the last base has grown past
// compact_bytes_min, the next roll-over (which maintain() then does as soon as the next segment is ready)
// makes the new segment a .base: its first group holds, in their original order, only what recovery still
// needs: the latest ViewRecord and StableRecord, CheckpointRecords at or above the stable seq, and
// PrePrepare/Prepared/Committed records above it. It is made durable before the rename (atomic), and then the
// older segments are deleted; the base is the active segment and is appended to like any other.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/types.h"
#include "protocol/effects.h"
#include "os/unique_fd.h"

namespace bftfs {

inline constexpr std::uint32_t kWalRecordBytesMax = 64u << 20;
inline constexpr std::size_t kWalSegmentHeaderBytes = 24;
inline constexpr std::size_t kWalRecordHeaderBytes = 8;
inline constexpr std::size_t kWalSealBytes = kWalRecordHeaderBytes + 8;
// A segment that open() has to create is preallocated at once up to this size (so a first start pays a few
// milliseconds, not a whole segment); the segments after it are preallocated to segment_bytes_max by maintain().
inline constexpr std::uint64_t kWalFirstSegmentBytes = 1ull << 20;
// Alignment of direct group writes: offset, length and buffer (see "Direct I/O" above).
inline constexpr std::size_t kWalDirectAlign = 4096;

struct WalOptions {
  bool fsync = true;                              // false only for benchmarks that say "not durable"
  std::uint64_t segment_bytes_max = 16ull << 20;  // each segment is preallocated (zero-filled) to this size
  // Compact at a StableRecord once the log since the last base is this big. Below segment_bytes_max so that a
  // segment is mostly used before compaction replaces it (the rest of its preallocation is discarded).
  std::uint64_t compact_bytes_min = 12ull << 20;
  std::uint64_t prealloc_chunk_bytes = 64ull << 10;  // zeros written per maintain() step, at least
  // Durable groups through O_DIRECT | O_DSYNC where the file system allows it (see "Direct I/O" above); false
  // writes them with pwritev2(RWF_DSYNC). Only with fsync.
  bool direct_io = true;
};

struct WalStats {
  std::uint64_t records_appended = 0;
  std::uint64_t bytes_appended = 0;
  std::uint64_t syncs = 0;  // groups made durable (one pwritev2 each)
  std::uint64_t direct_writes = 0;  // of those, written through O_DIRECT | O_DSYNC
  std::uint64_t sync_ns_total = 0;
  std::uint64_t sync_ns_max = 0;
  std::uint64_t syncs_past_prealloc = 0;  // groups that (partly) appended beyond the preallocated space
  std::uint64_t compactions = 0;
  std::uint64_t rolls = 0;  // segments started by maintain() (with or without compaction)
  std::uint64_t segments_deleted = 0;
  std::uint64_t prealloc_bytes = 0;  // zeros written ahead of use
  std::uint64_t prealloc_steps = 0;
  std::uint64_t prealloc_ns_max = 0;  // the longest preallocation step of maintain()
  std::uint64_t roll_ns_max = 0;      // the longest roll-over (with compaction, if any) of maintain()
  std::uint64_t replayed_records = 0;
  std::uint64_t torn_tail_bytes = 0;  // bytes zeroed (or, in a format-1 segment, truncated) at open
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

  // Buffers one record; it is durable after the next sync() (or the next group's write_group()). Cheap:
  // encodes once. Allowed while a group is in flight.
  void append(const PersistRecord& record);
  // True if records were appended since the last sync() or begin_group().
  bool dirty() const { return !buffer_.empty(); }
  // Bytes appended since the last sync() or begin_group().
  std::size_t buffered_bytes() const { return buffer_.size(); }

  // One group on its way to the disk: everything that was buffered at begin_group(), and where it goes.
  struct Group {
    int fd = -1;
    Bytes bytes;
    std::uint64_t offset = 0;
    bool durable = true;
    // Direct write: the descriptor (O_DIRECT | O_DSYNC), and the bytes of the segment from the block boundary
    // at or below `offset` up to `offset` (what the write must repeat). -1 when the group goes through
    // write_durable().
    int direct_fd = -1;
    Bytes head;
    std::uint64_t write_ns = 0;  // set by write_group()
    bool wrote_direct = false;   // set by write_group()
  };
  // Takes everything buffered as one group (dirty() must be true and no group may be in flight). Until
  // complete_group() the log has a group in flight: append() is allowed, sync() and begin_group() are not, and
  // maintain() only preallocates.
  [[nodiscard]] Group begin_group();
  // Writes `g` and makes it durable (pwritev2 RWF_DSYNC, or write + fdatasync). Thread-safe with respect to the
  // owner's other calls (it touches only `g` and the RWF_DSYNC fallback flag). Aborts on an I/O error, like
  // sync().
  void write_group(Group& g);
  // Accounts for `g` (which write_group() has written) and ends the flight.
  void complete_group(const Group& g);
  bool group_in_flight() const { return in_flight_; }
  // True when maintain() wants nothing buffered so that it can roll over to the next segment (the active one
  // is nearly full or compaction is due, and the next one is ready): a caller that keeps groups in flight back
  // to back should then sync() what is buffered once and call maintain().
  bool roll_waiting() const;
  // Writes every buffered record at the end of the data and makes it durable (one pwritev2 with RWF_DSYNC;
  // normally an overwrite of preallocated zeros). Never rolls, compacts or preallocates: that is maintain().
  // An I/O error here aborts the process: a replica that cannot persist must stop (it could otherwise send a
  // promise it cannot keep after a restart). Not while a group is in flight.
  void sync();
  // Housekeeping kept off the commit path; call it after the sends that follow a sync() (the runtime calls it
  // after every flush). Does at most one of: a roll-over to the next segment (with compaction when due), when
  // nothing is buffered, the active segment is nearly full or compaction is due, and the next segment is
  // ready (never while a group is in flight); or one bounded step of preallocating the next segment. Returns true if work remains (a caller with
  // nothing else to do may call it again). Without it the log stays correct but never rolls or compacts, and
  // groups beyond the preallocated space are appends. Aborts on I/O errors, like sync().
  bool maintain();

  const WalStats& stats() const { return stats_; }
  const std::string& dir() const { return dir_; }
  // Index of the segment records are appended to (tests).
  std::uint64_t active_segment() const { return active_index_; }
  // Offset in the active segment where the next group will be written (tests).
  std::uint64_t active_bytes() const { return active_bytes_; }

 private:
  struct LiveEntry;
  class Opener;  // one open()'s replay (wal_open.cc)
  Wal(std::string dir, const WalOptions& options);
  void track_live(const PersistRecord& record, Bytes&& payload);
  bool prealloc_step(std::uint64_t budget_bytes);
  void create_segment_now(std::uint64_t index);
  void install_next(std::uint64_t index, bool base);
  void roll();
  void write_durable(int fd, const std::uint8_t* data, std::size_t size, std::uint64_t offset, bool durable);
  bool write_direct(const Group& g);
  void open_direct(const std::string& path);
  void extend_tail(std::span<const std::uint8_t> written);
  void frame_into(Bytes& out, std::span<const std::uint8_t> payload, std::uint32_t flags) const;
  bool compaction_due() const;

  std::string dir_;
  WalOptions options_;
  UniqueFd dir_fd_;
  UniqueFd fd_;  // active segment
  std::uint64_t active_index_ = 0;
  std::uint64_t active_bytes_ = 0;     // end of the data in the active segment (where the next group goes)
  std::uint64_t active_capacity_ = 0;  // bytes of the active segment that are preallocated (file size)
  std::uint64_t salt_ = 0;
  std::uint64_t oldest_index_ = 0;        // lowest segment index still on disk
  std::uint64_t bytes_since_base_ = 0;    // data bytes of every segment from the oldest one on
  bool stable_since_compact_ = false;
  Bytes buffer_;                          // framed records waiting for sync()
  std::vector<LiveEntry> live_;
  std::uint64_t live_order_ = 0;

  // The next segment, being preallocated under a temporary name.
  UniqueFd next_fd_;
  std::uint64_t next_target_bytes_ = 0;
  std::uint64_t next_zeroed_bytes_ = 0;
  bool next_ready_ = false;                // zeroed to its target and fsynced
  std::uint64_t synced_since_step_ = 0;    // bytes synced since the last preallocation step (pacing)
  bool in_flight_ = false;                 // a group is between begin_group() and complete_group()
  // pwritev2(RWF_DSYNC) works here (else write + fdatasync); atomic because write_group() may run elsewhere.
  std::atomic<bool> rwf_dsync_{true};
  // Direct I/O (see above). direct_fd_ is the active segment opened with O_DIRECT | O_DSYNC (invalid when not
  // in use); direct_ok_ turns false for good when the file system refuses (atomic: write_group() may find out
  // on the sync thread). tail_ holds the bytes of the active segment from the block boundary at or below
  // active_bytes_ up to active_bytes_ (always kept, so that direct I/O can start at any segment).
  UniqueFd direct_fd_;
  std::atomic<bool> direct_ok_{true};
  Bytes tail_;
  // write_group()'s aligned staging buffer; only write_group() touches it, and one group is in flight at most.
  struct FreeDeleter {
    void operator()(std::uint8_t* p) const;
  };
  std::unique_ptr<std::uint8_t[], FreeDeleter> direct_buf_;
  std::size_t direct_buf_bytes_ = 0;
  WalStats stats_;
};

}  // namespace bftfs
