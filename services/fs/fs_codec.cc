// The file service's wire format; see fs_codec.h and docs/FILESERVICE.md §1. The frame of requests and results
// and the ops on files are here; the speculation ops' bodies are in fs_codec_speculation.cc.
#include "services/fs/fs_codec.h"

#include <array>

#include "common/assert.h"
#include "common/codec.h"
#include "common/crypto.h"
#include "services/fs/fs_codec_internal.h"

namespace bftfs::fs {

namespace codec_internal {

bool reject(ByteReader& r, FsDecodeError& e, FsDecodeError reason) {
  e = reason;
  return r.fail();
}

FsDecodeError reason(const ByteReader& r, FsDecodeError e) {
  if (e != FsDecodeError::kOk) return e;
  if (!r.ok()) return FsDecodeError::kTruncated;
  return FsDecodeError::kTrailingBytes;
}

bool get_bool(ByteReader& r, bool& v, FsDecodeError& e) {
  std::uint8_t b = 0;
  if (!r.u8(b)) return false;
  if (b > 1) return reject(r, e, FsDecodeError::kBadBoolean);
  v = b == 1;
  return true;
}

}  // namespace codec_internal

namespace {

using namespace codec_internal;

// Per-entry worst case of a READDIR result: cookie, ino, type, name length, name.
constexpr std::size_t kDirEntryBytesMax = 8 + 8 + 1 + 2 + kNameBytesMax;
constexpr std::size_t kOpResultHeaderBytes = 1 + 4;
constexpr std::size_t kResultHeaderBytes = 3;

void put_string16(ByteWriter& w, std::string_view s) {
  BFT_ASSERT(s.size() <= 0xFFFF);
  w.u16(static_cast<std::uint16_t>(s.size()));
  w.bytes(s);
}

bool get_string16(ByteReader& r, std::uint32_t max_bytes, std::string& out, FsDecodeError& e,
                  FsDecodeError too_long) {
  std::uint16_t n = 0;
  if (!r.u16(n)) return false;
  if (n > max_bytes) return reject(r, e, too_long);
  std::span<const std::uint8_t> v;
  if (!r.view(n, v)) return false;
  out.assign(reinterpret_cast<const char*>(v.data()), v.size());
  return true;
}

void put_handle(ByteWriter& w, const Handle& h) {
  if (h.is_ref) {
    w.u8(1);
    w.u8(h.ref);
    return;
  }
  w.u8(0);
  w.u64(h.ino);
  w.u64(h.generation);
}

// `index` is the op being decoded; a reference must name an earlier op that returns an Attr.
bool get_handle(ByteReader& r, const std::vector<Op>& earlier, Handle& h, FsDecodeError& e) {
  std::uint8_t tag = 0;
  if (!r.u8(tag)) return false;
  if (tag == 0) {
    h.is_ref = false;
    return r.u64(h.ino) && r.u64(h.generation);
  }
  if (tag != 1) return reject(r, e, FsDecodeError::kBadHandleTag);
  h.is_ref = true;
  if (!r.u8(h.ref)) return false;
  if (h.ref >= earlier.size()) return reject(r, e, FsDecodeError::kBadHandleRef);
  if (!returns_attr(earlier[h.ref].code)) return reject(r, e, FsDecodeError::kBadHandleRef);
  return true;
}

void put_attr(ByteWriter& w, const Attr& a) {
  w.u64(a.ino);
  w.u64(a.generation);
  w.u8(static_cast<std::uint8_t>(a.type));
  w.u32(a.mode);
  w.u32(a.nlink);
  w.u32(a.uid);
  w.u32(a.gid);
  w.u64(a.size);
  w.u64(a.blocks);
  w.u64(a.atime_ns);
  w.u64(a.mtime_ns);
  w.u64(a.ctime_ns);
  w.u64(a.rdev);
}

bool get_file_type(ByteReader& r, FileType& t, FsDecodeError& e) {
  std::uint8_t v = 0;
  if (!r.u8(v)) return false;
  if (v < 1 || v > kFileTypeMax) return reject(r, e, FsDecodeError::kBadFileType);
  t = static_cast<FileType>(v);
  return true;
}

bool get_attr(ByteReader& r, Attr& a, FsDecodeError& e) {
  if (!r.u64(a.ino) || !r.u64(a.generation)) return false;
  if (!get_file_type(r, a.type, e)) return false;
  return r.u32(a.mode) && r.u32(a.nlink) && r.u32(a.uid) && r.u32(a.gid) && r.u64(a.size) && r.u64(a.blocks) &&
         r.u64(a.atime_ns) && r.u64(a.mtime_ns) && r.u64(a.ctime_ns) && r.u64(a.rdev);
}

// ---- ops: the fields every op has (code, credentials, predicate), then its own fields ----

void put_cred(ByteWriter& w, const Cred& c) {
  w.u32(c.uid);
  w.u32(c.gid);
  BFT_ASSERT(c.groups.size() <= kGroupsMax);
  w.u8(static_cast<std::uint8_t>(c.groups.size()));
  for (std::uint32_t g : c.groups) w.u32(g);
}

bool get_cred(ByteReader& r, Cred& c, FsDecodeError& e) {
  std::uint8_t ngroups = 0;
  if (!r.u32(c.uid) || !r.u32(c.gid) || !r.u8(ngroups)) return false;
  if (ngroups > kGroupsMax) return reject(r, e, FsDecodeError::kTooManyGroups);
  c.groups.resize(ngroups);
  for (auto& g : c.groups) {
    if (!r.u32(g)) return false;
  }
  return true;
}

void put_expect(ByteWriter& w, const Expect& x) {
  w.u8(static_cast<std::uint8_t>(x.kind));
  if (x.kind == ExpectKind::kErrno) w.u32(x.err);
  if (x.kind == ExpectKind::kDigest) w.digest(x.digest);
}

bool get_expect(ByteReader& r, Expect& x, FsDecodeError& e) {
  std::uint8_t kind = 0;
  if (!r.u8(kind)) return false;
  if (kind > 2) return reject(r, e, FsDecodeError::kBadExpectKind);
  x.kind = static_cast<ExpectKind>(kind);
  if (x.kind == ExpectKind::kErrno && !r.u32(x.err)) return false;
  if (x.kind == ExpectKind::kDigest && !r.digest(x.digest)) return false;
  return true;
}

// An entry name as an op carries it: longer than kNameWireBytesMax is malformed (longer than NAME_MAX is an
// errno, for the service to return).
bool get_name(ByteReader& r, std::string& name, FsDecodeError& e) {
  return get_string16(r, kNameWireBytesMax, name, e, FsDecodeError::kNameTooLongOnWire);
}

// Each op's own fields, encoder and decoder side by side; a decoder leaves the fields its op does not use at
// their defaults. `earlier` are the ops before this one (what a result reference may name).

// GETATTR, READLINK, STATFS, FSYNC: the object.
void put_handle_only(ByteWriter& w, const Op& op) { put_handle(w, op.handle); }
bool get_handle_only(ByteReader& r, const std::vector<Op>& earlier, Op& op, FsDecodeError& e) {
  return get_handle(r, earlier, op.handle, e);
}

// LOOKUP, REMOVE, RMDIR: the directory and the name in it.
void put_dir_name(ByteWriter& w, const Op& op) {
  put_handle(w, op.handle);
  put_string16(w, op.name);
}
bool get_dir_name(ByteReader& r, const std::vector<Op>& earlier, Op& op, FsDecodeError& e) {
  return get_handle(r, earlier, op.handle, e) && get_name(r, op.name, e);
}

// SETATTR: the mask, then the fields its bits name, in bit order ("now" bits carry no field).
void put_setattr(ByteWriter& w, const Op& op) {
  put_handle(w, op.handle);
  w.u8(op.mask);
  if (op.mask & setattr::kMode) w.u32(op.mode);
  if (op.mask & setattr::kUid) w.u32(op.uid);
  if (op.mask & setattr::kGid) w.u32(op.gid);
  if (op.mask & setattr::kSize) w.u64(op.size);
  if (op.mask & setattr::kAtime) w.u64(op.atime_ns);
  if (op.mask & setattr::kMtime) w.u64(op.mtime_ns);
}
bool get_setattr(ByteReader& r, const std::vector<Op>& earlier, Op& op, FsDecodeError& e) {
  if (!get_handle(r, earlier, op.handle, e) || !r.u8(op.mask)) return false;
  if ((op.mask & setattr::kAtime) && (op.mask & setattr::kAtimeNow)) {
    return reject(r, e, FsDecodeError::kBadSetattrMask);
  }
  if ((op.mask & setattr::kMtime) && (op.mask & setattr::kMtimeNow)) {
    return reject(r, e, FsDecodeError::kBadSetattrMask);
  }
  if ((op.mask & setattr::kMode) && !r.u32(op.mode)) return false;
  if ((op.mask & setattr::kUid) && !r.u32(op.uid)) return false;
  if ((op.mask & setattr::kGid) && !r.u32(op.gid)) return false;
  if ((op.mask & setattr::kSize) && !r.u64(op.size)) return false;
  if ((op.mask & setattr::kAtime) && !r.u64(op.atime_ns)) return false;
  if ((op.mask & setattr::kMtime) && !r.u64(op.mtime_ns)) return false;
  return true;
}

void put_read(ByteWriter& w, const Op& op) {
  put_handle(w, op.handle);
  w.u64(op.offset);
  w.u32(op.count);
}
bool get_read(ByteReader& r, const std::vector<Op>& earlier, Op& op, FsDecodeError& e) {
  if (!get_handle(r, earlier, op.handle, e) || !r.u64(op.offset) || !r.u32(op.count)) return false;
  if (op.count > kIoBytesMax) return reject(r, e, FsDecodeError::kIoTooLarge);
  return true;
}

void put_write(ByteWriter& w, const Op& op) {
  put_handle(w, op.handle);
  w.u64(op.offset);
  w.u8(op.append ? 1 : 0);
  w.blob(op.data);
}
bool get_write(ByteReader& r, const std::vector<Op>& earlier, Op& op, FsDecodeError& e) {
  std::uint32_t n = 0;
  if (!get_handle(r, earlier, op.handle, e) || !r.u64(op.offset) || !get_bool(r, op.append, e)) return false;
  if (op.append && op.offset != 0) return reject(r, e, FsDecodeError::kAppendWithOffset);
  if (!r.u32(n)) return false;
  if (n > kIoBytesMax) return reject(r, e, FsDecodeError::kIoTooLarge);
  return r.bytes(n, op.data);
}

void put_access(ByteWriter& w, const Op& op) {
  put_handle(w, op.handle);
  w.u8(op.access);
}
bool get_access(ByteReader& r, const std::vector<Op>& earlier, Op& op, FsDecodeError& e) {
  if (!get_handle(r, earlier, op.handle, e) || !r.u8(op.access)) return false;
  if (op.access > 7) return reject(r, e, FsDecodeError::kBadAccessMask);
  return true;
}

void put_create(ByteWriter& w, const Op& op) {
  put_dir_name(w, op);
  w.u32(op.mode);
  w.u8(op.exclusive ? 1 : 0);
}
bool get_create(ByteReader& r, const std::vector<Op>& earlier, Op& op, FsDecodeError& e) {
  return get_dir_name(r, earlier, op, e) && r.u32(op.mode) && get_bool(r, op.exclusive, e);
}

void put_mkdir(ByteWriter& w, const Op& op) {
  put_dir_name(w, op);
  w.u32(op.mode);
}
bool get_mkdir(ByteReader& r, const std::vector<Op>& earlier, Op& op, FsDecodeError& e) {
  return get_dir_name(r, earlier, op, e) && r.u32(op.mode);
}

void put_mknod(ByteWriter& w, const Op& op) {
  put_dir_name(w, op);
  w.u32(op.mode);
  w.u8(static_cast<std::uint8_t>(op.node_type));
  w.u64(op.rdev);
}
bool get_mknod(ByteReader& r, const std::vector<Op>& earlier, Op& op, FsDecodeError& e) {
  std::uint8_t type = 0;
  if (!get_dir_name(r, earlier, op, e)) return false;
  if (!r.u32(op.mode) || !r.u8(type)) return false;
  if (type < static_cast<std::uint8_t>(FileType::kFifo)) return reject(r, e, FsDecodeError::kBadNodeType);
  if (type > kFileTypeMax) return reject(r, e, FsDecodeError::kBadNodeType);
  op.node_type = static_cast<FileType>(type);
  return r.u64(op.rdev);
}

void put_rename(ByteWriter& w, const Op& op) {
  put_dir_name(w, op);
  put_handle(w, op.handle2);
  put_string16(w, op.name2);
}
bool get_rename(ByteReader& r, const std::vector<Op>& earlier, Op& op, FsDecodeError& e) {
  return get_dir_name(r, earlier, op, e) && get_handle(r, earlier, op.handle2, e) && get_name(r, op.name2, e);
}

void put_link(ByteWriter& w, const Op& op) {
  put_handle(w, op.handle);
  put_handle(w, op.handle2);
  put_string16(w, op.name);
}
bool get_link(ByteReader& r, const std::vector<Op>& earlier, Op& op, FsDecodeError& e) {
  return get_handle(r, earlier, op.handle, e) && get_handle(r, earlier, op.handle2, e) && get_name(r, op.name, e);
}

void put_symlink(ByteWriter& w, const Op& op) {
  put_dir_name(w, op);
  put_string16(w, op.target);
}
bool get_symlink(ByteReader& r, const std::vector<Op>& earlier, Op& op, FsDecodeError& e) {
  return get_dir_name(r, earlier, op, e) &&
         get_string16(r, kSymlinkWireBytesMax, op.target, e, FsDecodeError::kTargetTooLongOnWire);
}

// READDIR, READDIRPLUS.
void put_readdir(ByteWriter& w, const Op& op) {
  put_handle(w, op.handle);
  w.u64(op.cookie);
  w.u32(op.count);
}
bool get_readdir(ByteReader& r, const std::vector<Op>& earlier, Op& op, FsDecodeError& e) {
  if (!get_handle(r, earlier, op.handle, e) || !r.u64(op.cookie) || !r.u32(op.count)) return false;
  if (op.count == 0) return reject(r, e, FsDecodeError::kBadReaddirCount);
  if (op.count > kReaddirEntriesMax) return reject(r, e, FsDecodeError::kBadReaddirCount);
  return true;
}

// The encoder and decoder of each op's own fields, indexed by op code - 1.
struct OpBodyCodec {
  OpCode code;
  void (*put)(ByteWriter& w, const Op& op);
  bool (*get)(ByteReader& r, const std::vector<Op>& earlier, Op& op, FsDecodeError& e);
};
constexpr std::array<OpBodyCodec, kOpCodeMax> kOpBodies = {{
    {OpCode::kLookup, put_dir_name, get_dir_name},
    {OpCode::kGetattr, put_handle_only, get_handle_only},
    {OpCode::kSetattr, put_setattr, get_setattr},
    {OpCode::kRead, put_read, get_read},
    {OpCode::kWrite, put_write, get_write},
    {OpCode::kCreate, put_create, get_create},
    {OpCode::kRemove, put_dir_name, get_dir_name},
    {OpCode::kMkdir, put_mkdir, get_mkdir},
    {OpCode::kRmdir, put_dir_name, get_dir_name},
    {OpCode::kRename, put_rename, get_rename},
    {OpCode::kLink, put_link, get_link},
    {OpCode::kSymlink, put_symlink, get_symlink},
    {OpCode::kReadlink, put_handle_only, get_handle_only},
    {OpCode::kReaddir, put_readdir, get_readdir},
    {OpCode::kStatfs, put_handle_only, get_handle_only},
    {OpCode::kFsync, put_handle_only, get_handle_only},
    {OpCode::kReaddirPlus, put_readdir, get_readdir},
    {OpCode::kMknod, put_mknod, get_mknod},
    {OpCode::kAccess, put_access, get_access},
    {OpCode::kTime, put_time, get_time},
    {OpCode::kFetch, put_fetch, get_fetch},
    {OpCode::kReserve, put_reserve, get_reserve},
    {OpCode::kStage, put_stage, get_stage},
    {OpCode::kEpoch, put_epoch, get_epoch},
    {OpCode::kStreamClose, put_stream_close, get_stream_close},
}};

constexpr bool in_code_order(const std::array<OpBodyCodec, kOpCodeMax>& table) {
  for (std::size_t i = 0; i < table.size(); ++i) {
    if (static_cast<std::size_t>(table[i].code) != i + 1) return false;
  }
  return true;
}
static_assert(in_code_order(kOpBodies), "kOpBodies[i] must be the codec of op code i + 1");

const OpBodyCodec& op_body(OpCode code) {
  const auto i = static_cast<std::size_t>(code);
  BFT_ASSERT(i >= 1);
  BFT_ASSERT(i <= kOpBodies.size());
  return kOpBodies[i - 1];
}

void put_op(ByteWriter& w, const Op& op) {
  w.u8(static_cast<std::uint8_t>(op.code));
  put_cred(w, op.cred);
  put_expect(w, op.expect);
  op_body(op.code).put(w, op);
}

// Decodes one op (`earlier` already decoded, for result references). Leaves unused fields at defaults. In an
// entry's request (`entry`) only codes up to kEntryOpCodeMax are read on: no op nests a request deeper.
bool get_op(ByteReader& r, const std::vector<Op>& earlier, Op& op, FsDecodeError& e, bool entry) {
  std::uint8_t code = 0;
  if (!r.u8(code)) return false;
  if (code < 1 || code > kOpCodeMax) return reject(r, e, FsDecodeError::kBadOpCode);
  if (entry && code > kEntryOpCodeMax) return reject(r, e, FsDecodeError::kStreamOpInEntry);
  op.code = static_cast<OpCode>(code);
  if (!get_cred(r, op.cred, e)) return false;
  if (!get_expect(r, op.expect, e)) return false;
  return op_body(op.code).get(r, earlier, op, e);
}

bool is_stream_op(OpCode code) { return code >= OpCode::kReserve; }

// Decodes a request; `entry`: an entry's or a traced request (decode_entry_request).
FsDecodeError decode_request_in(std::span<const std::uint8_t> bytes, Request& out, bool entry) {
  ByteReader r(bytes);
  FsDecodeError e = FsDecodeError::kOk;
  std::uint8_t version = 0;
  std::uint8_t n = 0;
  if (!r.u8(version)) return FsDecodeError::kTruncated;
  if (version != kFsWireVersion) return FsDecodeError::kBadVersion;
  if (!r.u8(n)) return FsDecodeError::kTruncated;
  if (n == 0 || n > kCompoundOpsMax) return FsDecodeError::kBadOpCount;
  Request req;
  req.ops.reserve(n);
  std::size_t result_bytes = kResultHeaderBytes;
  for (std::uint8_t i = 0; i < n; ++i) {
    Op op;
    if (!get_op(r, req.ops, op, e, entry)) return reason(r, e);
    if (is_stream_op(op.code) && n != 1) return FsDecodeError::kStreamOpNotAlone;
    result_bytes += worst_case_result_bytes(op);
    req.ops.push_back(std::move(op));
  }
  if (!r.done()) return reason(r, e);
  if (entry && req.ops.front().code != OpCode::kTime) return FsDecodeError::kEntryWithoutTime;
  if (result_bytes > kFsResultBytesMax) return FsDecodeError::kResultTooLarge;
  out = std::move(req);
  return FsDecodeError::kOk;
}

}  // namespace

namespace codec_internal {

FsDecodeError decode_entry_request(std::span<const std::uint8_t> bytes, Request& out) {
  return decode_request_in(bytes, out, true);
}

bool get_op_result(ByteReader& r, OpResult& res, FsDecodeError& e, bool nested) {
  std::uint8_t code = 0;
  if (!r.u8(code)) return false;
  if (code < 1 || code > kOpCodeMax) return reject(r, e, FsDecodeError::kBadOpCode);
  if (nested && code > kEntryOpCodeMax) return reject(r, e, FsDecodeError::kStreamOpInEntry);
  res.code = static_cast<OpCode>(code);
  if (!r.u32(res.err)) return false;
  if (res.err != err::kOk) return true;
  if (returns_attr(res.code) && !get_attr(r, res.attr, e)) return false;
  if (code > kFileOpCodeMax) return get_speculation_result(r, res, e);
  switch (res.code) {
    case OpCode::kRead: {
      std::uint32_t n = 0;
      if (!get_bool(r, res.eof, e) || !r.u32(n)) return false;
      if (n > kIoBytesMax) return reject(r, e, FsDecodeError::kBadReadLength);
      return r.bytes(n, res.data);
    }
    case OpCode::kWrite:
      return r.u32(res.count);
    case OpCode::kAccess:
      if (!r.u8(res.granted)) return false;
      if (res.granted > 7) return reject(r, e, FsDecodeError::kBadAccessMask);
      return true;
    case OpCode::kReadlink:
      return get_string16(r, kSymlinkBytesMax, res.target, e, FsDecodeError::kTargetTooLongOnWire);
    case OpCode::kReaddir:
    case OpCode::kReaddirPlus: {
      std::uint32_t n = 0;
      if (!get_bool(r, res.eof, e) || !r.u32(n)) return false;
      if (n > kReaddirEntriesMax) return reject(r, e, FsDecodeError::kBadReaddirCount);
      res.entries.resize(n);
      for (auto& d : res.entries) {
        if (!r.u64(d.cookie) || !r.u64(d.ino) || !get_file_type(r, d.type, e)) return false;
        if (!get_string16(r, kNameBytesMax, d.name, e, FsDecodeError::kNameTooLongOnWire)) return false;
        if (res.code == OpCode::kReaddirPlus && !get_attr(r, d.attr, e)) return false;
      }
      return true;
    }
    case OpCode::kStatfs:
      return r.u32(res.statfs.bsize) && r.u64(res.statfs.blocks) && r.u64(res.statfs.bfree) &&
             r.u64(res.statfs.bavail) && r.u64(res.statfs.files) && r.u64(res.statfs.ffree) &&
             r.u32(res.statfs.namemax);
    default:
      return true;
  }
}

}  // namespace codec_internal

bool returns_attr(OpCode code) {
  if (static_cast<std::uint8_t>(code) > kFileOpCodeMax) return false;
  switch (code) {
    case OpCode::kRemove:
    case OpCode::kRmdir:
    case OpCode::kRename:
    case OpCode::kReadlink:
    case OpCode::kReaddir:
    case OpCode::kReaddirPlus:
    case OpCode::kStatfs:
      return false;
    default:
      return true;
  }
}

bool is_read_only(OpCode code) {
  switch (code) {
    case OpCode::kLookup:
    case OpCode::kGetattr:
    case OpCode::kRead:
    case OpCode::kReadlink:
    case OpCode::kReaddir:
    case OpCode::kReaddirPlus:
    case OpCode::kStatfs:
    case OpCode::kAccess:
    case OpCode::kTime:
    case OpCode::kFetch:
      return true;
    default:
      return false;
  }
}

std::string_view to_string(FsDecodeError e) {
  switch (e) {
    case FsDecodeError::kOk: return "ok";
    case FsDecodeError::kTruncated: return "truncated";
    case FsDecodeError::kTrailingBytes: return "trailing bytes";
    case FsDecodeError::kBadVersion: return "unknown version";
    case FsDecodeError::kBadOpCount: return "op count not in 1..64";
    case FsDecodeError::kBadOpCode: return "unknown op code";
    case FsDecodeError::kTooManyGroups: return "more than 16 supplementary groups";
    case FsDecodeError::kBadExpectKind: return "unknown predicate kind";
    case FsDecodeError::kBadHandleTag: return "unknown handle tag";
    case FsDecodeError::kBadHandleRef: return "handle refers to a later op or one without attributes";
    case FsDecodeError::kNameTooLongOnWire: return "name longer than the wire allows";
    case FsDecodeError::kTargetTooLongOnWire: return "symlink target longer than the wire allows";
    case FsDecodeError::kBadSetattrMask: return "a time both given and now";
    case FsDecodeError::kIoTooLarge: return "read or write larger than 512 KiB";
    case FsDecodeError::kBadBoolean: return "boolean not 0 or 1";
    case FsDecodeError::kBadReaddirCount: return "readdir count not in 1..1024";
    case FsDecodeError::kResultTooLarge: return "worst-case result larger than 1 MiB";
    case FsDecodeError::kBadOutcome: return "unknown outcome";
    case FsDecodeError::kBadErrno: return "errno inconsistent with the outcome";
    case FsDecodeError::kBadFileType: return "unknown file type";
    case FsDecodeError::kBadResultCount: return "result count inconsistent with the outcome";
    case FsDecodeError::kBadReadLength: return "read data longer than 512 KiB";
    case FsDecodeError::kBadNodeType: return "mknod of a type that is not a FIFO, socket or device";
    case FsDecodeError::kAppendWithOffset: return "append write with a nonzero offset";
    case FsDecodeError::kBadAccessMask: return "access bits beyond r/w/x";
    case FsDecodeError::kStreamOpNotAlone: return "a stream op with other ops in its request";
    case FsDecodeError::kStreamOpInEntry: return "an entry or traced request holding FETCH or a stream op";
    case FsDecodeError::kEntryWithoutTime: return "an entry or traced request whose op 0 is not TIME";
    case FsDecodeError::kBadEntryExpect: return "an entry's expected outcome, stop and errno disagree";
    case FsDecodeError::kBadEntryCount: return "entry count not in the op's range";
    case FsDecodeError::kBadFetchMode: return "fetch mode not 0 or 1";
    case FsDecodeError::kBadKeyCount: return "fetch key count not in 1..256";
    case FsDecodeError::kBadKey: return "key of an unknown kind or with too long a name";
    case FsDecodeError::kBadReserveCount: return "reserve count not in 1..4096";
    case FsDecodeError::kBadPart: return "part number or count beyond 4096";
    case FsDecodeError::kBadEpoch: return "epoch 0, or not above the previous epoch";
    case FsDecodeError::kBadFact: return "unknown fact, too long a value, or next below its key";
    case FsDecodeError::kTooManyFacts: return "facts beyond 768 KiB";
    case FsDecodeError::kBadVerdict: return "epoch verdict unknown or inconsistent with its fields";
  }
  return "unknown decode error";
}

bool is_request_error(FsDecodeError e) {
  switch (e) {
    case FsDecodeError::kTruncated:
    case FsDecodeError::kTrailingBytes:
    case FsDecodeError::kBadVersion:
    case FsDecodeError::kBadOpCount:
    case FsDecodeError::kBadOpCode:
    case FsDecodeError::kTooManyGroups:
    case FsDecodeError::kBadExpectKind:
    case FsDecodeError::kBadHandleTag:
    case FsDecodeError::kBadHandleRef:
    case FsDecodeError::kNameTooLongOnWire:
    case FsDecodeError::kTargetTooLongOnWire:
    case FsDecodeError::kBadSetattrMask:
    case FsDecodeError::kIoTooLarge:
    case FsDecodeError::kBadBoolean:
    case FsDecodeError::kBadReaddirCount:
    case FsDecodeError::kResultTooLarge:
    case FsDecodeError::kBadNodeType:
    case FsDecodeError::kAppendWithOffset:
    case FsDecodeError::kBadAccessMask:
    case FsDecodeError::kStreamOpNotAlone:
    case FsDecodeError::kStreamOpInEntry:
    case FsDecodeError::kEntryWithoutTime:
    case FsDecodeError::kBadEntryExpect:
    case FsDecodeError::kBadEntryCount:
    case FsDecodeError::kBadFetchMode:
    case FsDecodeError::kBadKeyCount:
    case FsDecodeError::kBadKey:
    case FsDecodeError::kBadReserveCount:
    case FsDecodeError::kBadPart:
    case FsDecodeError::kBadEpoch:
      return true;
    default:
      return false;
  }
}

std::size_t worst_case_result_bytes(const Op& op) {
  std::size_t body = 0;
  if (returns_attr(op.code)) body += kAttrBytes;
  switch (op.code) {
    case OpCode::kRead: body += 1 + 4 + op.count; break;
    case OpCode::kWrite: body += 4; break;
    case OpCode::kAccess: body += 1; break;
    case OpCode::kReadlink: body += 2 + kSymlinkBytesMax; break;
    case OpCode::kReaddir: body += 1 + 4 + static_cast<std::size_t>(op.count) * kDirEntryBytesMax; break;
    case OpCode::kReaddirPlus:
      body += 1 + 4 + static_cast<std::size_t>(op.count) * (kDirEntryBytesMax + kAttrBytes);
      break;
    case OpCode::kStatfs: body += 4 + 5 * 8 + 4; break;
    default: body += speculation_result_body_bytes_max(op); break;
  }
  return kOpResultHeaderBytes + body;
}

Bytes encode_request(const Request& r) {
  BFT_ASSERT(!r.ops.empty());
  BFT_ASSERT(r.ops.size() <= kCompoundOpsMax);
  Bytes out;
  ByteWriter w(out);
  w.u8(kFsWireVersion);
  w.u8(static_cast<std::uint8_t>(r.ops.size()));
  for (const Op& op : r.ops) put_op(w, op);
  return out;
}

FsDecodeError decode_request(std::span<const std::uint8_t> bytes, Request& out) {
  return decode_request_in(bytes, out, false);
}

void encode_op_result(const OpResult& res, Bytes& out) {
  ByteWriter w(out);
  w.u8(static_cast<std::uint8_t>(res.code));
  w.u32(res.err);
  if (res.err != err::kOk) return;
  if (returns_attr(res.code)) put_attr(w, res.attr);
  switch (res.code) {
    case OpCode::kRead:
      BFT_ASSERT(res.data.size() <= kIoBytesMax);
      w.u8(res.eof ? 1 : 0);
      w.blob(res.data);
      break;
    case OpCode::kWrite:
      w.u32(res.count);
      break;
    case OpCode::kAccess:
      w.u8(res.granted);
      break;
    case OpCode::kReadlink:
      put_string16(w, res.target);
      break;
    case OpCode::kReaddir:
    case OpCode::kReaddirPlus:
      w.u8(res.eof ? 1 : 0);
      w.u32(static_cast<std::uint32_t>(res.entries.size()));
      for (const DirEntry& d : res.entries) {
        w.u64(d.cookie);
        w.u64(d.ino);
        w.u8(static_cast<std::uint8_t>(d.type));
        put_string16(w, d.name);
        if (res.code == OpCode::kReaddirPlus) put_attr(w, d.attr);
      }
      break;
    case OpCode::kStatfs:
      w.u32(res.statfs.bsize);
      w.u64(res.statfs.blocks);
      w.u64(res.statfs.bfree);
      w.u64(res.statfs.bavail);
      w.u64(res.statfs.files);
      w.u64(res.statfs.ffree);
      w.u32(res.statfs.namemax);
      break;
    default:
      put_speculation_result(w, res);
      break;
  }
}

Bytes encode_op_result(const OpResult& r) {
  Bytes out;
  encode_op_result(r, out);
  return out;
}

Digest op_result_digest(const OpResult& r) { return digest_of(encode_op_result(r)); }

Bytes encode_result(const Result& r) {
  BFT_ASSERT(r.results.size() <= kCompoundOpsMax);
  Bytes out;
  ByteWriter w(out);
  w.u8(static_cast<std::uint8_t>(r.outcome));
  w.u8(r.stop);
  w.u8(static_cast<std::uint8_t>(r.results.size()));
  for (const OpResult& res : r.results) encode_op_result(res, out);
  return out;
}

FsDecodeError decode_result(std::span<const std::uint8_t> bytes, Result& out) {
  ByteReader r(bytes);
  FsDecodeError e = FsDecodeError::kOk;
  std::uint8_t outcome = 0;
  std::uint8_t n = 0;
  Result res;
  if (!r.u8(outcome) || !r.u8(res.stop) || !r.u8(n)) return FsDecodeError::kTruncated;
  if (outcome > static_cast<std::uint8_t>(Outcome::kMalformed)) return FsDecodeError::kBadOutcome;
  res.outcome = static_cast<Outcome>(outcome);
  if (n > kCompoundOpsMax) return FsDecodeError::kBadResultCount;
  switch (res.outcome) {
    case Outcome::kDone:
      if (n == 0 || res.stop != 0) return FsDecodeError::kBadResultCount;
      break;
    case Outcome::kOpFailed:
    case Outcome::kPredicateFailed:
      if (static_cast<std::size_t>(res.stop) + 1 != n) return FsDecodeError::kBadResultCount;
      break;
    case Outcome::kMalformed:
      if (n != 0) return FsDecodeError::kBadResultCount;
      if (!is_request_error(static_cast<FsDecodeError>(res.stop))) {
        return FsDecodeError::kBadOutcome;
      }
      break;
  }
  res.results.resize(n);
  for (auto& op_res : res.results) {
    if (!get_op_result(r, op_res, e, false)) return reason(r, e);
  }
  if (!r.done()) return reason(r, e);
  if (res.outcome == Outcome::kOpFailed && res.results.back().err == err::kOk) return FsDecodeError::kBadErrno;
  out = std::move(res);
  return FsDecodeError::kOk;
}

}  // namespace bftfs::fs
