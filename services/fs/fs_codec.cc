// The file service's wire format; see fs_codec.h and docs/FILESERVICE.md §1.
#include "services/fs/fs_codec.h"

#include "common/assert.h"
#include "common/codec.h"
#include "common/crypto.h"

namespace bftfs::fs {

namespace {

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
  if (n > max_bytes) {
    e = too_long;
    return r.fail();
  }
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
  if (tag != 1) {
    e = FsDecodeError::kBadHandleTag;
    return r.fail();
  }
  h.is_ref = true;
  if (!r.u8(h.ref)) return false;
  if (h.ref >= earlier.size()) {
    e = FsDecodeError::kBadHandleRef;
    return r.fail();
  }
  if (!returns_attr(earlier[h.ref].code)) {
    e = FsDecodeError::kBadHandleRef;
    return r.fail();
  }
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
  if (v < 1 || v > kFileTypeMax) {
    e = FsDecodeError::kBadFileType;
    return r.fail();
  }
  t = static_cast<FileType>(v);
  return true;
}

bool get_attr(ByteReader& r, Attr& a, FsDecodeError& e) {
  if (!r.u64(a.ino) || !r.u64(a.generation)) return false;
  if (!get_file_type(r, a.type, e)) return false;
  return r.u32(a.mode) && r.u32(a.nlink) && r.u32(a.uid) && r.u32(a.gid) && r.u64(a.size) && r.u64(a.blocks) &&
         r.u64(a.atime_ns) && r.u64(a.mtime_ns) && r.u64(a.ctime_ns) && r.u64(a.rdev);
}

bool get_bool(ByteReader& r, bool& v, FsDecodeError& e) {
  std::uint8_t b = 0;
  if (!r.u8(b)) return false;
  if (b > 1) {
    e = FsDecodeError::kBadBoolean;
    return r.fail();
  }
  v = b == 1;
  return true;
}

void put_op(ByteWriter& w, const Op& op) {
  w.u8(static_cast<std::uint8_t>(op.code));
  w.u32(op.cred.uid);
  w.u32(op.cred.gid);
  BFT_ASSERT(op.cred.groups.size() <= kGroupsMax);
  w.u8(static_cast<std::uint8_t>(op.cred.groups.size()));
  for (std::uint32_t g : op.cred.groups) w.u32(g);
  w.u8(static_cast<std::uint8_t>(op.expect.kind));
  if (op.expect.kind == ExpectKind::kErrno) w.u32(op.expect.err);
  if (op.expect.kind == ExpectKind::kDigest) w.digest(op.expect.digest);
  switch (op.code) {
    case OpCode::kLookup:
    case OpCode::kRemove:
    case OpCode::kRmdir:
      put_handle(w, op.handle);
      put_string16(w, op.name);
      break;
    case OpCode::kGetattr:
    case OpCode::kReadlink:
    case OpCode::kStatfs:
    case OpCode::kFsync:
      put_handle(w, op.handle);
      break;
    case OpCode::kSetattr:
      put_handle(w, op.handle);
      w.u8(op.mask);
      if (op.mask & setattr::kMode) w.u32(op.mode);
      if (op.mask & setattr::kUid) w.u32(op.uid);
      if (op.mask & setattr::kGid) w.u32(op.gid);
      if (op.mask & setattr::kSize) w.u64(op.size);
      if (op.mask & setattr::kAtime) w.u64(op.atime_ns);
      if (op.mask & setattr::kMtime) w.u64(op.mtime_ns);
      break;
    case OpCode::kRead:
      put_handle(w, op.handle);
      w.u64(op.offset);
      w.u32(op.count);
      break;
    case OpCode::kWrite:
      put_handle(w, op.handle);
      w.u64(op.offset);
      w.u8(op.append ? 1 : 0);
      w.blob(op.data);
      break;
    case OpCode::kAccess:
      put_handle(w, op.handle);
      w.u8(op.access);
      break;
    case OpCode::kCreate:
      put_handle(w, op.handle);
      put_string16(w, op.name);
      w.u32(op.mode);
      w.u8(op.exclusive ? 1 : 0);
      break;
    case OpCode::kMkdir:
      put_handle(w, op.handle);
      put_string16(w, op.name);
      w.u32(op.mode);
      break;
    case OpCode::kMknod:
      put_handle(w, op.handle);
      put_string16(w, op.name);
      w.u32(op.mode);
      w.u8(static_cast<std::uint8_t>(op.node_type));
      w.u64(op.rdev);
      break;
    case OpCode::kRename:
      put_handle(w, op.handle);
      put_string16(w, op.name);
      put_handle(w, op.handle2);
      put_string16(w, op.name2);
      break;
    case OpCode::kLink:
      put_handle(w, op.handle);
      put_handle(w, op.handle2);
      put_string16(w, op.name);
      break;
    case OpCode::kSymlink:
      put_handle(w, op.handle);
      put_string16(w, op.name);
      put_string16(w, op.target);
      break;
    case OpCode::kReaddir:
    case OpCode::kReaddirPlus:
      put_handle(w, op.handle);
      w.u64(op.cookie);
      w.u32(op.count);
      break;
  }
}

// Decodes one op (ops[0..index) already decoded, for result references). Leaves unused fields at defaults.
bool get_op(ByteReader& r, const std::vector<Op>& earlier, Op& op, FsDecodeError& e) {
  std::uint8_t code = 0;
  if (!r.u8(code)) return false;
  if (code < 1 || code > kOpCodeMax) {
    e = FsDecodeError::kBadOpCode;
    return r.fail();
  }
  op.code = static_cast<OpCode>(code);
  std::uint8_t ngroups = 0;
  if (!r.u32(op.cred.uid) || !r.u32(op.cred.gid) || !r.u8(ngroups)) return false;
  if (ngroups > kGroupsMax) {
    e = FsDecodeError::kTooManyGroups;
    return r.fail();
  }
  op.cred.groups.resize(ngroups);
  for (auto& g : op.cred.groups) {
    if (!r.u32(g)) return false;
  }
  std::uint8_t kind = 0;
  if (!r.u8(kind)) return false;
  if (kind > 2) {
    e = FsDecodeError::kBadExpectKind;
    return r.fail();
  }
  op.expect.kind = static_cast<ExpectKind>(kind);
  if (op.expect.kind == ExpectKind::kErrno && !r.u32(op.expect.err)) return false;
  if (op.expect.kind == ExpectKind::kDigest && !r.digest(op.expect.digest)) return false;
  switch (op.code) {
    case OpCode::kLookup:
    case OpCode::kRemove:
    case OpCode::kRmdir:
      return get_handle(r, earlier, op.handle, e) &&
             get_string16(r, kNameWireBytesMax, op.name, e, FsDecodeError::kNameTooLongOnWire);
    case OpCode::kGetattr:
    case OpCode::kReadlink:
    case OpCode::kStatfs:
    case OpCode::kFsync:
      return get_handle(r, earlier, op.handle, e);
    case OpCode::kSetattr:
      if (!get_handle(r, earlier, op.handle, e) || !r.u8(op.mask)) return false;
      if ((op.mask & setattr::kAtime) && (op.mask & setattr::kAtimeNow)) {
        e = FsDecodeError::kBadSetattrMask;
        return r.fail();
      }
      if ((op.mask & setattr::kMtime) && (op.mask & setattr::kMtimeNow)) {
        e = FsDecodeError::kBadSetattrMask;
        return r.fail();
      }
      if ((op.mask & setattr::kMode) && !r.u32(op.mode)) return false;
      if ((op.mask & setattr::kUid) && !r.u32(op.uid)) return false;
      if ((op.mask & setattr::kGid) && !r.u32(op.gid)) return false;
      if ((op.mask & setattr::kSize) && !r.u64(op.size)) return false;
      if ((op.mask & setattr::kAtime) && !r.u64(op.atime_ns)) return false;
      if ((op.mask & setattr::kMtime) && !r.u64(op.mtime_ns)) return false;
      return true;
    case OpCode::kRead:
      if (!get_handle(r, earlier, op.handle, e) || !r.u64(op.offset) || !r.u32(op.count)) return false;
      if (op.count > kIoBytesMax) {
        e = FsDecodeError::kIoTooLarge;
        return r.fail();
      }
      return true;
    case OpCode::kWrite: {
      std::uint32_t n = 0;
      if (!get_handle(r, earlier, op.handle, e) || !r.u64(op.offset) || !get_bool(r, op.append, e)) return false;
      if (op.append && op.offset != 0) {
        e = FsDecodeError::kAppendWithOffset;
        return r.fail();
      }
      if (!r.u32(n)) return false;
      if (n > kIoBytesMax) {
        e = FsDecodeError::kIoTooLarge;
        return r.fail();
      }
      return r.bytes(n, op.data);
    }
    case OpCode::kAccess:
      if (!get_handle(r, earlier, op.handle, e) || !r.u8(op.access)) return false;
      if (op.access > 7) {
        e = FsDecodeError::kBadAccessMask;
        return r.fail();
      }
      return true;
    case OpCode::kCreate:
      return get_handle(r, earlier, op.handle, e) &&
             get_string16(r, kNameWireBytesMax, op.name, e, FsDecodeError::kNameTooLongOnWire) &&
             r.u32(op.mode) && get_bool(r, op.exclusive, e);
    case OpCode::kMkdir:
      return get_handle(r, earlier, op.handle, e) &&
             get_string16(r, kNameWireBytesMax, op.name, e, FsDecodeError::kNameTooLongOnWire) && r.u32(op.mode);
    case OpCode::kMknod: {
      std::uint8_t type = 0;
      if (!get_handle(r, earlier, op.handle, e)) return false;
      if (!get_string16(r, kNameWireBytesMax, op.name, e, FsDecodeError::kNameTooLongOnWire)) return false;
      if (!r.u32(op.mode) || !r.u8(type)) return false;
      if (type < static_cast<std::uint8_t>(FileType::kFifo) || type > kFileTypeMax) {
        e = FsDecodeError::kBadNodeType;
        return r.fail();
      }
      op.node_type = static_cast<FileType>(type);
      return r.u64(op.rdev);
    }
    case OpCode::kRename:
      return get_handle(r, earlier, op.handle, e) &&
             get_string16(r, kNameWireBytesMax, op.name, e, FsDecodeError::kNameTooLongOnWire) &&
             get_handle(r, earlier, op.handle2, e) &&
             get_string16(r, kNameWireBytesMax, op.name2, e, FsDecodeError::kNameTooLongOnWire);
    case OpCode::kLink:
      return get_handle(r, earlier, op.handle, e) && get_handle(r, earlier, op.handle2, e) &&
             get_string16(r, kNameWireBytesMax, op.name, e, FsDecodeError::kNameTooLongOnWire);
    case OpCode::kSymlink:
      return get_handle(r, earlier, op.handle, e) &&
             get_string16(r, kNameWireBytesMax, op.name, e, FsDecodeError::kNameTooLongOnWire) &&
             get_string16(r, kSymlinkWireBytesMax, op.target, e, FsDecodeError::kTargetTooLongOnWire);
    case OpCode::kReaddir:
    case OpCode::kReaddirPlus:
      if (!get_handle(r, earlier, op.handle, e) || !r.u64(op.cookie) || !r.u32(op.count)) return false;
      if (op.count == 0 || op.count > kReaddirEntriesMax) {
        e = FsDecodeError::kBadReaddirCount;
        return r.fail();
      }
      return true;
  }
  BFT_UNREACHABLE();
}

// A failed read that did not name its own reason was a short input.
FsDecodeError reason(const ByteReader& r, FsDecodeError e) {
  if (e != FsDecodeError::kOk) return e;
  if (!r.ok()) return FsDecodeError::kTruncated;
  return FsDecodeError::kTrailingBytes;
}

bool get_op_result(ByteReader& r, OpResult& res, FsDecodeError& e) {
  std::uint8_t code = 0;
  if (!r.u8(code)) return false;
  if (code < 1 || code > kOpCodeMax) {
    e = FsDecodeError::kBadOpCode;
    return r.fail();
  }
  res.code = static_cast<OpCode>(code);
  if (!r.u32(res.err)) return false;
  if (res.err != err::kOk) return true;
  if (returns_attr(res.code) && !get_attr(r, res.attr, e)) return false;
  switch (res.code) {
    case OpCode::kRead: {
      std::uint32_t n = 0;
      if (!get_bool(r, res.eof, e) || !r.u32(n)) return false;
      if (n > kIoBytesMax) {
        e = FsDecodeError::kBadReadLength;
        return r.fail();
      }
      return r.bytes(n, res.data);
    }
    case OpCode::kWrite:
      return r.u32(res.count);
    case OpCode::kAccess:
      if (!r.u8(res.granted)) return false;
      if (res.granted > 7) {
        e = FsDecodeError::kBadAccessMask;
        return r.fail();
      }
      return true;
    case OpCode::kReadlink:
      return get_string16(r, kSymlinkBytesMax, res.target, e, FsDecodeError::kTargetTooLongOnWire);
    case OpCode::kReaddir:
    case OpCode::kReaddirPlus: {
      std::uint32_t n = 0;
      if (!get_bool(r, res.eof, e) || !r.u32(n)) return false;
      if (n > kReaddirEntriesMax) {
        e = FsDecodeError::kBadReaddirCount;
        return r.fail();
      }
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

}  // namespace

bool returns_attr(OpCode code) {
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
    default: break;
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
    if (!get_op(r, req.ops, op, e)) return reason(r, e);
    result_bytes += worst_case_result_bytes(op);
    req.ops.push_back(std::move(op));
  }
  if (!r.done()) return reason(r, e);
  if (result_bytes > kFsResultBytesMax) return FsDecodeError::kResultTooLarge;
  out = std::move(req);
  return FsDecodeError::kOk;
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
    if (!get_op_result(r, op_res, e)) return reason(r, e);
  }
  if (!r.done()) return reason(r, e);
  if (res.outcome == Outcome::kOpFailed && res.results.back().err == err::kOk) return FsDecodeError::kBadErrno;
  out = std::move(res);
  return FsDecodeError::kOk;
}

}  // namespace bftfs::fs
