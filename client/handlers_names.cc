// The FUSE handlers of names and entries: lookup, forget, mknod, mkdir, symlink, link, unlink, rmdir, rename.
// Each replies exactly once through the freply_* wrappers; client/fuse_client_impl.h lists each one's valid
// replies. A mutation that changes directories carries a GETATTR of each of them in the same compound request
// (with_dir_attrs), so the kernel's next question about them costs no request. Removing the last link of a
// file the kernel still references hides it instead (orphans.cc).
#include "client/fuse_client_impl.h"

#include <cerrno>
#include <cstdio>
#include <utility>
#include <vector>

namespace bftfs::client {

void FuseClient::Impl::note_entry(FuseIno parent, const std::string& name) {
  if (entry_timeout() > 0) note_name(parent, name);
}

void FuseClient::Impl::note_name(FuseIno parent, const std::string& name) {
  if (!track_entries) return;
  std::lock_guard<std::mutex> lock(entries_mu);
  cached_entries.emplace(parent, name);
}

void FuseClient::Impl::reply_entry(fuse_req_t req, const fs::Attr& attr, std::uint64_t seq) {
  const FuseIno id = table.remember(attr, seq);
  fuse_entry_param e{};
  e.ino = id;
  e.generation = attr.generation;
  const auto s = table.snapshot(id);
  e.attr = to_stat(s ? s->attr : attr);
  e.attr_timeout = attr_timeout();
  e.entry_timeout = entry_timeout();
  // If the kernel did not take the entry (the request was interrupted), it will never forget it.
  if (freply_entry(req, &e) != 0) (void)table.forget(id, 1);
}

void FuseClient::Impl::lookup(fuse_req_t req, FuseIno parent, const char* name) {
  const auto dir = handle_of(parent);
  if (!dir) return (void)freply_err(req, ESTALE);
  fs::Op op = make_op(OpCode::kLookup, cred_of(req, {gid_of(parent)}));
  op.handle = *dir;
  op.name = name;
  InterruptScope scope(req, table, stopping, ignore_interrupts);
  CallResult r = call(&scope, single(std::move(op)), true);
  if (r.err == ENOENT) ++stats.lookups_enoent;
  if (r.err == ENOENT && negative_timeout() > 0) {
    note_entry(parent, name);
    fuse_entry_param e{};
    e.ino = 0;
    e.entry_timeout = negative_timeout();
    freply_entry(req, &e);
    return;
  }
  if (r.err != 0) return (void)freply_err(req, r.err);
  note_entry(parent, name);
  reply_entry(req, r.result.results[0].attr, r.seq);
}

void FuseClient::Impl::forget(FuseIno id, std::uint64_t n) {
  std::optional<SillyName> hidden;
  (void)table.forget(id, n, &hidden);
  if (hidden) remove_hidden_async(*hidden);
}

void FuseClient::Impl::make_entry(fuse_req_t req, fs::Op op) {
  InterruptScope scope(req, table, stopping, ignore_interrupts);
  const OpCode code = op.code;
  const fs::Handle dir = code == OpCode::kLink ? op.handle2 : op.handle;
  const std::string name = op.name;
  CallResult r = call(&scope, with_dir_attrs(std::move(op), {dir}), false);
  // The directory is gone (removed while we held it, e.g. as a cwd): no new entry there, as on Linux.
  if (r.err == ESTALE && code != OpCode::kLink) return (void)freply_err(req, ENOENT);
  if (r.err != 0) return (void)freply_err(req, r.err);
  note_dir_attrs(r, 1);
  if (const auto parent = table.find(dir)) note_entry(*parent, name);
  reply_entry(req, r.result.results[0].attr, r.seq);
}

void FuseClient::Impl::mknod(fuse_req_t req, FuseIno parent, const char* name, mode_t mode, dev_t rdev) {
  const auto dir = handle_of(parent);
  if (!dir) return (void)freply_err(req, ESTALE);
  fs::Op op = make_op(OpCode::kMknod, cred_of(req, {gid_of(parent)}));
  op.handle = *dir;
  op.name = name;
  op.mode = mode & 07777;
  switch (mode & S_IFMT) {
    case S_IFREG:
    case 0:
      op.code = OpCode::kCreate;
      op.exclusive = true;
      break;
    case S_IFIFO: op.node_type = fs::FileType::kFifo; break;
    case S_IFSOCK: op.node_type = fs::FileType::kSocket; break;
    case S_IFCHR:
      op.node_type = fs::FileType::kCharDevice;
      op.rdev = rdev;
      break;
    case S_IFBLK:
      op.node_type = fs::FileType::kBlockDevice;
      op.rdev = rdev;
      break;
    default: return (void)freply_err(req, EINVAL);
  }
  make_entry(req, std::move(op));
}

void FuseClient::Impl::mkdir(fuse_req_t req, FuseIno parent, const char* name, mode_t mode) {
  const auto dir = handle_of(parent);
  if (!dir) return (void)freply_err(req, ESTALE);
  fs::Op op = make_op(OpCode::kMkdir, cred_of(req, {gid_of(parent)}));
  op.handle = *dir;
  op.name = name;
  op.mode = mode & 07777;
  make_entry(req, std::move(op));
}

void FuseClient::Impl::symlink(fuse_req_t req, const char* link, FuseIno parent, const char* name) {
  const auto dir = handle_of(parent);
  if (!dir) return (void)freply_err(req, ESTALE);
  fs::Op op = make_op(OpCode::kSymlink, cred_of(req, {gid_of(parent)}));
  op.handle = *dir;
  op.name = name;
  op.target = link;
  if (op.target.size() > fs::kSymlinkWireBytesMax) return (void)freply_err(req, ENAMETOOLONG);
  make_entry(req, std::move(op));
}

void FuseClient::Impl::link(fuse_req_t req, FuseIno id, FuseIno newparent, const char* newname) {
  const auto h = handle_of(id);
  const auto dir = handle_of(newparent);
  if (!h || !dir) return (void)freply_err(req, ESTALE);
  fs::Op op = make_op(OpCode::kLink, cred_of(req, {gid_of(newparent), gid_of(id)}));
  op.handle = *h;
  op.handle2 = *dir;
  op.name = newname;
  make_entry(req, std::move(op));
}

void FuseClient::Impl::unlink(fuse_req_t req, FuseIno parent, const char* name) {
  note_name(parent, name);
  const auto dir = handle_of(parent);
  if (!dir) return (void)freply_err(req, ESTALE);
  const fs::Cred cred = cred_of(req, {gid_of(parent)});
  InterruptScope scope(req, table, stopping, ignore_interrupts);
  NsLock ns(ns_mu, scope, true);
  if (!ns.held()) return (void)freply_err(req, EINTR);
  int err = 0;
  // A name in the orphan directory is removed for real (hiding it again would never end).
  const auto open_id = is_orphan_dir(*dir) ? std::nullopt : open_last_link(scope, cred, *dir, name, err);
  if (err != 0) return (void)freply_err(req, err);
  if (open_id) return (void)freply_err(req, hide(scope, cred, *open_id, *dir, name, nullptr));
  fs::Op op = make_op(OpCode::kRemove, cred);
  op.handle = *dir;
  op.name = name;
  CallResult r = call(&scope, with_dir_attrs(std::move(op), {*dir}), false);
  note_dir_attrs(r, 1);
  freply_err(req, r.err);
}

void FuseClient::Impl::rmdir(fuse_req_t req, FuseIno parent, const char* name) {
  note_name(parent, name);
  const auto dir = handle_of(parent);
  if (!dir) return (void)freply_err(req, ESTALE);
  fs::Op op = make_op(OpCode::kRmdir, cred_of(req, {gid_of(parent)}));
  op.handle = *dir;
  op.name = name;
  InterruptScope scope(req, table, stopping, ignore_interrupts);
  CallResult r = call(&scope, with_dir_attrs(std::move(op), {*dir}), false);
  note_dir_attrs(r, 1);
  freply_err(req, r.err);
}

void FuseClient::Impl::rename(fuse_req_t req, FuseIno parent, const char* name, FuseIno newparent,
                              const char* newname, unsigned flags) {
  if ((flags & ~static_cast<unsigned>(RENAME_NOREPLACE)) != 0) return (void)freply_err(req, EINVAL);
  // The kernel moves the source's dentry to the new name with the time it was cached for: both names go.
  note_name(parent, name);
  note_name(newparent, newname);
  const auto from = handle_of(parent);
  const auto to = handle_of(newparent);
  if (!from || !to) return (void)freply_err(req, ESTALE);
  const fs::Cred cred = cred_of(req, {gid_of(parent), gid_of(newparent)});
  InterruptScope scope(req, table, stopping, ignore_interrupts);
  fs::Op mv = make_op(OpCode::kRename, cred);
  mv.handle = *from;
  mv.name = name;
  mv.handle2 = *to;
  mv.name2 = newname;
  if ((flags & RENAME_NOREPLACE) != 0) return rename_noreplace(req, scope, cred, *to, newname, std::move(mv));
  NsLock ns(ns_mu, scope, true);
  if (!ns.held()) return (void)freply_err(req, EINTR);
  int err = 0;
  const auto open_id = is_orphan_dir(*to) ? std::nullopt : open_last_link(scope, cred, *to, newname, err);
  if (err != 0) return (void)freply_err(req, err);
  if (open_id) {
    // Renaming a name onto another link of the same file is a no-op: do not hide it then.
    fs::Op probe = make_op(OpCode::kLookup, cred);
    probe.handle = *from;
    probe.name = name;
    CallResult src = call(&scope, single(std::move(probe)), true);
    if (src.err != 0) return (void)freply_err(req, src.err);
    if (src.result.results[0].attr.handle() != table.handle(*open_id)) {
      std::vector<fs::Op> then;
      then.push_back(std::move(mv));
      return (void)freply_err(req, hide(scope, cred, *open_id, *to, newname, &then));
    }
  }
  CallResult r = call(&scope, with_dir_attrs(std::move(mv), {*from, *to}), false);
  note_dir_attrs(r, 1);
  freply_err(req, r.err);
}

void FuseClient::Impl::rename_noreplace(fuse_req_t req, InterruptScope& scope, const fs::Cred& cred,
                                        const fs::Handle& to, const char* newname, fs::Op mv) {
  // One request: "the target does not exist" as a predicate, then the rename; all or nothing, so no other
  // client can create the target in between.
  fs::Request r;
  fs::Op probe = make_op(OpCode::kLookup, cred);
  probe.handle = to;
  probe.name = newname;
  probe.expect.kind = fs::ExpectKind::kErrno;
  probe.expect.err = fs::err::kNoEnt;
  r.ops.push_back(std::move(probe));
  r.ops.push_back(std::move(mv));
  CallResult res = call(&scope, r, false);
  if (res.predicate_failed) {
    const std::uint32_t e = res.result.results.empty() ? fs::err::kIo : res.result.results[0].err;
    return (void)freply_err(req, e == 0 ? EEXIST : to_host_errno(e));
  }
  freply_err(req, res.err);
}

}  // namespace bftfs::client
