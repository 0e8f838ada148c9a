// The write-ahead log while it runs: framing and buffering records, group commit (direct or RWF_DSYNC
// writes), preallocation of the next segment, roll-over and compaction. Opening and replaying a log is in
// wal_open.cc; the format is described in wal.h.
#include "storage/wal.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/assert.h"
#include "common/codec.h"
#include "common/log.h"
#include "os/clock.h"
#include "storage/crc32c.h"
#include "storage/wal_format.h"

namespace bftfs {

using namespace wal_format;

namespace wal_format {

std::uint32_t record_crc(std::uint64_t salt, std::uint32_t length_and_flags, std::span<const std::uint8_t> payload) {
  std::uint8_t head[12];
  store_u64_le(head, salt);
  store_u32_le(head + 8, length_and_flags);
  return crc32c(crc32c(0, head), payload);
}

std::string segment_name(std::uint64_t index, bool base) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx.%s", static_cast<unsigned long long>(index), base ? "base" : "seg");
  return buf;
}

[[noreturn]] void die(const char* what, const std::string& where) {
  LOG_ERROR("", "wal: %s %s failed: %s; stopping (cannot persist)", what, where.c_str(), std::strerror(errno));
  std::abort();
}

}  // namespace wal_format

namespace {

// The most zeros one maintain() step writes, whatever the pace asks for.
constexpr std::uint64_t kPreallocStepBytesMax = 256 << 10;

// write_group() keeps its aligned staging buffer for groups up to this size; a larger group (a bulk file write)
// gets a buffer of its own that is freed after the write, so one burst does not pin megabytes for good.
constexpr std::size_t kDirectBufKeepBytes = 1 << 20;

// Zeros for preallocation and for clearing a torn tail: written from here in pieces of this size.
constexpr std::size_t kZeroBlockBytes = 64 << 10;
alignas(4096) constexpr std::uint8_t kZeros[kZeroBlockBytes] = {};

void fsync_or_die(int fd, const std::string& what) {
  if (::fsync(fd) != 0) die("fsync of", what);
}

// Writes all of `data` at `offset` (pwritev2 with `flags`, 0 or RWF_DSYNC). Returns 0 or the errno.
int pwrite_all(int fd, const std::uint8_t* data, std::size_t size, std::uint64_t offset, int flags) {
  std::size_t done = 0;
  while (done < size) {
    iovec iov{const_cast<std::uint8_t*>(data + done), size - done};
    const ssize_t w = ::pwritev2(fd, &iov, 1, static_cast<off_t>(offset + done), flags);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return errno;
    done += static_cast<std::size_t>(w);
  }
  return 0;
}

std::uint64_t random_salt() {
  std::uint64_t salt = 0;
  while (getrandom(&salt, sizeof salt, 0) != static_cast<ssize_t>(sizeof salt)) {
    BFT_ASSERT(errno == EINTR);
  }
  return salt;
}

// The segment header: magic, salt, and a checksum of both (so a damaged salt is reported, not mistaken for a
// log whose every record is torn).
void make_segment_header(std::uint8_t* out, std::uint64_t salt) {
  std::memcpy(out, kSegmentMagic, 8);
  store_u64_le(out + 8, salt);
  store_u32_le(out + 16, crc32c(0, std::span<const std::uint8_t>(out, 16)));
  store_u32_le(out + 20, 0);
}

enum class LiveKind : std::uint8_t { kView, kPrePrepare, kPrepared, kCommitted, kCheckpoint, kStable };

}  // namespace

void wal_format::write_zeros_or_die(int fd, std::uint64_t offset, std::uint64_t size, const std::string& what) {
  while (size > 0) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(size, kZeroBlockBytes));
    if (const int err = pwrite_all(fd, kZeros, n, offset, 0); err != 0) {
      errno = err;
      die("zero-filling", what);
    }
    offset += n;
    size -= n;
  }
}

struct Wal::LiveEntry {
  std::uint64_t order = 0;
  LiveKind kind = LiveKind::kView;
  std::uint64_t seq = 0;
  Bytes payload;
};

Wal::Wal(std::string dir, const WalOptions& options) : dir_(std::move(dir)), options_(options) {}
Wal::~Wal() {
  // Nothing buffered may be lost silently on a clean shutdown; a crash loses only what nothing relied on.
  BFT_ASSERT(!in_flight_);  // the owner completes its group before destroying the log
  if (fd_.valid() && dirty()) sync();
  // A half-made next segment is of no use to the next open (which deletes it anyway).
  if (next_fd_.valid()) ::unlink((dir_ + "/" + kNextSegmentName).c_str());
}

// Frames one record (or seal) with the active salt; `flags` is a combination of kGroupStart and kSeal.
void Wal::frame_into(Bytes& out, std::span<const std::uint8_t> payload, std::uint32_t flags) const {
  BFT_ASSERT(!payload.empty());
  BFT_ASSERT(payload.size() <= kWalRecordBytesMax);
  BFT_ASSERT((flags & kLengthMask) == 0);
  const std::uint32_t length_and_flags = static_cast<std::uint32_t>(payload.size()) | flags;
  const std::size_t at = out.size();
  out.resize(at + kWalRecordHeaderBytes + payload.size());
  store_u32_le(out.data() + at, length_and_flags);
  store_u32_le(out.data() + at + 4, record_crc(salt_, length_and_flags, payload));
  std::memcpy(out.data() + at + kWalRecordHeaderBytes, payload.data(), payload.size());
}

// One system call when the kernel has RWF_DSYNC (it syncs just the written range: data, and the metadata
// needed to read it back, which for an overwrite of preallocated blocks is none); write + fdatasync otherwise.
void Wal::write_durable(int fd, const std::uint8_t* data, std::size_t size, std::uint64_t offset, bool durable) {
  if (durable && rwf_dsync_) {
    const int err = pwrite_all(fd, data, size, offset, RWF_DSYNC);
    if (err == 0) return;
    if (err != EOPNOTSUPP) {
      errno = err;
      die("durable write to", dir_);
    }
    rwf_dsync_ = false;  // a kernel older than 4.7
  }
  if (const int err = pwrite_all(fd, data, size, offset, 0); err != 0) {
    errno = err;
    die("write to", dir_);
  }
  if (durable && ::fdatasync(fd) != 0) die("fdatasync of", dir_);
}

void Wal::FreeDeleter::operator()(std::uint8_t* p) const { std::free(p); }

// Opens the direct descriptor of the active segment at `path` (see "Direct I/O" in wal.h), or leaves it
// invalid: without fsync, when switched off, or when this file system refuses O_DIRECT (then for good).
void Wal::open_direct(const std::string& path) {
  direct_fd_.reset();
  if (!options_.fsync || !options_.direct_io || !direct_ok_) return;
  direct_fd_.reset(::open(path.c_str(), O_WRONLY | O_DIRECT | O_DSYNC | O_CLOEXEC));
  if (!direct_fd_.valid()) {
    direct_ok_ = false;
    LOG_INFO("", "wal %s: no direct I/O here (%s); durable writes use pwritev2(RWF_DSYNC)", dir_.c_str(),
             std::strerror(errno));
  }
}

// Keeps tail_ (see wal.h) true when `written` goes to the active segment at active_bytes_; call it just before
// active_bytes_ moves past those bytes.
void Wal::extend_tail(std::span<const std::uint8_t> written) {
  BFT_ASSERT(tail_.size() == active_bytes_ % kWalDirectAlign);
  const std::uint64_t end = active_bytes_ + written.size();
  const std::uint64_t block = end - end % kWalDirectAlign;
  if (block <= active_bytes_) {
    tail_.insert(tail_.end(), written.begin(), written.end());  // the end stays in the same block
  } else {
    tail_.assign(written.end() - static_cast<std::ptrdiff_t>(end - block), written.end());
  }
  BFT_ASSERT(tail_.size() == end % kWalDirectAlign);
}

// The group, repeated from the block boundary before it (g.head) and padded with zeros to the next one, in one
// O_DIRECT | O_DSYNC write. Returns false when the kernel refuses the direct write (EINVAL: an alignment this
// file system does not accept); direct I/O is then off for good, and the caller writes the whole group through
// write_durable(), over whatever part of it did reach the file. Other errors abort, as in write_durable().
bool Wal::write_direct(const Group& g) {
  BFT_ASSERT(g.head.size() < kWalDirectAlign);
  BFT_ASSERT(g.offset % kWalDirectAlign == g.head.size());
  const std::size_t used = g.head.size() + g.bytes.size();
  const std::size_t len = align_up(used);
  std::unique_ptr<std::uint8_t[], FreeDeleter> own;
  std::uint8_t* buf = nullptr;
  auto allocate = [&](std::size_t bytes) {
    void* p = std::aligned_alloc(kWalDirectAlign, bytes);
    if (p == nullptr) {
      errno = ENOMEM;
      die("allocating a direct-write buffer for", dir_);
    }
    return std::unique_ptr<std::uint8_t[], FreeDeleter>(static_cast<std::uint8_t*>(p));
  };
  if (len > kDirectBufKeepBytes) {
    own = allocate(len);
    buf = own.get();
  } else {
    if (direct_buf_bytes_ < len) {
      const std::size_t want = std::min(kDirectBufKeepBytes, std::max(len, 2 * direct_buf_bytes_));
      direct_buf_ = allocate(want);
      direct_buf_bytes_ = want;
    }
    buf = direct_buf_.get();
  }
  if (!g.head.empty()) std::memcpy(buf, g.head.data(), g.head.size());
  std::memcpy(buf + g.head.size(), g.bytes.data(), g.bytes.size());
  std::memset(buf + used, 0, len - used);
  const int err = pwrite_all(g.direct_fd, buf, len, g.offset - g.head.size(), 0);
  if (err == 0) return true;
  if (err != EINVAL) {
    errno = err;
    die("durable direct write to", dir_);
  }
  direct_ok_ = false;
  LOG_WARN("", "wal %s: a direct write was refused (EINVAL); durable writes use pwritev2(RWF_DSYNC) from now on",
           dir_.c_str());
  return false;
}

void Wal::append(const PersistRecord& record) {
  Bytes payload = encode_record(record);
  BFT_ASSERT(!payload.empty());
  BFT_ASSERT(payload.size() <= kWalRecordBytesMax);
  frame_into(buffer_, payload, buffer_.empty() ? kGroupStart : 0u);
  ++stats_.records_appended;
  stats_.bytes_appended += kWalRecordHeaderBytes + payload.size();
  if (std::holds_alternative<StableRecord>(record)) stable_since_compact_ = true;
  track_live(record, std::move(payload));
}

// Keeps the encoded copy of every record recovery may still need (see the header), pruned at each stable
// checkpoint; a compaction writes exactly these.
void Wal::track_live(const PersistRecord& record, Bytes&& payload) {
  LiveEntry e;
  e.order = live_order_++;
  e.payload = std::move(payload);
  std::visit(
      [&](const auto& r) {
        using T = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<T, ViewRecord>) {
          e.kind = LiveKind::kView;
          e.seq = r.view;
        } else if constexpr (std::is_same_v<T, PrePrepareRecord>) {
          e.kind = LiveKind::kPrePrepare;
          e.seq = r.seq;
        } else if constexpr (std::is_same_v<T, PreparedRecord>) {
          e.kind = LiveKind::kPrepared;
          e.seq = r.seq;
        } else if constexpr (std::is_same_v<T, CommittedRecord>) {
          e.kind = LiveKind::kCommitted;
          e.seq = r.seq;
        } else if constexpr (std::is_same_v<T, CheckpointRecord>) {
          e.kind = LiveKind::kCheckpoint;
          e.seq = r.seq;
        } else {
          static_assert(std::is_same_v<T, StableRecord>);
          e.kind = LiveKind::kStable;
          e.seq = r.seq;
        }
      },
      record);

  if (e.kind == LiveKind::kView) {
    std::erase_if(live_, [](const LiveEntry& x) { return x.kind == LiveKind::kView; });
  } else if (e.kind == LiveKind::kStable) {
    const std::uint64_t stable = e.seq;
    std::erase_if(live_, [stable](const LiveEntry& x) {
      switch (x.kind) {
        case LiveKind::kView:
          return false;
        case LiveKind::kStable:
          return true;  // superseded by this one
        case LiveKind::kCheckpoint:
          return x.seq < stable;
        case LiveKind::kPrePrepare:
        case LiveKind::kPrepared:
        case LiveKind::kCommitted:
          return x.seq <= stable;
      }
      return false;
    });
  }
  live_.push_back(std::move(e));
}

void Wal::sync() {
  BFT_ASSERT(!in_flight_);
  if (buffer_.empty()) return;
  Group g = begin_group();
  write_group(g);
  complete_group(g);
}

Wal::Group Wal::begin_group() {
  BFT_ASSERT(!in_flight_);
  BFT_ASSERT(!buffer_.empty());
  BFT_ASSERT(fd_.valid());
  in_flight_ = true;
  Group g;
  g.fd = fd_.get();
  g.offset = active_bytes_;
  g.durable = options_.fsync;
  g.bytes = std::move(buffer_);
  buffer_.clear();  // the next append() starts the next group (kGroupStart)
  if (active_bytes_ + g.bytes.size() > active_capacity_) ++stats_.syncs_past_prealloc;
  if (direct_fd_.valid() && direct_ok_) {
    g.direct_fd = direct_fd_.get();
    g.head = tail_;
  }
  extend_tail(g.bytes);
  // The group's place is reserved now: the next group goes after it, whenever this one completes.
  active_bytes_ += g.bytes.size();
  bytes_since_base_ += g.bytes.size();
  return g;
}

void Wal::write_group(Group& g) {
  BFT_ASSERT(g.fd >= 0);
  const std::uint64_t t0 = mono_ns();
  g.wrote_direct = g.direct_fd >= 0 && g.durable && direct_ok_ && write_direct(g);
  if (!g.wrote_direct) write_durable(g.fd, g.bytes.data(), g.bytes.size(), g.offset, g.durable);
  g.write_ns = mono_ns() - t0;
}

void Wal::complete_group(const Group& g) {
  BFT_ASSERT(in_flight_);
  BFT_ASSERT(g.offset + g.bytes.size() <= active_bytes_);
  in_flight_ = false;
  ++stats_.syncs;
  if (g.wrote_direct) ++stats_.direct_writes;
  stats_.sync_ns_total += g.write_ns;
  stats_.sync_ns_max = std::max(stats_.sync_ns_max, g.write_ns);
  synced_since_step_ += g.bytes.size();
}

bool Wal::roll_waiting() const {
  const std::uint64_t slack = std::min<std::uint64_t>(64 << 10, active_capacity_ / 16);
  return next_ready_ && (active_bytes_ + slack >= active_capacity_ || compaction_due());
}

bool Wal::compaction_due() const { return stable_since_compact_ && bytes_since_base_ >= options_.compact_bytes_min; }

bool Wal::maintain() {
  // Roll a little before the preallocated space runs out, so that a group rarely has to append past it.
  const std::uint64_t slack = std::min<std::uint64_t>(64 << 10, active_capacity_ / 16);
  const bool roll_due = active_bytes_ + slack >= active_capacity_ || compaction_due();
  const std::uint64_t t0 = mono_ns();
  if (roll_due && next_ready_ && !dirty() && !in_flight_) {
    roll();
    stats_.roll_ns_max = std::max(stats_.roll_ns_max, mono_ns() - t0);
    return true;  // the segment after this one is to be preallocated when its time comes
  }
  if (next_ready_) return roll_due && !in_flight_;
  // The next segment is started once the active one is half full (or compaction is half due): no
  // preallocation at all in a replica's first half segment, and none in most loop passes.
  const bool started = next_fd_.valid() || active_bytes_ * 2 >= active_capacity_ ||
                       (stable_since_compact_ && bytes_since_base_ * 2 >= options_.compact_bytes_min);
  if (!started) {
    synced_since_step_ = 0;
    return false;
  }
  // Four times the log's own pace relative to the sizes, so the next segment is ready when the active one is
  // at most three quarters full; at least one chunk, and at most kPreallocStepBytesMax (a bounded stall: under
  // groups so large that this falls behind, groups append past the preallocation until the next roll-over).
  const std::uint64_t target = next_target_bytes_ != 0 ? next_target_bytes_
                                                        : std::min(options_.segment_bytes_max, 4 * active_capacity_);
  const std::uint64_t pace = 4 * synced_since_step_ * std::max<std::uint64_t>(target, 1) /
                             std::max<std::uint64_t>(active_capacity_, 1);
  synced_since_step_ = 0;
  const std::uint64_t chunk = std::max<std::uint64_t>(options_.prealloc_chunk_bytes, 1);
  prealloc_step(std::clamp(pace, chunk, std::max(chunk, kPreallocStepBytesMax)));
  ++stats_.prealloc_steps;
  stats_.prealloc_ns_max = std::max(stats_.prealloc_ns_max, mono_ns() - t0);
  return true;
}

// One step of zero-filling the next segment: up to `budget_bytes` of zeros with their writeback started (so
// the final fsync has little left to wait for), or, once all are written, that fsync. Returns next_ready_.
bool Wal::prealloc_step(std::uint64_t budget_bytes) {
  if (next_ready_) return true;
  const std::string path = dir_ + "/" + kNextSegmentName;
  if (!next_fd_.valid()) {
    next_fd_.reset(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!next_fd_.valid()) die("creating", path);
    next_zeroed_bytes_ = 0;
    // Segments grow to segment_bytes_max by at most four times each (1, 4, 16 MiB by default), which bounds
    // how much faster than the log the preallocation must go.
    if (next_target_bytes_ == 0) next_target_bytes_ = std::min(options_.segment_bytes_max, 4 * active_capacity_);
    next_target_bytes_ = std::max<std::uint64_t>(next_target_bytes_, kWalSegmentHeaderBytes);
  }
  if (next_zeroed_bytes_ < next_target_bytes_) {
    const std::uint64_t n = std::min(budget_bytes, next_target_bytes_ - next_zeroed_bytes_);
    write_zeros_or_die(next_fd_.get(), next_zeroed_bytes_, n, path);
    if (options_.fsync &&
        ::sync_file_range(next_fd_.get(), static_cast<off_t>(next_zeroed_bytes_), static_cast<off_t>(n),
                          SYNC_FILE_RANGE_WRITE) != 0) {
      die("starting writeback of", path);
    }
    next_zeroed_bytes_ += n;
    stats_.prealloc_bytes += n;
    return false;
  }
  // The zeros, the blocks' allocation and the file size, durable: from now on writes here are overwrites.
  if (options_.fsync) fsync_or_die(next_fd_.get(), path);
  next_ready_ = true;
  return true;
}

// Makes the preallocated next segment the active one, as segment `index` (a .base holding the live records
// when `base`): header (and live records) written over its zeros and made durable, then the rename that gives
// it its name, made durable with the directory.
void Wal::install_next(std::uint64_t index, bool base) {
  BFT_ASSERT(next_ready_);
  BFT_ASSERT(buffer_.empty());
  salt_ = random_salt();  // every record framed from here on belongs to the new segment
  Bytes out(kWalSegmentHeaderBytes);
  make_segment_header(out.data(), salt_);
  if (base) {
    bool first = true;
    for (const LiveEntry& e : live_) {
      frame_into(out, e.payload, first ? kGroupStart : 0u);
      first = false;
    }
  }
  write_durable(next_fd_.get(), out.data(), out.size(), 0, true);
  const std::string from = dir_ + "/" + kNextSegmentName;
  const std::string to = dir_ + "/" + segment_name(index, base);
  if (::rename(from.c_str(), to.c_str()) != 0) die("renaming to", to);
  fsync_or_die(dir_fd_.get(), "wal directory " + dir_);
  fd_ = std::move(next_fd_);
  open_direct(to);
  active_index_ = index;
  active_bytes_ = out.size();
  tail_.assign(out.begin() + static_cast<std::ptrdiff_t>(align_down(out.size())), out.end());
  active_capacity_ = next_zeroed_bytes_;
  if (base) {
    bytes_since_base_ = out.size();
    stable_since_compact_ = false;
    ++stats_.compactions;
  } else {
    bytes_since_base_ += out.size();
  }
  next_ready_ = false;
  next_zeroed_bytes_ = 0;
  next_target_bytes_ = 0;
}

// Moves to the next segment (which must be ready, with nothing buffered): as a compacted base when compaction
// is due, else after sealing the active segment.
void Wal::roll() {
  const std::uint64_t index = active_index_ + 1;
  if (compaction_due()) {
    // No seal needed: once the base is in place every older segment is obsolete, and until then the active
    // segment is still the last one.
    install_next(index, true);
    for (std::uint64_t i = oldest_index_; i < index; ++i) {
      for (bool b : {false, true}) {
        if (::unlink((dir_ + "/" + segment_name(i, b)).c_str()) == 0) ++stats_.segments_deleted;
      }
    }
    // The deletions need not be durable: open() removes any segment below the newest base.
    oldest_index_ = index;
  } else {
    // The seal is durable before the next segment exists, so a segment with a successor always ends in one.
    Bytes seal;
    std::uint8_t where[8];
    store_u64_le(where, active_bytes_);
    frame_into(seal, where, kGroupStart | kSeal);
    BFT_ASSERT(seal.size() == kWalSealBytes);
    write_durable(fd_.get(), seal.data(), seal.size(), active_bytes_, true);
    install_next(index, false);
  }
  ++stats_.rolls;
}

// A segment open() must create: preallocated at once (first start, or after a sealed last segment), smaller
// than the later ones so that starting stays quick.
void Wal::create_segment_now(std::uint64_t index) {
  BFT_ASSERT(!next_fd_.valid());
  next_target_bytes_ = std::min(options_.segment_bytes_max, kWalFirstSegmentBytes);
  while (!prealloc_step(kWalFirstSegmentBytes)) {
  }
  install_next(index, false);
}

}  // namespace bftfs
