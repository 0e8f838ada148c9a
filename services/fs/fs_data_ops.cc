// The file service's ops on one inode: attributes and contents (see fs_service_impl.h and
// docs/FILESERVICE.md §2).
#include "services/fs/fs_service_impl.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "common/assert.h"
#include "services/fs/fs_permissions.h"

namespace bftfs::fs {

std::uint32_t FsService::Impl::op_getattr(const Op& op, const std::vector<OpResult>& earlier, OpResult& out) const {
  Inode n;
  const std::uint32_t e = resolve(op.handle, earlier, n);
  if (e != err::kOk) return e;
  out.attr = attr_of(n);
  return err::kOk;
}

std::uint32_t FsService::Impl::op_setattr(const Op& op, const std::vector<OpResult>& earlier, OpResult& out) {
  Inode n;
  const std::uint32_t e = resolve(op.handle, earlier, n);
  if (e != err::kOk) return e;
  const Cred& c = op.cred;
  const bool root = c.uid == 0;
  const bool owner = root || c.uid == n.uid;
  const std::uint8_t m = op.mask;
  // A non-owner may change the mode only to drop S_ISUID/S_ISGID, and only with write permission: that is the
  // kernel clearing the set-id bits before a non-owner's write or truncate (Linux ATTR_KILL_SUID/SGID, which
  // reaches a FUSE file system as a plain SETATTR of the mode with the writer's credentials).
  const bool kills_setid_only = (op.mode & kModeBits) == (n.mode & ~(kModeSuid | kModeSgid)) &&
                                (n.mode & (kModeSuid | kModeSgid)) != 0;
  if ((m & setattr::kMode) != 0 && !owner && !(kills_setid_only && may(c, n, kWantW))) return err::kPerm;
  if ((m & setattr::kUid) != 0 && !root && !(c.uid == n.uid && op.uid == n.uid)) return err::kPerm;
  if ((m & setattr::kGid) != 0 && !root && !(c.uid == n.uid && in_group(c, op.gid))) return err::kPerm;
  if ((m & setattr::kSize) != 0) {
    if (n.type == FileType::kDirectory) return err::kIsDir;
    if (n.type != FileType::kRegular) return err::kInval;
    if (!owner && !may(c, n, kWantW)) return err::kAccess;
    if (op.size > opt.file_bytes_max) return err::kFBig;
  }
  if ((m & (setattr::kAtime | setattr::kMtime)) != 0 && !owner) return err::kPerm;
  if ((m & (setattr::kAtimeNow | setattr::kMtimeNow)) != 0 && !owner && !may(c, n, kWantW)) {
    return err::kAccess;
  }
  if ((m & setattr::kSize) != 0) {
    Super s = load_super();
    truncate(n, s, op.size);
    save_super(s);
    if (!root) kill_setid_on_write(n, c);
    n.mtime_ns = now;
  }
  if ((m & setattr::kMode) != 0) {
    n.mode = op.mode & kModeBits;
    if (!root && !in_group(c, n.gid)) n.mode &= ~kModeSgid;
  }
  if ((m & (setattr::kUid | setattr::kGid)) != 0) {
    if ((m & setattr::kUid) != 0) n.uid = op.uid;
    if ((m & setattr::kGid) != 0) n.gid = op.gid;
    if (n.type != FileType::kDirectory) kill_suid(n);
  }
  if ((m & setattr::kAtime) != 0) n.atime_ns = op.atime_ns;
  if ((m & setattr::kAtimeNow) != 0) n.atime_ns = now;
  if ((m & setattr::kMtime) != 0) n.mtime_ns = op.mtime_ns;
  if ((m & setattr::kMtimeNow) != 0) n.mtime_ns = now;
  n.ctime_ns = now;
  save_inode(n);
  out.attr = attr_of(n);
  return err::kOk;
}

void FsService::Impl::truncate(Inode& n, Super& s, std::uint64_t size) {
  if (size < n.size) {
    erase_blocks_from(n, s, size / kBlockBytes + (size % kBlockBytes != 0 ? 1 : 0));
    const std::uint64_t keep = size % kBlockBytes;
    if (keep != 0) {
      const ObjectKey k = ObjectKey::data(n.ino, size / kBlockBytes);
      const Value v = get(k);
      if (v != nullptr && v->size() > keep) {
        n.stored_bytes -= v->size() - keep;
        put(k, Bytes(v->begin(), v->begin() + static_cast<std::ptrdiff_t>(keep)));
      }
    }
  }
  n.size = size;
}

std::uint32_t FsService::Impl::op_read(const Op& op, const std::vector<OpResult>& earlier, OpResult& out) const {
  Inode n;
  const std::uint32_t e = resolve(op.handle, earlier, n);
  if (e != err::kOk) return e;
  if (n.type == FileType::kDirectory) return err::kIsDir;
  if (n.type != FileType::kRegular) return err::kInval;
  if (!may(op.cred, n, kWantR)) return err::kAccess;
  std::uint64_t len = 0;
  if (op.offset < n.size) len = std::min<std::uint64_t>(op.count, n.size - op.offset);
  out.data.assign(len, 0);
  const std::uint64_t end = op.offset + len;
  for (std::uint64_t pos = op.offset; pos < end;) {
    const std::uint64_t block = pos / kBlockBytes;
    const std::uint64_t in = pos % kBlockBytes;
    const std::uint64_t chunk = std::min<std::uint64_t>(kBlockBytes - in, end - pos);
    const Value v = get(ObjectKey::data(n.ino, block));
    if (v != nullptr && v->size() > in) {
      const std::uint64_t have = std::min<std::uint64_t>(chunk, v->size() - in);
      std::memcpy(out.data.data() + (pos - op.offset), v->data() + in, have);
    }
    pos += chunk;
  }
  out.eof = end >= n.size;
  out.attr = attr_of(n);
  return err::kOk;
}

std::uint32_t FsService::Impl::op_write(const Op& op, const std::vector<OpResult>& earlier, OpResult& out) {
  Inode n;
  const std::uint32_t e = resolve(op.handle, earlier, n);
  if (e != err::kOk) return e;
  if (n.type == FileType::kDirectory) return err::kIsDir;
  if (n.type != FileType::kRegular) return err::kInval;
  if (!may(op.cred, n, kWantW)) return err::kAccess;
  const std::uint64_t len = op.data.size();
  const std::uint64_t offset = op.append ? n.size : op.offset;  // append: atomic at the size agreed now
  if (len == 0) {
    out.attr = attr_of(n);
    return err::kOk;
  }
  if (offset > opt.file_bytes_max || len > opt.file_bytes_max - offset) return err::kFBig;
  const std::uint64_t end = offset + len;
  const std::uint64_t first = offset / kBlockBytes;
  const std::uint64_t last = (end - 1) / kBlockBytes;
  std::uint64_t fresh = 0;
  for (std::uint64_t b = first; b <= last; ++b) {
    if (get(ObjectKey::data(n.ino, b)) == nullptr) ++fresh;
  }
  Super s = load_super();
  if (s.used_blocks + fresh > capacity_blocks()) return err::kNoSpc;
  for (std::uint64_t b = first; b <= last; ++b) {
    const ObjectKey k = ObjectKey::data(n.ino, b);
    const Value old = get(k);
    Bytes block = old != nullptr ? *old : Bytes{};
    const std::uint64_t base = b * kBlockBytes;
    const std::uint64_t from = std::max(offset, base) - base;
    const std::uint64_t to = std::min(end, base + kBlockBytes) - base;
    if (block.size() < to) {
      n.stored_bytes += to - block.size();
      block.resize(to, 0);
    }
    std::memcpy(block.data() + from, op.data.data() + (base + from - offset), to - from);
    put(k, std::move(block));
  }
  n.stored_blocks += fresh;
  s.used_blocks += fresh;
  n.size = std::max(n.size, end);
  n.mtime_ns = now;
  n.ctime_ns = now;
  if (op.cred.uid != 0) kill_setid_on_write(n, op.cred);
  save_inode(n);
  save_super(s);
  out.count = static_cast<std::uint32_t>(len);
  out.attr = attr_of(n);
  return err::kOk;
}

std::uint32_t FsService::Impl::op_readlink(const Op& op, const std::vector<OpResult>& earlier, OpResult& out) const {
  Inode n;
  const std::uint32_t e = resolve(op.handle, earlier, n);
  if (e != err::kOk) return e;
  if (n.type != FileType::kSymlink) return err::kInval;
  out.target = n.target;
  return err::kOk;
}

std::uint32_t FsService::Impl::op_access(const Op& op, const std::vector<OpResult>& earlier, OpResult& out) const {
  Inode n;
  const std::uint32_t e = resolve(op.handle, earlier, n);
  if (e != err::kOk) return e;
  for (std::uint32_t bit : {kWantR, kWantW, kWantX}) {
    if ((op.access & bit) != 0 && may(op.cred, n, bit)) out.granted = static_cast<std::uint8_t>(out.granted | bit);
  }
  out.attr = attr_of(n);
  return err::kOk;
}

std::uint32_t FsService::Impl::op_statfs(const Op& op, const std::vector<OpResult>& earlier, OpResult& out) const {
  Inode n;
  const std::uint32_t e = resolve(op.handle, earlier, n);
  if (e != err::kOk) return e;
  const Super s = load_super();
  out.statfs.bsize = kBlockBytes;
  out.statfs.blocks = capacity_blocks();
  out.statfs.bfree = capacity_blocks() - std::min(s.used_blocks, capacity_blocks());
  out.statfs.bavail = out.statfs.bfree;
  out.statfs.files = opt.inodes_max;
  out.statfs.ffree = opt.inodes_max - std::min(s.used_inodes, opt.inodes_max);
  out.statfs.namemax = kNameBytesMax;
  return err::kOk;
}

}  // namespace bftfs::fs
