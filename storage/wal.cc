#include "storage/wal.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>

#include "common/assert.h"
#include "common/log.h"
#include "storage/crc32c.h"

namespace bftfs {
namespace {

constexpr std::uint8_t kSegmentMagicV1[8] = {'B', 'F', 'T', 'W', 'A', 'L', '0', '1'};
constexpr std::uint8_t kSegmentMagic[8] = {'B', 'F', 'T', 'W', 'A', 'L', '0', '2'};
constexpr std::uint32_t kGroupStart = 0x80000000u;
constexpr std::uint32_t kSeal = 0x40000000u;
constexpr std::uint32_t kLengthMask = 0x3FFFFFFFu;
static_assert(kWalRecordBytesMax <= kLengthMask);
static_assert(kWalSealBytes == kWalRecordHeaderBytes + 8);

// The next segment while it is being preallocated. The name ends in .tmp, so open() deletes a leftover one:
// after a crash nothing says how much of it reached the disk, and it holds no records.
constexpr char kNextSegmentName[] = "next.prealloc.tmp";

// The most zeros one maintain() step writes, whatever the pace asks for.
constexpr std::uint64_t kPreallocStepBytesMax = 256 << 10;

// write_group() keeps its aligned staging buffer for groups up to this size; a larger group (a bulk file write)
// gets a buffer of its own that is freed after the write, so one burst does not pin megabytes for good.
constexpr std::size_t kDirectBufKeepBytes = 1 << 20;

std::size_t align_down(std::size_t v) { return v - v % kWalDirectAlign; }
std::size_t align_up(std::size_t v) { return align_down(v + kWalDirectAlign - 1); }

// Zeros for preallocation and for clearing a torn tail: written from here in pieces of this size.
constexpr std::size_t kZeroBlockBytes = 64 << 10;
alignas(4096) constexpr std::uint8_t kZeros[kZeroBlockBytes] = {};

std::uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

void put_u32(std::uint8_t* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
void put_u64(std::uint8_t* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
std::uint32_t get_u32(const std::uint8_t* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(p[i]) << (8 * i);
  return v;
}
std::uint64_t get_u64(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return v;
}

std::uint32_t record_crc(std::uint64_t salt, std::uint32_t length_and_flags, std::span<const std::uint8_t> payload) {
  std::uint8_t head[12];
  put_u64(head, salt);
  put_u32(head + 8, length_and_flags);
  return crc32c(crc32c(0, head), payload);
}

std::string errno_text(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

std::string segment_name(std::uint64_t index, bool base) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx.%s", static_cast<unsigned long long>(index), base ? "base" : "seg");
  return buf;
}

// Parses "<16 hex>.seg" / "<16 hex>.base". Anything else in the directory is not ours and is left alone.
bool parse_segment_name(const std::string& name, std::uint64_t& index, bool& base) {
  if (name.size() < 17 || name[16] != '.') return false;
  const std::string ext = name.substr(17);
  if (ext == "seg") {
    base = false;
  } else if (ext == "base") {
    base = true;
  } else {
    return false;
  }
  index = 0;
  for (int i = 0; i < 16; ++i) {
    const char c = name[static_cast<std::size_t>(i)];
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return false;
    }
    index = (index << 4) | static_cast<std::uint64_t>(d);
  }
  return true;
}

bool read_file(const std::string& path, Bytes& out, std::string& err) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    err = errno_text("cannot open", path);
    return false;
  }
  struct stat st{};
  if (fstat(fd.get(), &st) != 0) {
    err = errno_text("cannot stat", path);
    return false;
  }
  out.resize(static_cast<std::size_t>(st.st_size));
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t r = ::read(fd.get(), out.data() + done, out.size() - done);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      err = errno_text("cannot read", path);
      return false;
    }
    if (r == 0) break;
    done += static_cast<std::size_t>(r);
  }
  out.resize(done);
  return true;
}

[[noreturn]] void die(const char* what, const std::string& where) {
  LOG_ERROR("", "wal: %s %s failed: %s; stopping (cannot persist)", what, where.c_str(), std::strerror(errno));
  std::abort();
}

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

// Writes `size` zero bytes at `offset` (not yet durable).
void write_zeros_or_die(int fd, std::uint64_t offset, std::uint64_t size, const std::string& what) {
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
  put_u64(out + 8, salt);
  put_u32(out + 16, crc32c(0, std::span<const std::uint8_t>(out, 16)));
  put_u32(out + 20, 0);
}

// Offset just past the last non-zero byte of data[from, size), or `from` if those bytes are all zero.
std::size_t nonzero_end(const Bytes& data, std::size_t from) {
  std::size_t end = data.size();
  while (end >= from + 8) {
    std::uint64_t w;
    std::memcpy(&w, data.data() + end - 8, 8);
    if (w != 0) break;
    end -= 8;
  }
  while (end > from && data[end - 1] == 0) --end;
  return end;
}

enum class LiveKind : std::uint8_t { kView, kPrePrepare, kPrepared, kCommitted, kCheckpoint, kStable };

}  // namespace

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
  const std::uint32_t lf = static_cast<std::uint32_t>(payload.size()) | flags;
  const std::size_t at = out.size();
  out.resize(at + kWalRecordHeaderBytes + payload.size());
  put_u32(out.data() + at, lf);
  put_u32(out.data() + at + 4, record_crc(salt_, lf, payload));
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
  const std::uint64_t t0 = now_ns();
  g.wrote_direct = g.direct_fd >= 0 && g.durable && direct_ok_ && write_direct(g);
  if (!g.wrote_direct) write_durable(g.fd, g.bytes.data(), g.bytes.size(), g.offset, g.durable);
  g.write_ns = now_ns() - t0;
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
  const std::uint64_t t0 = now_ns();
  if (roll_due && next_ready_ && !dirty() && !in_flight_) {
    roll();
    stats_.roll_ns_max = std::max(stats_.roll_ns_max, now_ns() - t0);
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
  stats_.prealloc_ns_max = std::max(stats_.prealloc_ns_max, now_ns() - t0);
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
    put_u64(where, active_bytes_);
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

std::string Wal::open(const std::string& dir, const WalOptions& options, std::unique_ptr<Wal>& out,
                      std::vector<PersistRecord>& records) {
  out.reset();
  records.clear();
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return errno_text("cannot create directory", dir);
  std::unique_ptr<Wal> wal(new Wal(dir, options));
  wal->dir_fd_.reset(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!wal->dir_fd_.valid()) return errno_text("cannot open directory", dir);

  // List the segments; drop temporaries (a next segment being preallocated, or a base of an older bftfs).
  std::map<std::uint64_t, bool> segments;  // index -> is base
  {
    std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), &::closedir);
    if (d == nullptr) return errno_text("cannot list", dir);
    std::vector<std::string> tmps;
    while (dirent* ent = ::readdir(d.get())) {
      const std::string name = ent->d_name;
      std::uint64_t index = 0;
      bool base = false;
      if (name.size() > 4 && name.ends_with(".tmp")) {
        tmps.push_back(name);
      } else if (parse_segment_name(name, index, base)) {
        if (segments.count(index) != 0) {
          return "wal " + dir + ": segment " + std::to_string(index) + " exists as both .seg and .base";
        }
        segments[index] = base;
      }
    }
    d.reset();
    for (const auto& t : tmps) ::unlink((dir + "/" + t).c_str());
  }
  // Only the newest base and what follows it count.
  std::uint64_t first = 0;
  for (const auto& [index, base] : segments) {
    if (base) first = index;
  }
  for (auto it = segments.begin(); it != segments.end();) {
    if (it->first < first) {
      ::unlink((dir + "/" + segment_name(it->first, it->second)).c_str());
      ++wal->stats_.segments_deleted;
      it = segments.erase(it);
    } else {
      ++it;
    }
  }
  // A last segment shorter than a header never held a record: its creation by an older bftfs (which created
  // segments in place; this one renames them into place with a durable header) was interrupted. It is removed
  // and the log continues after the segment before it.
  std::uint64_t first_index = 1;  // of a new log
  if (!segments.empty()) {
    const auto last = std::prev(segments.end());
    const std::string path = dir + "/" + segment_name(last->first, last->second);
    struct stat st{};
    if (::stat(path.c_str(), &st) != 0) return errno_text("cannot stat", path);
    if (static_cast<std::uint64_t>(st.st_size) < kWalSegmentHeaderBytes) {
      if (last->second) return "wal " + path + ": truncated base segment";
      first_index = last->first;
      wal->stats_.torn_tail_bytes += static_cast<std::uint64_t>(st.st_size);
      if (::unlink(path.c_str()) != 0) return errno_text("cannot remove", path);
      segments.erase(last);
    }
  }
  std::uint64_t expect = segments.empty() ? 0 : segments.begin()->first;
  for (const auto& [index, base] : segments) {
    if (index != expect) return "wal " + dir + ": segment " + segment_name(expect, false) + " is missing";
    ++expect;
  }

  // Replay. What is learned about the last segment decides below where appending continues.
  std::uint64_t last_index = 0;
  bool last_complete = false;      // sealed, or format 1: continue in a new segment
  std::size_t last_end = 0;        // end of its records
  std::size_t torn_end = 0;        // end of a torn tail after last_end (0: none)
  std::uint64_t last_size = 0;
  std::uint64_t last_salt = 0;
  int last_version = 0;
  Bytes last_tail;  // its bytes from the block boundary at or below last_end up to last_end (Wal::tail_)
  for (auto it = segments.begin(); it != segments.end(); ++it) {
    const std::uint64_t index = it->first;
    const bool is_last = std::next(it) == segments.end();
    const std::string path = dir + "/" + segment_name(index, it->second);
    Bytes data;
    std::string err;
    if (!read_file(path, data, err)) return err;
    last_index = index;
    if (data.size() < kWalSegmentHeaderBytes) return "wal " + path + ": truncated segment header";
    int version = 0;
    if (std::memcmp(data.data(), kSegmentMagic, 8) == 0) {
      version = 2;
    } else if (std::memcmp(data.data(), kSegmentMagicV1, 8) == 0) {
      version = 1;
    } else {
      return "wal " + path + ": bad segment magic";
    }
    if (get_u32(data.data() + 16) != crc32c(0, std::span<const std::uint8_t>(data.data(), 16)) ||
        get_u32(data.data() + 20) != 0) {
      return "wal " + path + ": corrupt segment header";
    }
    const std::uint64_t salt = get_u64(data.data() + 8);

    // One record (or seal) at `off`: returns its total size, or 0 if it is not a valid one.
    auto valid_record_at = [&](std::size_t off, bool want_group_start, bool& seal) -> std::size_t {
      if (data.size() - off < kWalRecordHeaderBytes) return 0;
      const std::uint32_t lf = get_u32(data.data() + off);
      const std::uint32_t len = lf & kLengthMask;
      seal = (lf & kSeal) != 0;
      if (seal && (version == 1 || (lf & kGroupStart) == 0 || len != 8)) return 0;
      if (want_group_start && (lf & kGroupStart) == 0) return 0;
      if (len == 0 || len > kWalRecordBytesMax) return 0;
      if (len > data.size() - off - kWalRecordHeaderBytes) return 0;
      const std::span<const std::uint8_t> payload(data.data() + off + kWalRecordHeaderBytes, len);
      if (record_crc(salt, lf, payload) != get_u32(data.data() + off + 4)) return 0;
      if (seal && get_u64(payload.data()) != off) return 0;  // a seal names its own offset
      return kWalRecordHeaderBytes + len;
    };
    // A valid group start (or seal) anywhere in (off, end): proof that a group was written after the one at off.
    auto later_group_in = [&](std::size_t off, std::size_t end) -> std::size_t {
      for (std::size_t y = off + 1; y < end && y + kWalRecordHeaderBytes <= data.size(); ++y) {
        bool seal = false;
        if (valid_record_at(y, true, seal) != 0) return y;
      }
      return 0;
    };

    std::size_t off = kWalSegmentHeaderBytes;
    bool sealed = false;
    while (off < data.size()) {
      bool seal = false;
      const std::size_t size = valid_record_at(off, false, seal);
      if (size == 0) break;
      if (seal) {
        sealed = true;
        break;
      }
      PersistRecord rec;
      const std::span<const std::uint8_t> payload(data.data() + off + kWalRecordHeaderBytes,
                                                  size - kWalRecordHeaderBytes);
      if (!decode_record(payload, rec)) {
        return "wal " + path + ": record at offset " + std::to_string(off) +
               " has a valid checksum but does not decode";
      }
      wal->track_live(rec, Bytes(payload.begin(), payload.end()));
      records.push_back(std::move(rec));
      off += size;
    }
    const std::string at = " at offset " + std::to_string(off);
    std::size_t torn = 0;  // end of a torn tail after off, if any
    if (version == 1) {
      // Format 1 has no preallocation and no seal: a segment ends at the end of its file.
      if (off < data.size()) {
        if (!is_last) return "wal " + path + ": corrupt record" + at + " in a sealed segment";
        if (const std::size_t y = later_group_in(off, data.size()); y != 0) {
          return "wal " + path + ": corrupt record" + at + " followed by a valid group at offset " + std::to_string(y);
        }
        torn = data.size();
      }
    } else if (sealed) {
      const std::size_t rest = off + kWalSealBytes;
      if (const std::size_t nz = nonzero_end(data, rest); nz > rest) {
        return "wal " + path + ": non-zero bytes after the seal at offset " + std::to_string(off) + " (up to offset " +
               std::to_string(nz) + ")";
      }
    } else if (!is_last) {
      return "wal " + path + ": corrupt record" + at + " in a sealed segment (a later segment exists, so this one " +
             "must end with its seal)";
    } else if (const std::size_t nz = nonzero_end(data, off); nz > off) {
      if (const std::size_t y = later_group_in(off, nz); y != 0) {
        return "wal " + path + ": corrupt record" + at + " followed by a valid group at offset " + std::to_string(y);
      }
      torn = nz;
    }
    // Otherwise only zeros follow: the normal end of the log in a preallocated segment.
    if (torn != 0) {
      wal->stats_.torn_tail_bytes += torn - off;
      LOG_WARN("", "wal %s: torn tail of %zu bytes%s removed", path.c_str(), torn - off, at.c_str());
    }
    wal->bytes_since_base_ += off;
    last_complete = sealed || version == 1;
    last_end = off;
    last_tail.assign(data.begin() + static_cast<std::ptrdiff_t>(align_down(off)),
                     data.begin() + static_cast<std::ptrdiff_t>(off));
    torn_end = torn;
    last_size = data.size();
    last_salt = salt;
    last_version = version;
  }
  wal->stats_.replayed_records = records.size();
  wal->oldest_index_ = segments.empty() ? first_index : segments.begin()->first;

  if (segments.empty()) {
    wal->create_segment_now(first_index);
  } else {
    const std::string path = dir + "/" + segment_name(last_index, segments.rbegin()->second);
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd.valid()) return errno_text("cannot open for writing", path);
    if (torn_end != 0 && last_version == 1) {
      // Format 1 is never appended to again, so its torn tail is cut off (it ends at the end of its file).
      if (::ftruncate(fd.get(), static_cast<off_t>(last_end)) != 0) return errno_text("cannot truncate", path);
      if (::fsync(fd.get()) != 0) return errno_text("cannot fsync", path);
    } else if (torn_end != 0) {
      // Zeros again, durably, before anything is appended: no byte of the torn group may survive behind a
      // later, shorter group, where it could line up as a record.
      write_zeros_or_die(fd.get(), last_end, torn_end - last_end, path);
      if (::fdatasync(fd.get()) != 0) return errno_text("cannot fdatasync", path);
    }
    if (last_complete) {
      wal->create_segment_now(last_index + 1);
    } else {
      wal->fd_ = std::move(fd);
      wal->active_index_ = last_index;
      wal->active_bytes_ = last_end;
      wal->active_capacity_ = last_size;
      wal->salt_ = last_salt;
      wal->tail_ = std::move(last_tail);
      wal->open_direct(path);
    }
  }
  // A stable record replayed may make compaction due at the first maintain().
  for (const auto& r : records) {
    if (std::holds_alternative<StableRecord>(r)) wal->stable_since_compact_ = true;
  }
  out = std::move(wal);
  return "";
}

}  // namespace bftfs
