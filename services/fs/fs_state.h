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

inline constexpr std::uint64_t kFirstCookie = 3;  // directory cookies: 1 is '.', 2 is '..'

// (0, kSuper, 0): the counters of the whole file system.
struct Super {
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
  std::uint64_t next_cookie = 0;    // directories
  std::uint64_t entries = 0;        // directories (without '.' and '..')
  std::string target;               // symlinks
  std::uint64_t rdev = 0;           // device nodes
};

// (dir, kName, name): a directory entry found by name; its cookie names the kEntry twin.
struct NameRec {
  std::uint64_t cookie = 0;
  std::uint64_t ino = 0;
  FileType type = FileType::kRegular;
};

// (dir, kEntry, cookie): the same entry found by cookie, in the order READDIR lists entries.
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
