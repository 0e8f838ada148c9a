// Private to the file service (services/fs/fs_*.cc): the formats of the values it keeps in its ObjectStore
// (docs/FILESERVICE.md §3). Keys are object_store.h's; this header says what the value of each kind of key holds.
//
// These bytes enter a replica's state only through execution (encoded here) or through a state-transfer install,
// which checks every value with value_ok() first; so a value that fails to decode in the service is a bug (or
// a corrupt disk, which the store detects by checksum before the service sees the bytes). The encodings are
// hashed into checkpoint digests: changing one changes every digest and breaks agreement with older replicas.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "common/types.h"
#include "services/fs/fs_codec.h"
#include "services/fs/fs_service.h"
#include "services/fs/object_store.h"

namespace bftfs::fs {

// The mode bits an inode keeps (the file type is a field of its own, not in the mode).
inline constexpr std::uint32_t kModeSuid = 04000;
inline constexpr std::uint32_t kModeSgid = 02000;
inline constexpr std::uint32_t kModeSticky = 01000;
inline constexpr std::uint32_t kModeBits = 07777;

// The version of the formats below (and of how positions are derived from names). A store holding another
// format is refused at start (FsService's constructor) and an install of one fails validation. Format 1 gave
// each new entry the directory's next cookie; format 2 derives positions from names (dir_position_home). No
// deployed cluster keeps format 1, so there is no migration: a replica's data directory of format 1 is wiped.
inline constexpr std::uint32_t kStateFormat = 2;

// Directory positions (readdir cookies, docs/FILESERVICE.md §7): 0 is the start of a listing, 1 is '.', 2 is
// '..'; entries are at kFirstCookie..kCookieMax. The kernel keeps a directory offset as a signed loff_t and
// refuses to seek past the file system's largest offset (2^63 - 1 for FUSE), so positions stay in that range.
inline constexpr std::uint64_t kFirstCookie = 3;
inline constexpr std::uint64_t kCookieMax = (1ull << 63) - 1;
inline constexpr std::uint64_t kDirPositionsMax = kCookieMax - kFirstCookie + 1;

// Where an entry named `name` in directory (dir_ino, dir_generation) is placed when that position is free:
// kFirstCookie + (the first 8 bytes, little-endian, of BLAKE2b-256 over a domain tag, the directory's number and
// generation, and the name) mod `positions` (FsOptions::dir_positions, <= kDirPositionsMax). The directory's
// number and generation salt the hash so that names that collide in one directory (by chance or ground on
// purpose) do not collide in any other.
std::uint64_t dir_position_home(std::uint64_t dir_ino, std::uint64_t dir_generation, std::string_view name,
                                std::uint64_t positions);
// The position after `pos` in a directory of `positions` positions: probing wraps from the last to the first.
std::uint64_t dir_position_next(std::uint64_t pos, std::uint64_t positions);

// (0, kSuper, 0): the format and the counters of the whole file system.
struct Super {
  std::uint32_t format = kStateFormat;
  std::uint64_t next_ino = 0;     // smallest inode number never used
  std::uint64_t used_inodes = 0;
  std::uint64_t used_blocks = 0;
};

// (ino, kInode, 0): one file, directory, symlink or special file.
struct Inode {
  std::uint64_t ino = 0;  // the key's, not encoded
  std::uint64_t generation = 0;
  FileType type = FileType::kRegular;
  std::uint32_t mode = 0;
  std::uint32_t nlink = 0;
  std::uint32_t uid = 0;
  std::uint32_t gid = 0;
  std::uint64_t size = 0;  // regular files and symlinks
  std::uint64_t atime_ns = 0;
  std::uint64_t mtime_ns = 0;
  std::uint64_t ctime_ns = 0;
  std::uint64_t stored_blocks = 0;  // regular files: data objects (what capacity counts)
  std::uint64_t stored_bytes = 0;   // regular files: bytes in those objects (what st_blocks reports)
  std::uint64_t parent = 0;         // directories
  std::uint64_t entries = 0;        // directories (without '.' and '..')
  std::string target;               // symlinks
  std::uint64_t rdev = 0;           // device nodes
};

// (dir, kName, name): a directory entry found by name; its cookie (the entry's position) names the kEntry twin.
// Lookups go through this object, never through positions, so a name is found wherever its probe placed it.
struct NameRec {
  std::uint64_t cookie = 0;
  std::uint64_t ino = 0;
  FileType type = FileType::kRegular;
};

// (dir, kEntry, cookie): the same entry found by position, in the order READDIR lists entries.
struct EntryRec {
  std::uint64_t ino = 0;
  FileType type = FileType::kRegular;
  std::string name;
};

// Each decoder accepts exactly what its encoder produces (fixed fields, bounded strings, no trailing bytes) and
// returns false on anything else. Inode::ino is not part of the encoding: the caller sets it from the key.
Bytes encode_super(const Super& s);
bool decode_super(std::span<const std::uint8_t> b, Super& s);
Bytes encode_inode(const Inode& n);
bool decode_inode(std::span<const std::uint8_t> b, Inode& n);
Bytes encode_name_rec(const NameRec& n);
bool decode_name_rec(std::span<const std::uint8_t> b, NameRec& n);
Bytes encode_entry_rec(const EntryRec& e);
bool decode_entry_rec(std::span<const std::uint8_t> b, EntryRec& e);
// (0, kFree, ino): the generation the inode number last had.
Bytes encode_u64(std::uint64_t v);
bool decode_u64(std::span<const std::uint8_t> b, std::uint64_t& v);

// Whether `v` is a well-formed value for `k` (install validation: the service never meets a value it cannot
// decode).
bool value_ok(const ObjectKey& k, const Bytes& v);

// The attributes a client sees of `n` (a directory's size is its entry count; blocks are 512-byte units).
Attr attr_of(const Inode& n);

}  // namespace bftfs::fs
