// The file service's ops on directory entries (see fs_service_impl.h and docs/FILESERVICE.md §2).
#include "services/fs/fs_service_impl.h"

#include <algorithm>
#include <optional>

#include "common/assert.h"
#include "services/fs/fs_permissions.h"

namespace bftfs::fs {

std::uint32_t FsService::Impl::op_lookup(const Op& op, const std::vector<OpResult>& earlier, OpResult& out) const {
  Inode dir;
  Inode child;
  std::uint32_t e = resolve(op.handle, earlier, dir);
  if (e != err::kOk) return e;
  if (dir.type != FileType::kDirectory) return err::kNotDir;
  if (!may(op.cred, dir, kWantX)) return err::kAccess;
  if (op.name == ".") {
    child = dir;
  } else if (op.name == "..") {
    e = load_linked(dir.parent, child);
    if (e != err::kOk) return e;
  } else {
    e = check_name(op.name);
    if (e != err::kOk) return e;
    NameRec nr;
    e = find_entry(dir.ino, op.name, nr);
    if (e != err::kOk) return e;
    e = load_linked(nr.ino, child);
    if (e != err::kOk) return e;
  }
  out.attr = attr_of(child);
  return err::kOk;
}

std::uint32_t FsService::Impl::make_node(const Op& op, const std::vector<OpResult>& earlier, FileType type,
                                         std::uint32_t mode, OpResult& out) {
  Inode dir;
  std::uint32_t e = resolve(op.handle, earlier, dir);
  if (e != err::kOk) return e;
  if (dir.type != FileType::kDirectory) return err::kNotDir;
  e = check_name(op.name);
  if (e != err::kOk) return e;
  if (!may(op.cred, dir, kWantX)) return err::kAccess;
  if (is_dot(op.name)) return type == FileType::kRegular && !op.exclusive ? err::kIsDir : err::kExist;
  NameRec nr;
  e = find_entry(dir.ino, op.name, nr);
  if (e == err::kOk) {
    if (type != FileType::kRegular || op.exclusive) return err::kExist;
    Inode existing;
    e = load_linked(nr.ino, existing);
    if (e != err::kOk) return e;
    if (existing.type == FileType::kDirectory) return err::kIsDir;
    out.attr = attr_of(existing);
    return err::kOk;
  }
  if (e != err::kNoEnt) return e;
  if (!may(op.cred, dir, kWantW | kWantX)) return err::kAccess;
  if (type == FileType::kDirectory && dir.nlink >= kLinkMax) return err::kMLink;
  e = check_room(dir, 0);
  if (e != err::kOk) return e;
  const bool device = type == FileType::kCharDevice || type == FileType::kBlockDevice;
  if (device && op.cred.uid != 0) return err::kPerm;  // CAP_MKNOD
  if (type == FileType::kSymlink) {
    if (op.target.empty()) return err::kNoEnt;
    if (op.target.size() > kSymlinkBytesMax) return err::kNameTooLong;
    if (op.target.find('\0') != std::string::npos) return err::kInval;
  }
  Super s = load_super();
  std::uint64_t ino = 0;
  std::uint64_t gen = 0;
  e = alloc_inode(s, ino, gen);
  if (e != err::kOk) return e;
  Inode n = new_inode(ino, gen, type, mode, op.cred, dir);
  if (type == FileType::kSymlink) {
    n.target = op.target;
    n.size = op.target.size();
  }
  if (device) n.rdev = op.rdev;
  add_entry(dir, op.name, ino, type);
  if (type == FileType::kDirectory) ++dir.nlink;
  save_inode(n);
  save_inode(dir);
  save_super(s);
  out.attr = attr_of(n);
  return err::kOk;
}

std::uint32_t FsService::Impl::op_remove(const Op& op, const std::vector<OpResult>& earlier, bool rmdir) {
  Inode dir;
  std::uint32_t e = resolve(op.handle, earlier, dir);
  if (e != err::kOk) return e;
  if (dir.type != FileType::kDirectory) return err::kNotDir;
  if (rmdir && op.name == ".") return err::kInval;
  if (rmdir && op.name == "..") return err::kNotEmpty;
  e = check_name(op.name);
  if (e != err::kOk) return e;
  if (is_dot(op.name)) return err::kIsDir;  // unlink(".") and unlink("..")
  if (!may(op.cred, dir, kWantX)) return err::kAccess;
  NameRec nr;
  e = find_entry(dir.ino, op.name, nr);
  if (e != err::kOk) return e;
  if (!may(op.cred, dir, kWantW | kWantX)) return err::kAccess;
  Inode child;
  e = load_linked(nr.ino, child);
  if (e != err::kOk) return e;
  if (sticky_denies(op.cred, dir, child)) return err::kPerm;
  if (!rmdir && child.type == FileType::kDirectory) return err::kIsDir;
  if (rmdir && child.type != FileType::kDirectory) return err::kNotDir;
  if (rmdir && child.entries > 0) return err::kNotEmpty;
  Super s = load_super();
  remove_entry(dir, op.name, nr.cookie);
  if (rmdir) {
    --dir.nlink;
    free_inode(child, s);
  } else {
    unlink_inode(child, s);
  }
  save_inode(dir);
  save_super(s);
  return err::kOk;
}

std::uint32_t FsService::Impl::op_rename(const Op& op, const std::vector<OpResult>& earlier) {
  RenamePlan plan;
  const std::uint32_t e = plan_rename(op, earlier, plan);
  if (e != err::kOk || plan.same_file) return e;
  apply_rename(op, plan);
  return err::kOk;
}

std::uint32_t FsService::Impl::plan_rename(const Op& op, const std::vector<OpResult>& earlier,
                                           RenamePlan& plan) const {
  Inode& fdir = plan.from_dir;
  Inode& tdir = plan.to_dir;
  std::uint32_t e = resolve(op.handle, earlier, fdir);
  if (e != err::kOk) return e;
  e = resolve(op.handle2, earlier, tdir);
  if (e != err::kOk) return e;
  if (fdir.type != FileType::kDirectory) return err::kNotDir;
  if (tdir.type != FileType::kDirectory) return err::kNotDir;
  e = check_name(op.name);
  if (e != err::kOk) return e;
  e = check_name(op.name2);
  if (e != err::kOk) return e;
  if (is_dot(op.name) || is_dot(op.name2)) return err::kInval;
  if (!may(op.cred, fdir, kWantX) || !may(op.cred, tdir, kWantX)) return err::kAccess;
  e = find_entry(fdir.ino, op.name, plan.src);
  if (e != err::kOk) return e;
  e = find_entry(tdir.ino, op.name2, plan.dst);
  if (e != err::kOk && e != err::kNoEnt) return e;
  plan.replaces = e == err::kOk;
  if (plan.replaces && plan.dst.ino == plan.src.ino) {
    plan.same_file = true;  // POSIX: the same file, do nothing
    return err::kOk;
  }
  if (!may(op.cred, fdir, kWantW | kWantX) || !may(op.cred, tdir, kWantW | kWantX)) return err::kAccess;
  Inode& sn = plan.moved;
  e = load_linked(plan.src.ino, sn);
  if (e != err::kOk) return e;
  if (sticky_denies(op.cred, fdir, sn)) return err::kPerm;
  const bool is_dir = sn.type == FileType::kDirectory;
  const bool moves = fdir.ino != tdir.ino;
  if (is_dir && moves) {
    if (!may(op.cred, sn, kWantW)) return err::kAccess;  // its '..' changes
    e = check_not_within(tdir.ino, sn.ino);
    if (e != err::kOk) return e;
  }
  if (plan.replaces) {
    e = check_replaced(op, plan);
    if (e != err::kOk) return e;
  }
  if (is_dir && moves && !plan.replaces && tdir.nlink >= kLinkMax) return err::kMLink;
  // The target directory loses the replaced entry, and the moved one if it is the same directory, before the
  // new name takes a position (apply_rename).
  return check_room(tdir, (plan.replaces ? 1 : 0) + (moves ? 0 : 1));
}

std::uint32_t FsService::Impl::check_not_within(std::uint64_t to_dir, std::uint64_t moved) const {
  // Walk up from the target directory to the root.
  std::uint64_t cur = to_dir;
  for (std::uint64_t steps = 0;; ++steps) {
    if (cur == moved) return err::kInval;
    if (cur == kRootIno) return err::kOk;
    if (steps > opt.inodes_max) return err::kIo;  // a cycle: inconsistent state
    Inode up;
    const std::uint32_t e = load_linked(cur, up);
    if (e != err::kOk) return e;
    cur = up.parent;
  }
}

std::uint32_t FsService::Impl::check_replaced(const Op& op, RenamePlan& plan) const {
  const bool is_dir = plan.moved.type == FileType::kDirectory;
  Inode& dn = plan.replaced;
  const std::uint32_t e = load_linked(plan.dst.ino, dn);
  if (e != err::kOk) return e;
  if (sticky_denies(op.cred, plan.to_dir, dn)) return err::kPerm;
  if (is_dir && dn.type != FileType::kDirectory) return err::kNotDir;
  if (!is_dir && dn.type == FileType::kDirectory) return err::kIsDir;
  if (dn.type == FileType::kDirectory && dn.entries > 0) return err::kNotEmpty;
  return err::kOk;
}

void FsService::Impl::apply_rename(const Op& op, RenamePlan& plan) {
  const bool is_dir = plan.moved.type == FileType::kDirectory;
  const bool moves = plan.from_dir.ino != plan.to_dir.ino;
  Inode& from = plan.from_dir;
  Inode& to = moves ? plan.to_dir : plan.from_dir;
  Inode& sn = plan.moved;
  Super s = load_super();
  if (plan.replaces) {
    Inode& dn = plan.replaced;
    remove_entry(to, op.name2, plan.dst.cookie);
    if (dn.type == FileType::kDirectory) {
      --to.nlink;
      free_inode(dn, s);
    } else {
      unlink_inode(dn, s);
    }
  }
  remove_entry(from, op.name, plan.src.cookie);
  add_entry(to, op.name2, sn.ino, sn.type);
  if (is_dir && moves) {
    --from.nlink;
    ++to.nlink;
    sn.parent = to.ino;
  }
  sn.ctime_ns = now;
  save_inode(sn);
  save_inode(from);
  if (moves) save_inode(to);
  save_super(s);
}

std::uint32_t FsService::Impl::op_link(const Op& op, const std::vector<OpResult>& earlier, OpResult& out) {
  Inode target;
  Inode dir;
  std::uint32_t e = resolve(op.handle, earlier, target);
  if (e != err::kOk) return e;
  e = resolve(op.handle2, earlier, dir);
  if (e != err::kOk) return e;
  if (target.type == FileType::kDirectory) return err::kPerm;
  if (dir.type != FileType::kDirectory) return err::kNotDir;
  e = check_name(op.name);
  if (e != err::kOk) return e;
  if (!may(op.cred, dir, kWantX)) return err::kAccess;
  if (is_dot(op.name)) return err::kExist;
  NameRec nr;
  e = find_entry(dir.ino, op.name, nr);
  if (e == err::kOk) return err::kExist;
  if (e != err::kNoEnt) return e;
  if (!may(op.cred, dir, kWantW | kWantX)) return err::kAccess;
  if (target.nlink >= kLinkMax) return err::kMLink;
  e = check_room(dir, 0);
  if (e != err::kOk) return e;
  add_entry(dir, op.name, target.ino, target.type);
  ++target.nlink;
  target.ctime_ns = now;
  save_inode(target);
  save_inode(dir);
  out.attr = attr_of(target);
  return err::kOk;
}

std::uint32_t FsService::Impl::op_readdir(const Op& op, const std::vector<OpResult>& earlier, OpResult& out) const {
  Inode dir;
  const std::uint32_t e = resolve(op.handle, earlier, dir);
  if (e != err::kOk) return e;
  if (dir.type != FileType::kDirectory) return err::kNotDir;
  if (!may(op.cred, dir, kWantR)) return err::kAccess;
  if (op.cookie < 1) out.entries.push_back(DirEntry{1, dir.ino, FileType::kDirectory, ".", Attr{}});
  if (op.cookie < 2 && out.entries.size() < op.count) {
    out.entries.push_back(DirEntry{2, dir.parent, FileType::kDirectory, "..", Attr{}});
  }
  std::uint64_t from = std::max<std::uint64_t>(op.cookie, 2);
  out.eof = true;
  if (from == UINT64_MAX) return err::kOk;
  ++from;
  for (;;) {
    const std::optional<ObjectKey> k = store.first_at_or_after(ObjectKey::entry(dir.ino, from));
    if (!k.has_value() || k->ino != dir.ino || k->kind != Kind::kEntry) break;
    if (out.entries.size() >= op.count) {
      out.eof = false;
      break;
    }
    EntryRec er;
    if (!decode_entry_rec(*get(*k), er)) return err::kIo;
    out.entries.push_back(DirEntry{k->index, er.ino, er.type, std::move(er.name), Attr{}});
    from = k->index + 1;
  }
  if (op.code == OpCode::kReaddirPlus) {
    for (DirEntry& d : out.entries) {
      Inode n;
      const std::uint32_t le = load_linked(d.ino, n);
      if (le != err::kOk) return le;
      d.attr = attr_of(n);
    }
  }
  return err::kOk;
}

}  // namespace bftfs::fs
