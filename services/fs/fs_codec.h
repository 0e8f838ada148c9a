// The wire format of the file service (docs/FILESERVICE.md §1): compound requests of file operations and their
// results. Pure encoding and validation; no file-system semantics (services/fs/fs_service.h has those).
//
// Decoding treats its input as hostile (it is a client's bytes, relayed by a possibly Byzantine primary): every
// field is checked once, on its own line, and a rejection names the first check that failed. Accepted inputs
// are canonical: encoding what was decoded gives the same bytes back (round-trip tests, fuzz/fuzz_fs_codec.cc).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/types.h"

namespace bftfs::fs {

inline constexpr std::uint8_t kFsWireVersion = 1;
inline constexpr std::size_t kCompoundOpsMax = 64;
inline constexpr std::size_t kGroupsMax = 16;
inline constexpr std::uint32_t kNameBytesMax = 255;          // NAME_MAX: longer names get ENAMETOOLONG
inline constexpr std::uint32_t kNameWireBytesMax = 1024;     // longer is malformed (shorter-but-too-long is an errno)
inline constexpr std::uint32_t kSymlinkBytesMax = 4095;      // PATH_MAX - 1
inline constexpr std::uint32_t kSymlinkWireBytesMax = 8192;
inline constexpr std::uint32_t kIoBytesMax = 512u * 1024;    // one READ or WRITE
inline constexpr std::uint32_t kReaddirEntriesMax = 1024;    // one READDIR
// Every result of the file service fits in this, whatever the state (checked statically per request); it is
// below shim::kInnerResultBytesMax (asserted in tests/unit/test_fs_codec.cc, to keep services/ free of shim/).
inline constexpr std::size_t kFsResultBytesMax = 1u << 20;
inline constexpr std::size_t kAttrBytes = 81;

enum class OpCode : std::uint8_t {
  kLookup = 1,
  kGetattr = 2,
  kSetattr = 3,
  kRead = 4,
  kWrite = 5,
  kCreate = 6,
  kRemove = 7,
  kMkdir = 8,
  kRmdir = 9,
  kRename = 10,
  kLink = 11,
  kSymlink = 12,
  kReadlink = 13,
  kReaddir = 14,
  kStatfs = 15,
  kFsync = 16,
  kReaddirPlus = 17,  // READDIR with each entry's Attr (FUSE readdirplus: no LOOKUP per entry)
  kMknod = 18,        // a FIFO, socket or device node (the client's kernel does their I/O, not the service)
  kAccess = 19,       // which of r/w/x the caller may do (FUSE access() without default_permissions)
};
inline constexpr std::uint8_t kOpCodeMax = 19;

// True for ops whose successful result is an Attr (they can be named by a result reference).
bool returns_attr(OpCode code);
// True for ops that never change the state (the read-only optimization may run them).
bool is_read_only(OpCode code);

// Positive Linux errno values as sent on the wire (fixed here, not taken from <cerrno>, so the wire never
// depends on the build host).
namespace err {
inline constexpr std::uint32_t kOk = 0;
inline constexpr std::uint32_t kPerm = 1;
inline constexpr std::uint32_t kNoEnt = 2;
inline constexpr std::uint32_t kIo = 5;
inline constexpr std::uint32_t kAccess = 13;
inline constexpr std::uint32_t kExist = 17;
inline constexpr std::uint32_t kNotDir = 20;
inline constexpr std::uint32_t kIsDir = 21;
inline constexpr std::uint32_t kInval = 22;
inline constexpr std::uint32_t kFBig = 27;
inline constexpr std::uint32_t kNoSpc = 28;
inline constexpr std::uint32_t kMLink = 31;
inline constexpr std::uint32_t kNameTooLong = 36;
inline constexpr std::uint32_t kNotEmpty = 39;
inline constexpr std::uint32_t kStale = 116;
}  // namespace err

enum class FileType : std::uint8_t {
  kRegular = 1,
  kDirectory = 2,
  kSymlink = 3,
  kFifo = 4,
  kSocket = 5,
  kCharDevice = 6,
  kBlockDevice = 7,
};
inline constexpr std::uint8_t kFileTypeMax = 7;

struct Cred {
  std::uint32_t uid = 0;
  std::uint32_t gid = 0;
  std::vector<std::uint32_t> groups;  // supplementary groups, <= kGroupsMax
  friend bool operator==(const Cred&, const Cred&) = default;
};

// A file handle, or a reference to the inode returned by an earlier op of the same compound.
struct Handle {
  bool is_ref = false;
  std::uint8_t ref = 0;      // is_ref: index of an earlier op that returns an Attr
  std::uint64_t ino = 0;     // !is_ref
  std::uint64_t generation = 0;
  static Handle of(std::uint64_t ino, std::uint64_t generation) { return Handle{false, 0, ino, generation}; }
  static Handle result_of(std::uint8_t k) { return Handle{true, k, 0, 0}; }
  friend bool operator==(const Handle&, const Handle&) = default;
};

enum class ExpectKind : std::uint8_t { kNone = 0, kErrno = 1, kDigest = 2 };
struct Expect {
  ExpectKind kind = ExpectKind::kNone;
  std::uint32_t err = 0;  // kErrno
  Digest digest;          // kDigest: digest_of(encode_op_result(the expected result))
  friend bool operator==(const Expect&, const Expect&) = default;
};

// SETATTR mask bits; fields are encoded in this bit order when their bit is set.
namespace setattr {
inline constexpr std::uint8_t kMode = 1u << 0;
inline constexpr std::uint8_t kUid = 1u << 1;
inline constexpr std::uint8_t kGid = 1u << 2;
inline constexpr std::uint8_t kSize = 1u << 3;
inline constexpr std::uint8_t kAtime = 1u << 4;
inline constexpr std::uint8_t kMtime = 1u << 5;
inline constexpr std::uint8_t kAtimeNow = 1u << 6;
inline constexpr std::uint8_t kMtimeNow = 1u << 7;
}  // namespace setattr

// One operation. Fields not used by `code` stay at their defaults (the decoder leaves them so, and the
// encoder ignores them), so two equal ops compare equal.
struct Op {
  OpCode code = OpCode::kGetattr;
  Cred cred;
  Expect expect;
  Handle handle;          // the object, or the directory (LOOKUP, CREATE, REMOVE, MKDIR, RMDIR, SYMLINK,
                          // READDIR, READDIRPLUS), or the source directory (RENAME), or the link target (LINK),
                          // or any live object (STATFS)
  Handle handle2;         // RENAME target directory, LINK directory
  std::string name;       // entry name; RENAME source name
  std::string name2;      // RENAME target name
  std::uint64_t offset = 0;  // READ, WRITE
  std::uint32_t count = 0;   // READ bytes, READDIR/READDIRPLUS max entries
  Bytes data;                // WRITE
  std::uint32_t mode = 0;    // CREATE, MKDIR, MKNOD, SETATTR (07777 bits)
  FileType node_type = FileType::kRegular;  // MKNOD: kFifo..kBlockDevice
  std::uint64_t rdev = 0;                   // MKNOD: device number (devices only; 0 otherwise)
  bool exclusive = false;    // CREATE
  bool append = false;       // WRITE: at the file's size when executed (O_APPEND, atomic); offset must be 0
  std::uint8_t access = 0;   // ACCESS: wanted bits, r=4 w=2 x=1 (<= 7)
  std::uint8_t mask = 0;     // SETATTR
  std::uint32_t uid = 0, gid = 0;               // SETATTR
  std::uint64_t size = 0, atime_ns = 0, mtime_ns = 0;  // SETATTR
  std::string target;        // SYMLINK
  std::uint64_t cookie = 0;  // READDIR, READDIRPLUS
  friend bool operator==(const Op&, const Op&) = default;
};

struct Request {
  std::vector<Op> ops;  // 1..kCompoundOpsMax
  friend bool operator==(const Request&, const Request&) = default;
};

struct Attr {
  std::uint64_t ino = 0;
  std::uint64_t generation = 0;
  FileType type = FileType::kRegular;
  std::uint32_t mode = 0;  // 07777 bits
  std::uint32_t nlink = 0;
  std::uint32_t uid = 0;
  std::uint32_t gid = 0;
  std::uint64_t size = 0;
  std::uint64_t blocks = 0;  // 512-byte units
  std::uint64_t atime_ns = 0;
  std::uint64_t mtime_ns = 0;
  std::uint64_t ctime_ns = 0;
  std::uint64_t rdev = 0;  // device nodes
  Handle handle() const { return Handle::of(ino, generation); }
  friend bool operator==(const Attr&, const Attr&) = default;
};

struct DirEntry {
  std::uint64_t cookie = 0;
  std::uint64_t ino = 0;
  FileType type = FileType::kRegular;
  std::string name;
  Attr attr;  // READDIRPLUS only
  friend bool operator==(const DirEntry&, const DirEntry&) = default;
};

struct StatFs {
  std::uint32_t bsize = 0;
  std::uint64_t blocks = 0, bfree = 0, bavail = 0, files = 0, ffree = 0;
  std::uint32_t namemax = 0;
  friend bool operator==(const StatFs&, const StatFs&) = default;
};

// One op's result; only the fields of `code` (and only when err == 0) are meaningful and encoded.
struct OpResult {
  OpCode code = OpCode::kGetattr;
  std::uint32_t err = 0;
  Attr attr;                      // ops with returns_attr(code)
  bool eof = false;               // READ, READDIR
  Bytes data;                     // READ
  std::uint32_t count = 0;        // WRITE
  std::uint8_t granted = 0;       // ACCESS: the wanted bits the caller has
  std::string target;             // READLINK
  std::vector<DirEntry> entries;  // READDIR, READDIRPLUS
  StatFs statfs;                  // STATFS
  friend bool operator==(const OpResult&, const OpResult&) = default;
};

enum class Outcome : std::uint8_t { kDone = 0, kOpFailed = 1, kPredicateFailed = 2, kMalformed = 3 };

struct Result {
  Outcome outcome = Outcome::kDone;
  std::uint8_t stop = 0;  // kOpFailed/kPredicateFailed: the op that stopped it; kMalformed: the FsDecodeError
  std::vector<OpResult> results;
  friend bool operator==(const Result&, const Result&) = default;
};

enum class FsDecodeError : std::uint8_t {
  kOk = 0,
  kTruncated,
  kTrailingBytes,
  kBadVersion,
  kBadOpCount,
  kBadOpCode,
  kTooManyGroups,
  kBadExpectKind,
  kBadHandleTag,
  kBadHandleRef,       // refers to itself, a later op, or an op that returns no Attr
  kNameTooLongOnWire,  // > kNameWireBytesMax
  kTargetTooLongOnWire,
  kBadSetattrMask,     // a time both given and "now"
  kIoTooLarge,         // READ count or WRITE length > kIoBytesMax
  kBadBoolean,
  kBadReaddirCount,    // 0 or > kReaddirEntriesMax
  kResultTooLarge,     // the worst-case result exceeds kFsResultBytesMax
  kBadOutcome,         // results only
  kBadErrno,           // results only: 0 in the op that failed, or nonzero in an op that passed
  kBadFileType,        // results only
  kBadResultCount,     // results only
  kBadReadLength,      // results only
  kBadNodeType,        // MKNOD of a type that is not a FIFO, socket or device
  kAppendWithOffset,   // WRITE with append and a nonzero offset
  kBadAccessMask,      // ACCESS bits beyond r/w/x, or granted bits not wanted (results)
};
std::string_view to_string(FsDecodeError e);
// True for the errors decode_request can return (what a kMalformed result may carry as its reason).
bool is_request_error(FsDecodeError e);

// ---- requests ----
Bytes encode_request(const Request& r);
// Precondition of encode_request: a request decode_request would accept (asserted cheaply: op count, sizes).
FsDecodeError decode_request(std::span<const std::uint8_t> bytes, Request& out);
// The largest result `op` can produce, whatever the state (the request bound sums these).
std::size_t worst_case_result_bytes(const Op& op);

// ---- results ----
void encode_op_result(const OpResult& r, Bytes& out);
Bytes encode_op_result(const OpResult& r);
Bytes encode_result(const Result& r);
FsDecodeError decode_result(std::span<const std::uint8_t> bytes, Result& out);
// What a digest predicate compares: digest_of(encode_op_result(r)).
Digest op_result_digest(const OpResult& r);

}  // namespace bftfs::fs
