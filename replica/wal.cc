#include "replica/wal.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

#include "common/assert.h"
#include "common/log.h"
#include "replica/crc32c.h"

namespace bftfs {
namespace {

constexpr std::uint8_t kSegmentMagic[8] = {'B', 'F', 'T', 'W', 'A', 'L', '0', '1'};
constexpr std::uint32_t kGroupStart = 0x80000000u;
constexpr std::uint32_t kLengthMask = 0x7FFFFFFFu;
static_assert(kWalRecordBytesMax <= kLengthMask);

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

void fsync_or_die(int fd, const char* what) {
  if (::fsync(fd) != 0) {
    LOG_ERROR("", "wal: fsync of %s failed: %s; stopping (cannot persist)", what, std::strerror(errno));
    std::abort();
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
  if (fd_.valid() && dirty()) sync();
}

void Wal::frame_into(Bytes& out, std::span<const std::uint8_t> payload, bool group_start) const {
  BFT_ASSERT(!payload.empty());
  BFT_ASSERT(payload.size() <= kWalRecordBytesMax);
  const std::uint32_t lf = static_cast<std::uint32_t>(payload.size()) | (group_start ? kGroupStart : 0u);
  const std::size_t at = out.size();
  out.resize(at + kWalRecordHeaderBytes + payload.size());
  put_u32(out.data() + at, lf);
  put_u32(out.data() + at + 4, record_crc(salt_, lf, payload));
  std::memcpy(out.data() + at + kWalRecordHeaderBytes, payload.data(), payload.size());
}

void Wal::write_all(int fd, const std::uint8_t* data, std::size_t size) {
  std::size_t done = 0;
  while (done < size) {
    const ssize_t w = ::write(fd, data + done, size - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      LOG_ERROR("", "wal: write to %s failed: %s; stopping (cannot persist)", dir_.c_str(), std::strerror(errno));
      std::abort();
    }
    done += static_cast<std::size_t>(w);
  }
}

// Creates segment `index` with a fresh salt and makes its existence durable (file and directory entry)
// before any record goes into it. A base is created by compact() instead.
void Wal::start_segment(std::uint64_t index, bool base) {
  BFT_ASSERT(!base);
  const std::string path = dir_ + "/" + segment_name(index, false);
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) {
    LOG_ERROR("", "wal: cannot create %s: %s; stopping", path.c_str(), std::strerror(errno));
    std::abort();
  }
  salt_ = random_salt();
  std::uint8_t header[kWalSegmentHeaderBytes];
  make_segment_header(header, salt_);
  write_all(fd.get(), header, sizeof header);
  fsync_or_die(fd.get(), "new segment");
  fsync_or_die(dir_fd_.get(), "wal directory");
  fd_ = std::move(fd);
  active_index_ = index;
  active_bytes_ = kWalSegmentHeaderBytes;
  bytes_since_base_ += kWalSegmentHeaderBytes;
}

void Wal::append(const PersistRecord& record) {
  Bytes payload = encode_record(record);
  BFT_ASSERT(!payload.empty());
  BFT_ASSERT(payload.size() <= kWalRecordBytesMax);
  frame_into(buffer_, payload, buffer_.empty());
  ++stats_.records_appended;
  stats_.bytes_appended += kWalRecordHeaderBytes + payload.size();
  if (std::holds_alternative<StableRecord>(record)) stable_since_compact_ = true;
  track_live(record, std::move(payload));
}

// Keeps the encoded copy of every record recovery may still need (see the header), pruned at each stable
// checkpoint; compact() writes exactly these.
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
  if (!buffer_.empty()) {
    const std::uint64_t t0 = now_ns();
    write_all(fd_.get(), buffer_.data(), buffer_.size());
    if (options_.fsync && ::fdatasync(fd_.get()) != 0) {
      LOG_ERROR("", "wal: fdatasync failed: %s; stopping (cannot persist)", std::strerror(errno));
      std::abort();
    }
    const std::uint64_t dt = now_ns() - t0;
    ++stats_.syncs;
    stats_.sync_ns_total += dt;
    stats_.sync_ns_max = std::max(stats_.sync_ns_max, dt);
    active_bytes_ += buffer_.size();
    bytes_since_base_ += buffer_.size();
    buffer_.clear();
  }
  if (stable_since_compact_ && bytes_since_base_ >= options_.compact_bytes_min) {
    compact();
  } else if (active_bytes_ >= options_.segment_bytes_max) {
    start_segment(active_index_ + 1, false);
  }
}

void Wal::compact() {
  BFT_ASSERT(buffer_.empty());
  const std::uint64_t index = active_index_ + 1;
  const std::string final_path = dir_ + "/" + segment_name(index, true);
  const std::string tmp_path = final_path + ".tmp";
  UniqueFd fd(::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) {
    LOG_ERROR("", "wal: cannot create %s: %s; stopping", tmp_path.c_str(), std::strerror(errno));
    std::abort();
  }
  salt_ = random_salt();
  Bytes out(kWalSegmentHeaderBytes);
  make_segment_header(out.data(), salt_);
  bool first = true;
  for (const LiveEntry& e : live_) {
    frame_into(out, e.payload, first);
    first = false;
  }
  write_all(fd.get(), out.data(), out.size());
  fsync_or_die(fd.get(), "compacted base");
  if (::rename(tmp_path.c_str(), final_path.c_str()) != 0) {
    LOG_ERROR("", "wal: rename %s failed: %s; stopping", tmp_path.c_str(), std::strerror(errno));
    std::abort();
  }
  fsync_or_die(dir_fd_.get(), "wal directory");
  // The base is durable under its final name: every older segment is now obsolete.
  for (std::uint64_t i = oldest_index_; i < index; ++i) {
    for (bool base : {false, true}) {
      const std::string p = dir_ + "/" + segment_name(i, base);
      if (::unlink(p.c_str()) == 0) ++stats_.segments_deleted;
    }
  }
  fsync_or_die(dir_fd_.get(), "wal directory");
  fd_ = std::move(fd);
  active_index_ = index;
  active_bytes_ = out.size();
  oldest_index_ = index;
  bytes_since_base_ = out.size();
  stable_since_compact_ = false;
  ++stats_.compactions;
}

std::string Wal::open(const std::string& dir, const WalOptions& options, std::unique_ptr<Wal>& out,
                      std::vector<PersistRecord>& records) {
  out.reset();
  records.clear();
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return errno_text("cannot create directory", dir);
  std::unique_ptr<Wal> wal(new Wal(dir, options));
  wal->dir_fd_.reset(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!wal->dir_fd_.valid()) return errno_text("cannot open directory", dir);

  // List the segments; drop temporaries of an interrupted compaction.
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
  std::uint64_t expect = segments.empty() ? 0 : segments.begin()->first;
  for (const auto& [index, base] : segments) {
    if (index != expect) return "wal " + dir + ": segment " + segment_name(expect, false) + " is missing";
    ++expect;
  }

  // Replay.
  std::uint64_t last_index = 0;
  std::uint64_t last_valid_end = 0;
  bool have_last = false;
  bool last_needs_header = false;
  for (auto it = segments.begin(); it != segments.end(); ++it) {
    const std::uint64_t index = it->first;
    const bool is_last = std::next(it) == segments.end();
    const std::string path = dir + "/" + segment_name(index, it->second);
    Bytes data;
    std::string err;
    if (!read_file(path, data, err)) return err;
    last_index = index;
    have_last = is_last;
    if (data.size() < kWalSegmentHeaderBytes) {
      // A segment whose creation was interrupted (its header was never synced) holds no records.
      if (!is_last) return "wal " + path + ": truncated segment header";
      last_needs_header = true;
      last_valid_end = 0;
      wal->stats_.torn_tail_bytes += data.size();
      break;
    }
    if (std::memcmp(data.data(), kSegmentMagic, 8) != 0) return "wal " + path + ": bad segment magic";
    if (get_u32(data.data() + 16) != crc32c(0, std::span<const std::uint8_t>(data.data(), 16)) ||
        get_u32(data.data() + 20) != 0) {
      return "wal " + path + ": corrupt segment header";
    }
    const std::uint64_t salt = get_u64(data.data() + 8);

    // One record at `off`: returns its total size, or 0 if it is not a valid record.
    auto valid_record_at = [&](std::size_t off, bool want_group_start) -> std::size_t {
      if (data.size() - off < kWalRecordHeaderBytes) return 0;
      const std::uint32_t lf = get_u32(data.data() + off);
      const std::uint32_t len = lf & kLengthMask;
      if (want_group_start && (lf & kGroupStart) == 0) return 0;
      if (len == 0 || len > kWalRecordBytesMax) return 0;
      if (len > data.size() - off - kWalRecordHeaderBytes) return 0;
      const std::span<const std::uint8_t> payload(data.data() + off + kWalRecordHeaderBytes, len);
      if (record_crc(salt, lf, payload) != get_u32(data.data() + off + 4)) return 0;
      return kWalRecordHeaderBytes + len;
    };

    std::size_t off = kWalSegmentHeaderBytes;
    while (off < data.size()) {
      const std::size_t size = valid_record_at(off, false);
      if (size == 0) break;
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
    if (off < data.size()) {
      if (!is_last) {
        return "wal " + path + ": corrupt record at offset " + std::to_string(off) + " in a sealed segment";
      }
      // A later group that is intact proves this group was synced: then this is corruption, not a torn write.
      for (std::size_t y = off + 1; y + kWalRecordHeaderBytes <= data.size(); ++y) {
        if (valid_record_at(y, true) != 0) {
          return "wal " + path + ": corrupt record at offset " + std::to_string(off) +
                 " followed by a valid group at offset " + std::to_string(y);
        }
      }
      wal->stats_.torn_tail_bytes += data.size() - off;
      LOG_WARN("", "wal %s: torn tail of %zu bytes at offset %zu truncated", path.c_str(), data.size() - off, off);
    }
    last_valid_end = off;
    wal->salt_ = salt;
    wal->bytes_since_base_ += off;
  }
  wal->stats_.replayed_records = records.size();
  wal->oldest_index_ = segments.empty() ? 0 : segments.begin()->first;

  if (!have_last) {
    wal->start_segment(segments.empty() ? 1 : last_index + 1, false);
    if (segments.empty()) wal->oldest_index_ = 1;
  } else if (last_needs_header) {
    // Recreate the interrupted segment in place.
    wal->start_segment(last_index, false);
  } else {
    const bool base = segments.rbegin()->second;
    const std::string path = dir + "/" + segment_name(last_index, base);
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd.valid()) return errno_text("cannot open for append", path);
    if (::ftruncate(fd.get(), static_cast<off_t>(last_valid_end)) != 0) return errno_text("cannot truncate", path);
    if (::lseek(fd.get(), static_cast<off_t>(last_valid_end), SEEK_SET) < 0) return errno_text("cannot seek", path);
    if (::fsync(fd.get()) != 0) return errno_text("cannot fsync", path);
    wal->fd_ = std::move(fd);
    wal->active_index_ = last_index;
    wal->active_bytes_ = last_valid_end;
  }
  // A stable record replayed may make compaction due at the first sync.
  for (const auto& r : records) {
    if (std::holds_alternative<StableRecord>(r)) wal->stable_since_compact_ = true;
  }
  out = std::move(wal);
  return "";
}

}  // namespace bftfs
