// The wire format of the file service (docs/FILESERVICE.md §1): compound requests of file operations and their
// results. Pure encoding and validation; no file-system semantics (services/fs/fs_service.h has those).
//
// Decoding treats its input as hostile (it is a client's bytes, relayed by a possibly Byzantine primary): every
// field is checked once, on its own line, and a rejection names the first check that failed. Accepted inputs
// are canonical: encoding what was decoded gives the same bytes back (round-trip tests, fuzz/fuzz_fs_codec.cc).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/types.h"
#include "services/fs/object_store.h"

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
  // Speculation (docs/SPECULATION.md §5): TIME in any request; FETCH reads raw objects; the stream ops (RESERVE,
  // STAGE, EPOCH, STREAM_CLOSE) are each alone in their request.
  kTime = 20,         // the time of the ops after it
  kFetch = 21,        // the facts a request would read (trace), or objects by key
  kReserve = 22,      // inode numbers into a stream's pool
  kStage = 23,        // stores one part of an epoch's entries
  kEpoch = 24,        // applies an epoch's entries all or nothing, chained to the stream's last epoch
  kStreamClose = 25,  // ends a stream: its pool goes back, its parts are erased
};
inline constexpr std::uint8_t kFileOpCodeMax = 19;   // codes 1..19: the ops on files
inline constexpr std::uint8_t kEntryOpCodeMax = 20;  // what an entry (or a traced request) may hold: those and TIME
inline constexpr std::uint8_t kOpCodeMax = 25;

// ---- limits of the speculation ops (docs/SPECULATION.md §5.9) ----
inline constexpr std::uint32_t kEntriesMax = 65536;        // entries of one STAGE part, and of one EPOCH in all
inline constexpr std::uint32_t kStagePartsMax = 4096;      // part numbers 0..4095
inline constexpr std::uint16_t kFetchKeysMax = 256;        // keys of one FETCH in keys mode
inline constexpr std::uint16_t kReserveCountMax = 4096;    // inode numbers one RESERVE asks for
inline constexpr std::size_t kFetchFactBytesMax = 768u * 1024;  // encoded facts of one FETCH result
inline constexpr std::uint32_t kFactValueBytesMax = 64u * 1024;  // the largest stored value (a data block)
inline constexpr std::uint32_t kKeyNameBytesMax = 4096;    // a name in a Key on the wire (real names: <= 255)

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

enum class Outcome : std::uint8_t { kDone = 0, kOpFailed = 1, kPredicateFailed = 2, kMalformed = 3 };

struct Op;

struct Request {
  std::vector<Op> ops;  // 1..kCompoundOpsMax
  friend bool operator==(const Request&, const Request&) = default;
};

// One request of a speculating tree with the outcome it was told (docs/SPECULATION.md §5.3): an EPOCH applies
// only if each of its entries, executed again, gives this outcome, stop and errno (errno not compared for
// kPredicateFailed). The request's op 0 is TIME, and it holds no op beyond kEntryOpCodeMax.
struct Entry {
  Outcome expect_outcome = Outcome::kDone;  // kDone, kOpFailed or kPredicateFailed
  std::uint8_t expect_stop = 0;             // < request.ops.size(); 0 with kDone
  std::uint32_t expect_err = 0;             // op #stop's errno: nonzero with kOpFailed, any with kPredicateFailed
  Request request;
  friend bool operator==(const Entry&, const Entry&) = default;
};

enum class FetchMode : std::uint8_t {
  kTrace = 0,  // the facts the traced request reads when executed as an entry of the stream
  kKeys = 1,   // per key: its value, or where the next key is
};

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
  std::uint64_t time_ns = 0;  // TIME
  std::uint64_t stream = 0;   // FETCH (trace), RESERVE, STAGE, EPOCH, STREAM_CLOSE
  FetchMode fetch_mode = FetchMode::kTrace;  // FETCH
  Request trace;                 // FETCH trace: the request to trace (an entry's request)
  std::vector<ObjectKey> keys;   // FETCH keys: 1..kFetchKeysMax canonical keys
  std::uint16_t reserve = 0;     // RESERVE: 1..kReserveCountMax inode numbers
  std::uint64_t epoch = 0;       // STAGE, EPOCH: >= 1
  std::uint64_t prev = 0;        // EPOCH: < epoch
  std::uint32_t part = 0;        // STAGE: < kStagePartsMax
  std::uint32_t parts = 0;       // EPOCH: staged parts, <= kStagePartsMax
  Digest parts_digest;           // EPOCH: parts_digest() of the staged parts' bytes
  std::vector<Entry> entries;    // STAGE (1..kEntriesMax), EPOCH (0..kEntriesMax inline)
  friend bool operator==(const Op&, const Op&) = default;
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

// What FETCH returns: facts about the state the replica executed it at.
enum class FactKind : std::uint8_t {
  kValue = 1,   // `key` holds `value`
  kAbsent = 2,  // `key` is absent
  kNext = 3,    // no key in [key, next), and `next` is present; without next: no key at or after `key`
};
struct Fact {
  FactKind kind = FactKind::kValue;
  ObjectKey key;                   // canonical
  Bytes value;                     // kValue: <= kFactValueBytesMax
  std::optional<ObjectKey> next;   // kNext: >= key
  friend bool operator==(const Fact&, const Fact&) = default;
};

// An inode number RESERVE put into a stream's pool, with the generation its inode will have.
struct ReservedInode {
  std::uint64_t ino = 0;
  std::uint64_t generation = 0;
  friend bool operator==(const ReservedInode&, const ReservedInode&) = default;
};

enum class EpochVerdict : std::uint8_t {
  kApplied = 0,  // every entry matched: the epoch's changes are in the state
  kChain = 1,    // the stream's last applied epoch is not `prev`
  kStaging = 2,  // the staged parts are not the ones named (missing, other epoch, other digest, too many entries)
  kEntry = 3,    // entry #entry did not match; nothing changed
};
inline constexpr std::uint8_t kEpochVerdictMax = 3;

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
  bool complete = false;          // FETCH: every fact fitted
  std::vector<Fact> facts;        // FETCH
  std::uint64_t pool_first = 0;   // RESERVE: the pool index of reserved[0]
  std::vector<ReservedInode> reserved;  // RESERVE
  std::uint32_t parts_present = 0;      // STAGE
  std::uint64_t staged_bytes = 0;       // STAGE
  EpochVerdict verdict = EpochVerdict::kApplied;  // EPOCH
  std::uint64_t last_before = 0;        // EPOCH: the stream's last applied epoch when the EPOCH began
  std::uint32_t entry = 0;              // EPOCH kEntry: the entry's index (staged entries first)
  Outcome entry_outcome = Outcome::kDone;  // EPOCH kEntry: what the entry actually gave
  std::uint8_t entry_stop = 0;
  std::uint32_t entry_err = 0;
  std::vector<OpResult> entry_result;   // EPOCH kEntry, outcome not done: op #entry_stop's result (one element)
  friend bool operator==(const OpResult&, const OpResult&) = default;
};


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
  kStreamOpNotAlone,   // RESERVE, STAGE, EPOCH or STREAM_CLOSE with other ops in its request
  kStreamOpInEntry,    // an entry or a traced request holding an op beyond kEntryOpCodeMax
  kEntryWithoutTime,   // an entry or a traced request whose op 0 is not TIME
  kBadEntryExpect,     // an entry's expectation: outcome beyond 2, stop beyond its ops, errno against outcome
  kBadEntryCount,      // a STAGE without entries, or more than kEntriesMax entries
  kBadFetchMode,       // FETCH mode not 0 or 1
  kBadKeyCount,        // FETCH keys not 1..kFetchKeysMax
  kBadKey,             // a key of an unknown kind or with a name longer than kKeyNameBytesMax
  kBadReserveCount,    // RESERVE count not 1..kReserveCountMax (results: more inodes than that)
  kBadPart,            // STAGE part >= kStagePartsMax, EPOCH parts > kStagePartsMax
  kBadEpoch,           // STAGE epoch 0, EPOCH epoch not above prev
  kBadFact,            // results only: unknown fact tag, a value too long, next below its key
  kTooManyFacts,       // results only: facts beyond kFetchFactBytesMax
  kBadVerdict,         // results only: unknown EPOCH verdict, or fields inconsistent with it
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

// ---- entries (docs/SPECULATION.md §5.3, §5.5) ----
// A staged part's bytes: u32 n || n * Entry (what STAGE stores and what EPOCH's parts_digest covers).
// Preconditions of encode_entries: valid entries (asserted cheaply).
Bytes encode_entries(std::span<const Entry> entries);
// Accepts what encode_entries produces from 1..kEntriesMax valid entries.
FsDecodeError decode_entries(std::span<const std::uint8_t> bytes, std::vector<Entry>& out);
// BLAKE2b-256 over the parts' bytes in part order (EPOCH's parts_digest).
Digest parts_digest(std::span<const Bytes> parts);
// The bytes `f` takes in a FETCH result (what the kFetchFactBytesMax cap counts).
std::size_t encoded_fact_bytes(const Fact& f);
// Whether `actual` (an execution of entry.request) is what the entry expects.
bool entry_matches(const Entry& entry, const Result& actual);
// The expectation that `actual` gives (outcome, stop and the errno the matching rule compares).
void set_expectation(Entry& entry, const Result& actual);

// ---- results ----
void encode_op_result(const OpResult& r, Bytes& out);
Bytes encode_op_result(const OpResult& r);
Bytes encode_result(const Result& r);
FsDecodeError decode_result(std::span<const std::uint8_t> bytes, Result& out);
// What a digest predicate compares: digest_of(encode_op_result(r)).
Digest op_result_digest(const OpResult& r);

}  // namespace bftfs::fs
