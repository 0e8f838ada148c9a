// Between FUSE's types and the file service's wire types: errno values, file types, times, struct stat, and
// the caller's credentials (client/fuse_client_impl.h declares them).
#include "client/fuse_client_impl.h"

#include <algorithm>
#include <cerrno>
#include <limits>
#include <utility>
#include <vector>

#include "common/assert.h"

namespace bftfs::client {

// ---- errno: one table from the wire's Linux errnos and our own failures to what FUSE replies ----
// The wire carries Linux errno values (services/fs/fs_codec.h err::); this daemon runs on Linux, so a valid
// one passes through unchanged. Anything outside the range a Linux errno can take is a broken result: EIO.
int to_host_errno(std::uint32_t wire) {
  if (wire == 0 || wire > 4095) return EIO;
  return static_cast<int>(wire);
}

mode_t type_bits(fs::FileType t) {
  switch (t) {
    case fs::FileType::kRegular: return S_IFREG;
    case fs::FileType::kDirectory: return S_IFDIR;
    case fs::FileType::kSymlink: return S_IFLNK;
    case fs::FileType::kFifo: return S_IFIFO;
    case fs::FileType::kSocket: return S_IFSOCK;
    case fs::FileType::kCharDevice: return S_IFCHR;
    case fs::FileType::kBlockDevice: return S_IFBLK;
  }
  return S_IFREG;
}

// Times on the wire are nanoseconds since the epoch as a signed 64-bit number in two's complement
// (docs/FILESERVICE.md, Attr): 1677-09-21 .. 2262-04-11. The service stores them unchanged; the conversions
// both ways are here. A kernel time outside that range is clamped to its end (as a local file system clamps
// to its own s_time_min/max), never wrapped: a file from 1600 or 2600 must not come back as 1970 or 2015.
constexpr std::int64_t kNsPerSec = 1000000000;

timespec wire_to_timespec(std::uint64_t wire) {
  const auto v = static_cast<std::int64_t>(wire);  // two's complement by definition of the wire format
  std::int64_t sec = v / kNsPerSec;
  std::int64_t nsec = v % kNsPerSec;
  if (nsec < 0) {  // floor, so that tv_nsec is in [0, 1e9) also before 1970
    nsec += kNsPerSec;
    sec -= 1;
  }
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(sec);
  ts.tv_nsec = static_cast<long>(nsec);
  BFT_ASSERT(ts.tv_nsec >= 0 && ts.tv_nsec < kNsPerSec);
  return ts;
}

std::uint64_t timespec_to_wire(const timespec& ts) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
  const std::int64_t sec = static_cast<std::int64_t>(ts.tv_sec);
  const std::int64_t nsec = std::clamp<std::int64_t>(ts.tv_nsec, 0, kNsPerSec - 1);
  std::int64_t v = 0;
  if (sec > (kMax - nsec) / kNsPerSec) {
    v = kMax;
  } else if (sec < kMin / kNsPerSec) {  // kMin / 1e9 rounds toward zero: sec * 1e9 + nsec still fits at it
    v = kMin;
  } else {
    v = sec * kNsPerSec + nsec;
  }
  return static_cast<std::uint64_t>(v);
}

struct stat to_stat(const fs::Attr& a) {
  struct stat st {};
  st.st_ino = a.ino;
  st.st_mode = type_bits(a.type) | (a.mode & 07777);
  st.st_nlink = a.nlink;
  st.st_uid = a.uid;
  st.st_gid = a.gid;
  st.st_size = static_cast<off_t>(a.size);
  st.st_blocks = static_cast<blkcnt_t>(a.blocks);
  st.st_blksize = 65536;
  st.st_rdev = static_cast<dev_t>(a.rdev);
  st.st_atim = wire_to_timespec(a.atime_ns);
  st.st_mtim = wire_to_timespec(a.mtime_ns);
  st.st_ctim = wire_to_timespec(a.ctime_ns);
  return st;
}

// The caller's credentials for an op. The wire carries at most fs::kGroupsMax (16) supplementary groups (as
// NFS AUTH_SYS does) and Linux allows 65536; the service uses group membership only against the groups of
// the objects the op touches (and a chgrp's new group). So the groups among `relevant` (those gids, when the
// caller is in them) go first and the rest fill what is left: access through the 17th or 30th group counts
// like the first. An object whose group this client does not know yet (e.g. a directory moved by name) is
// checked with the first 16 only; under default_permissions the kernel has already checked it with all.
fs::Cred cred_of(fuse_req_t req, std::initializer_list<std::optional<std::uint32_t>> relevant) {
  const fuse_ctx* ctx = fuse_req_ctx(req);
  fs::Cred c;
  c.uid = ctx->uid;
  c.gid = ctx->gid;
  // The service never looks at root's groups (every check that reads them exempts uid 0: fs_permissions.cc,
  // fs_data_ops.cc, fs_objects.cc), and reading them costs an open and a read of /proc/<tid>/status: a quarter
  // of the daemon's CPU in an unpack as root.
  if (c.uid == 0) return c;
  std::vector<gid_t> groups(64);
  int n = fuse_req_getgroups(req, static_cast<int>(groups.size()), groups.data());
  if (n > static_cast<int>(groups.size())) {  // more than 64: ask again with room for all of them
    groups.resize(static_cast<std::size_t>(n));
    n = fuse_req_getgroups(req, n, groups.data());
  }
  // n < 0: not available (e.g. the process is gone); the primary gid still applies.
  groups.resize(static_cast<std::size_t>(std::clamp(n, 0, static_cast<int>(groups.size()))));
  auto add = [&](std::uint32_t g) {
    if (c.groups.size() >= fs::kGroupsMax || g == c.gid) return;
    if (std::find(c.groups.begin(), c.groups.end(), g) != c.groups.end()) return;
    c.groups.push_back(g);
  };
  for (const auto& g : relevant) {
    if (g && std::find(groups.begin(), groups.end(), static_cast<gid_t>(*g)) != groups.end()) add(*g);
  }
  for (const gid_t g : groups) add(g);
  BFT_ASSERT(c.groups.size() <= fs::kGroupsMax);
  return c;
}

namespace {
bool in_group(const fs::Cred& c, std::uint32_t gid) {
  return c.gid == gid || std::find(c.groups.begin(), c.groups.end(), gid) != c.groups.end();
}
}  // namespace

bool mode_allows(const fs::Cred& c, const fs::Attr& a, std::uint32_t want) {
  if (c.uid == 0) return true;
  std::uint32_t bits = 0;
  if (c.uid == a.uid) {
    bits = (a.mode >> 6) & 7;
  } else if (in_group(c, a.gid)) {
    bits = (a.mode >> 3) & 7;
  } else {
    bits = a.mode & 7;
  }
  return (bits & want) == want;
}

fs::Op make_op(OpCode code, const fs::Cred& cred) {
  fs::Op op;
  op.code = code;
  op.cred = cred;
  return op;
}

fs::Request single(fs::Op op) {
  fs::Request r;
  r.ops.push_back(std::move(op));
  return r;
}

}  // namespace bftfs::client
