// Wal::open: finding the segments of a log, replaying them, and leaving the log ready to append where the
// records end. The rules (which ends are normal, which are torn tails, which are corruption) are in wal.h,
// "Replay"; each step below names the rule it applies.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>

#include "common/codec.h"
#include "common/log.h"
#include "storage/crc32c.h"
#include "storage/wal.h"
#include "storage/wal_format.h"

namespace bftfs {

using namespace wal_format;

namespace {

std::string errno_text(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
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
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else {
      return false;
    }
    index = (index << 4) | static_cast<std::uint64_t>(digit);
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

// One segment file as read at open, with what its header says.
struct SegmentImage {
  std::string path;
  Bytes data;
  int version = 0;  // 1 or 2 (the magic)
  std::uint64_t salt = 0;

  // One record (or seal) at `off`: returns its total size, or 0 if it is not a valid one.
  std::size_t valid_record_at(std::size_t off, bool want_group_start, bool& seal) const {
    if (data.size() - off < kWalRecordHeaderBytes) return 0;
    const std::uint32_t length_and_flags = load_u32_le(data.data() + off);
    const std::uint32_t len = length_and_flags & kLengthMask;
    seal = (length_and_flags & kSeal) != 0;
    if (seal && (version == 1 || (length_and_flags & kGroupStart) == 0 || len != 8)) return 0;
    if (want_group_start && (length_and_flags & kGroupStart) == 0) return 0;
    if (len == 0 || len > kWalRecordBytesMax) return 0;
    if (len > data.size() - off - kWalRecordHeaderBytes) return 0;
    const std::span<const std::uint8_t> payload(data.data() + off + kWalRecordHeaderBytes, len);
    if (record_crc(salt, length_and_flags, payload) != load_u32_le(data.data() + off + 4)) return 0;
    if (seal && load_u64_le(payload.data()) != off) return 0;  // a seal names its own offset
    return kWalRecordHeaderBytes + len;
  }

  // A valid group start (or seal) anywhere in (off, end): proof that a group was written after the one at off.
  std::size_t later_group_in(std::size_t off, std::size_t end) const {
    for (std::size_t y = off + 1; y < end && y + kWalRecordHeaderBytes <= data.size(); ++y) {
      bool seal = false;
      if (valid_record_at(y, true, seal) != 0) return y;
    }
    return 0;
  }
};

// Reads the segment at `path` into `seg` and checks its header: a known magic, and a header checksum that
// holds (a damaged salt would otherwise make every record look torn).
std::string read_segment(const std::string& path, SegmentImage& seg) {
  seg.path = path;
  std::string err;
  if (!read_file(path, seg.data, err)) return err;
  const Bytes& data = seg.data;
  if (data.size() < kWalSegmentHeaderBytes) return "wal " + path + ": truncated segment header";
  if (std::memcmp(data.data(), kSegmentMagic, 8) == 0) {
    seg.version = 2;
  } else if (std::memcmp(data.data(), kSegmentMagicV1, 8) == 0) {
    seg.version = 1;
  } else {
    return "wal " + path + ": bad segment magic";
  }
  if (load_u32_le(data.data() + 16) != crc32c(0, std::span<const std::uint8_t>(data.data(), 16)) ||
      load_u32_le(data.data() + 20) != 0) {
    return "wal " + path + ": corrupt segment header";
  }
  seg.salt = load_u64_le(data.data() + 8);
  return "";
}

// Judges what follows the last valid record of a segment (at `off`; `sealed` if that was a seal), by the rules
// of wal.h. Returns an error for corruption; otherwise sets `torn` to the end of a torn tail after `off`, or 0
// when the segment ends normally (a seal, zeros, or a format-1 segment's end of file).
std::string judge_segment_end(const SegmentImage& seg, std::size_t off, bool sealed, bool is_last, std::size_t& torn) {
  const Bytes& data = seg.data;
  const std::string& path = seg.path;
  const std::string at = " at offset " + std::to_string(off);
  torn = 0;
  if (seg.version == 1) {
    // Format 1 has no preallocation and no seal: a segment ends at the end of its file.
    if (off < data.size()) {
      if (!is_last) return "wal " + path + ": corrupt record" + at + " in a sealed segment";
      if (const std::size_t y = seg.later_group_in(off, data.size()); y != 0) {
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
    if (const std::size_t y = seg.later_group_in(off, nz); y != 0) {
      return "wal " + path + ": corrupt record" + at + " followed by a valid group at offset " + std::to_string(y);
    }
    torn = nz;
  }
  // Otherwise only zeros follow: the normal end of the log in a preallocated segment.
  return "";
}

}  // namespace

// The state of one open(): the segments found, and what replay learned about the last one (which decides
// where appending continues). Each step returns "" or the error open() reports.
class Wal::Opener {
 public:
  Opener(Wal& wal, std::vector<PersistRecord>& records) : wal_(wal), dir_(wal.dir_), records_(records) {}

  // Lists the segments and drops temporaries (a next segment being preallocated, or a base of an older bftfs).
  std::string list_segments() {
    std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir_.c_str()), &::closedir);
    if (d == nullptr) return errno_text("cannot list", dir_);
    std::vector<std::string> tmps;
    while (dirent* ent = ::readdir(d.get())) {
      const std::string name = ent->d_name;
      std::uint64_t index = 0;
      bool base = false;
      if (name.size() > 4 && name.ends_with(".tmp")) {
        tmps.push_back(name);
      } else if (parse_segment_name(name, index, base)) {
        if (segments_.count(index) != 0) {
          return "wal " + dir_ + ": segment " + std::to_string(index) + " exists as both .seg and .base";
        }
        segments_[index] = base;
      }
    }
    d.reset();
    for (const auto& t : tmps) ::unlink((dir_ + "/" + t).c_str());
    return "";
  }

  // Only the newest base and what follows it count: older segments are deleted.
  void drop_segments_below_newest_base() {
    std::uint64_t first = 0;
    for (const auto& [index, base] : segments_) {
      if (base) first = index;
    }
    for (auto it = segments_.begin(); it != segments_.end();) {
      if (it->first < first) {
        ::unlink((dir_ + "/" + segment_name(it->first, it->second)).c_str());
        ++wal_.stats_.segments_deleted;
        it = segments_.erase(it);
      } else {
        ++it;
      }
    }
  }

  // A last segment shorter than a header never held a record: its creation by an older bftfs (which created
  // segments in place; this one renames them into place with a durable header) was interrupted. It is removed
  // and the log continues after the segment before it.
  std::string drop_interrupted_last_segment() {
    if (segments_.empty()) return "";
    const auto last = std::prev(segments_.end());
    const std::string path = dir_ + "/" + segment_name(last->first, last->second);
    struct stat st{};
    if (::stat(path.c_str(), &st) != 0) return errno_text("cannot stat", path);
    if (static_cast<std::uint64_t>(st.st_size) >= kWalSegmentHeaderBytes) return "";
    if (last->second) return "wal " + path + ": truncated base segment";
    first_index_ = last->first;
    wal_.stats_.torn_tail_bytes += static_cast<std::uint64_t>(st.st_size);
    if (::unlink(path.c_str()) != 0) return errno_text("cannot remove", path);
    segments_.erase(last);
    return "";
  }

  std::string check_no_gaps() const {
    std::uint64_t expect = segments_.empty() ? 0 : segments_.begin()->first;
    for (const auto& [index, base] : segments_) {
      if (index != expect) return "wal " + dir_ + ": segment " + segment_name(expect, false) + " is missing";
      ++expect;
    }
    return "";
  }

  // Replays every segment in index order.
  std::string replay_segments() {
    for (auto it = segments_.begin(); it != segments_.end(); ++it) {
      if (std::string err = replay_segment(it->first, it->second, std::next(it) == segments_.end()); !err.empty()) {
        return err;
      }
    }
    wal_.stats_.replayed_records = records_.size();
    wal_.oldest_index_ = segments_.empty() ? first_index_ : segments_.begin()->first;
    return "";
  }

  // Leaves the log ready to append: in the last segment after its records, once a torn tail there is cleared;
  // or in a new segment (a new log, or after a sealed or format-1 last segment).
  std::string resume_appending() {
    if (segments_.empty()) {
      wal_.create_segment_now(first_index_);
      return "";
    }
    const std::string path = dir_ + "/" + segment_name(last_.index, segments_.rbegin()->second);
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd.valid()) return errno_text("cannot open for writing", path);
    if (last_.torn_end != 0 && last_.version == 1) {
      // Format 1 is never appended to again, so its torn tail is cut off (it ends at the end of its file).
      if (::ftruncate(fd.get(), static_cast<off_t>(last_.end)) != 0) return errno_text("cannot truncate", path);
      if (::fsync(fd.get()) != 0) return errno_text("cannot fsync", path);
    } else if (last_.torn_end != 0) {
      // Zeros again, durably, before anything is appended: no byte of the torn group may survive behind a
      // later, shorter group, where it could line up as a record.
      write_zeros_or_die(fd.get(), last_.end, last_.torn_end - last_.end, path);
      if (::fdatasync(fd.get()) != 0) return errno_text("cannot fdatasync", path);
    }
    if (last_.complete) {
      wal_.create_segment_now(last_.index + 1);
      return "";
    }
    wal_.fd_ = std::move(fd);
    wal_.active_index_ = last_.index;
    wal_.active_bytes_ = last_.end;
    wal_.active_capacity_ = last_.size;
    wal_.salt_ = last_.salt;
    wal_.tail_ = std::move(last_.tail);
    wal_.open_direct(path);
    return "";
  }

 private:
  // Reads one segment's records into records_ (and the log's live set), judges how it ends, and remembers what
  // appending needs to know should it be the last one.
  std::string replay_segment(std::uint64_t index, bool base, bool is_last) {
    SegmentImage seg;
    if (std::string err = read_segment(dir_ + "/" + segment_name(index, base), seg); !err.empty()) return err;
    std::size_t off = kWalSegmentHeaderBytes;
    bool sealed = false;
    if (std::string err = replay_records(seg, off, sealed); !err.empty()) return err;
    std::size_t torn = 0;
    if (std::string err = judge_segment_end(seg, off, sealed, is_last, torn); !err.empty()) return err;
    if (torn != 0) {
      wal_.stats_.torn_tail_bytes += torn - off;
      const std::string at = " at offset " + std::to_string(off);
      LOG_WARN("", "wal %s: torn tail of %zu bytes%s removed", seg.path.c_str(), torn - off, at.c_str());
    }
    wal_.bytes_since_base_ += off;
    last_.index = index;
    last_.complete = sealed || seg.version == 1;
    last_.end = off;
    last_.tail.assign(seg.data.begin() + static_cast<std::ptrdiff_t>(align_down(off)),
                      seg.data.begin() + static_cast<std::ptrdiff_t>(off));
    last_.torn_end = torn;
    last_.size = seg.data.size();
    last_.salt = seg.salt;
    last_.version = seg.version;
    return "";
  }

  // Reads records from `off` until the first one that is not valid, or a seal (then `sealed`); `off` ends
  // after the last valid record. A record whose checksum holds but that does not decode is corruption.
  std::string replay_records(const SegmentImage& seg, std::size_t& off, bool& sealed) {
    while (off < seg.data.size()) {
      bool seal = false;
      const std::size_t size = seg.valid_record_at(off, false, seal);
      if (size == 0) break;
      if (seal) {
        sealed = true;
        break;
      }
      PersistRecord rec;
      const std::span<const std::uint8_t> payload(seg.data.data() + off + kWalRecordHeaderBytes,
                                                  size - kWalRecordHeaderBytes);
      if (!decode_record(payload, rec)) {
        return "wal " + seg.path + ": record at offset " + std::to_string(off) +
               " has a valid checksum but does not decode";
      }
      wal_.track_live(rec, Bytes(payload.begin(), payload.end()));
      records_.push_back(std::move(rec));
      off += size;
    }
    return "";
  }

  // What replay learned about the last segment read.
  struct LastSegment {
    std::uint64_t index = 0;
    bool complete = false;    // sealed, or format 1: continue in a new segment
    std::size_t end = 0;      // end of its records
    std::size_t torn_end = 0; // end of a torn tail after `end` (0: none)
    std::uint64_t size = 0;
    std::uint64_t salt = 0;
    int version = 0;
    Bytes tail;  // its bytes from the block boundary at or below `end` up to `end` (Wal::tail_)
  };

  Wal& wal_;
  const std::string& dir_;
  std::vector<PersistRecord>& records_;
  std::map<std::uint64_t, bool> segments_;  // index -> is base
  std::uint64_t first_index_ = 1;           // of a new log
  LastSegment last_;
};

std::string Wal::open(const std::string& dir, const WalOptions& options, std::unique_ptr<Wal>& out,
                      std::vector<PersistRecord>& records) {
  out.reset();
  records.clear();
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return errno_text("cannot create directory", dir);
  std::unique_ptr<Wal> wal(new Wal(dir, options));
  wal->dir_fd_.reset(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!wal->dir_fd_.valid()) return errno_text("cannot open directory", dir);

  Opener opener(*wal, records);
  if (std::string err = opener.list_segments(); !err.empty()) return err;
  opener.drop_segments_below_newest_base();
  if (std::string err = opener.drop_interrupted_last_segment(); !err.empty()) return err;
  if (std::string err = opener.check_no_gaps(); !err.empty()) return err;
  if (std::string err = opener.replay_segments(); !err.empty()) return err;
  if (std::string err = opener.resume_appending(); !err.empty()) return err;
  // A stable record replayed may make compaction due at the first maintain().
  for (const auto& r : records) {
    if (std::holds_alternative<StableRecord>(r)) wal->stable_since_compact_ = true;
  }
  out = std::move(wal);
  return "";
}

}  // namespace bftfs
