// Private to the file service (services/fs/fs_*.cc): the POSIX rules it applies as Linux does (docs/FILESERVICE.md
// §2): permission checks with root's bypass, sticky directories, what a chown or a write does to the set-id bits,
// and which names a directory may hold. Pure functions of credentials, inodes and names.
#pragma once

#include <cstdint>
#include <string>

#include "services/fs/fs_codec.h"
#include "services/fs/fs_state.h"

namespace bftfs::fs {

// Bits of a permission request, as in access(2) and in each rwx triple of a mode.
inline constexpr std::uint32_t kWantR = 4;
inline constexpr std::uint32_t kWantW = 2;
inline constexpr std::uint32_t kWantX = 1;

// Whether `gid` is the caller's group or one of its supplementary groups.
bool in_group(const Cred& c, std::uint32_t gid);

// POSIX permission check for `want` (r=4, w=2, x=1 bits) with Linux's root bypass: root may do anything but
// execute a non-directory with no execute bit at all.
bool may(const Cred& c, const Inode& n, std::uint32_t want);

// Sticky directories: only the owner of the entry, of the directory, or root may remove or replace it.
bool sticky_denies(const Cred& c, const Inode& dir, const Inode& child);

// What Linux does to a file chowned (the set-gid bit without group-exec marks mandatory locking: kept).
void kill_suid(Inode& n);

// What Linux (>= 6.2, setattr_should_drop_sgid) does to a file written or truncated by caller `c` without
// CAP_FSETID: S_ISUID goes; S_ISGID goes if the file is group-executable, or if the caller is not in the
// file's group (then the bit could be used to gain that group). Precondition: `c` is not root.
void kill_setid_on_write(Inode& n, const Cred& c);

// err::kOk if `name` may name a directory entry, else the errno: empty (ENOENT), longer than NAME_MAX
// (ENAMETOOLONG), or holding '/' or NUL (EINVAL). "." and ".." pass: each op decides what they mean.
std::uint32_t check_name(const std::string& name);

// "." or "..".
bool is_dot(const std::string& name);

}  // namespace bftfs::fs
