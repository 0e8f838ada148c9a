// The POSIX rules of the file service: see fs_permissions.h.
#include "services/fs/fs_permissions.h"

#include <algorithm>

#include "common/assert.h"

namespace bftfs::fs {

bool in_group(const Cred& c, std::uint32_t gid) {
  if (c.gid == gid) return true;
  return std::find(c.groups.begin(), c.groups.end(), gid) != c.groups.end();
}

bool may(const Cred& c, const Inode& n, std::uint32_t want) {
  if (c.uid == 0) {
    if ((want & kWantX) != 0 && n.type != FileType::kDirectory && (n.mode & 0111) == 0) return false;
    return true;
  }
  std::uint32_t bits = 0;
  if (c.uid == n.uid) {
    bits = (n.mode >> 6) & 7;
  } else if (in_group(c, n.gid)) {
    bits = (n.mode >> 3) & 7;
  } else {
    bits = n.mode & 7;
  }
  return (bits & want) == want;
}

bool sticky_denies(const Cred& c, const Inode& dir, const Inode& child) {
  return (dir.mode & kModeSticky) != 0 && c.uid != 0 && c.uid != dir.uid && c.uid != child.uid;
}

void kill_suid(Inode& n) {
  n.mode &= ~kModeSuid;
  if ((n.mode & 010) != 0) n.mode &= ~kModeSgid;
}

void kill_setid_on_write(Inode& n, const Cred& c) {
  BFT_ASSERT(c.uid != 0);
  n.mode &= ~kModeSuid;
  if ((n.mode & 010) != 0 || !in_group(c, n.gid)) n.mode &= ~kModeSgid;
}

std::uint32_t check_name(const std::string& name) {
  if (name.empty()) return err::kNoEnt;
  if (name.size() > kNameBytesMax) return err::kNameTooLong;
  if (name.find('/') != std::string::npos) return err::kInval;
  if (name.find('\0') != std::string::npos) return err::kInval;
  return err::kOk;
}

bool is_dot(const std::string& name) { return name == "." || name == ".."; }

}  // namespace bftfs::fs
