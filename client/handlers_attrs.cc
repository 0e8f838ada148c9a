// The FUSE handlers of attributes: getattr (with the client's attribute cache), setattr, readlink, statfs and
// access. Each replies exactly once through the freply_* wrappers; client/fuse_client_impl.h lists each one's
// valid replies.
#include "client/fuse_client_impl.h"

#include <cerrno>
#include <chrono>
#include <utility>

namespace bftfs::client {

void FuseClient::Impl::reply_attr(fuse_req_t req, FuseIno id, const fs::Attr& fallback) {
  const auto s = table.snapshot(id);
  const struct stat st = to_stat(s ? s->attr : fallback);
  freply_attr(req, &st, attr_timeout());
}

void FuseClient::Impl::getattr(fuse_req_t req, FuseIno id) {
  const auto s = table.snapshot(id);
  if (!s) return (void)freply_err(req, ESTALE);
  InterruptScope scope(req, table, stopping, ignore_interrupts);
  // Our own writes in flight: the node table has their size, but their mtime, ctime and blocks are the
  // service's (agreed time) and known only once they are final. stat after write must show them, so wait --
  // for the writes answered before this stat, not for those other processes keep making (a stat of a file
  // being appended to would otherwise wait until every appender stopped).
  const std::uint64_t upto = table.last_write_ticket(id);
  if (s->has_pending) kick_writes(id, stats.stage_sends_getattr);
  if (s->has_pending &&
      !table.wait_writes(id, [&] { return scope.interrupted(); }, std::chrono::milliseconds(0), upto)) {
    return (void)freply_err(req, EINTR);
  }
  // The attribute cache (docs/CLIENT.md "Caching"): attributes that a final result brought less than
  // attr_timeout ago -- a write's, a read's, a lookup's -- answer for the rest of that time, as the kernel's
  // own cache would have if it had not dropped them (it drops them after every write: the size and times
  // changed; the write's result carries the new ones). open() never uses this cache (close-to-open).
  // A mutation of this client other than a write (create, unlink, rename, link, setattr...) may change
  // attributes the cache holds (a parent's mtime, a target's nlink): attributes from requests submitted
  // before it completed are not used (attr_barrier).
  if (const auto now = table.snapshot(id);
      now && !now->has_pending && attr_timeout() > 0 && now->attr_seq >= attr_barrier.load()) {
    const double age_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - now->attr_time).count();
    if (age_s >= 0 && age_s < attr_timeout()) {
      ++stats.getattr_cache_hits;
      const struct stat st = to_stat(now->attr);
      return (void)freply_attr(req, &st, attr_timeout() - age_s);
    }
  }
  ++stats.getattr_cache_misses;
  fs::Op op = make_op(OpCode::kGetattr, cred_of(req, {s->attr.gid}));
  op.handle = s->handle;
  CallResult r = call(&scope, single(std::move(op)), true);
  if (r.err == ESTALE && s->opens > 0) {
    // Removed while open here (a directory someone rmdir'ed, our cwd): on a local file system fstat still
    // works and shows no links.
    fs::Attr gone = s->attr;
    gone.nlink = 0;
    const struct stat st = to_stat(gone);
    return (void)freply_attr(req, &st, 0);
  }
  if (r.err != 0) return (void)freply_err(req, r.err);
  table.update_attr(r.result.results[0].attr, r.seq);
  reply_attr(req, id, r.result.results[0].attr);
}

void FuseClient::Impl::setattr(fuse_req_t req, FuseIno id, const struct stat* attr, int to_set) {
  const auto h = handle_of(id);
  if (!h) return (void)freply_err(req, ESTALE);
  InterruptScope scope(req, table, stopping, ignore_interrupts);
  // Truncation must follow our writes in flight (a truncate is ordered after them anyway; waiting also keeps
  // the size of the writes in flight from extending the size the truncate sets).
  const std::uint64_t upto = table.last_write_ticket(id);  // the writes answered before the truncate
  if ((to_set & FUSE_SET_ATTR_SIZE) != 0) {
    kick_writes(id, stats.stage_sends_mutation);
    drop_prefetch(id);
  }
  if ((to_set & FUSE_SET_ATTR_SIZE) != 0 &&
      !table.wait_writes(id, [&] { return scope.interrupted(); }, std::chrono::milliseconds(0), upto)) {
    return (void)freply_err(req, EINTR);
  }
  const std::optional<std::uint32_t> new_gid =
      (to_set & FUSE_SET_ATTR_GID) != 0 ? std::optional<std::uint32_t>(attr->st_gid) : std::nullopt;
  fs::Op op = make_op(OpCode::kSetattr, cred_of(req, {gid_of(id), new_gid}));
  op.handle = *h;
  if (const int e = fill_setattr(attr, to_set, op); e != 0) return (void)freply_err(req, e);
  kill_priv_as_root(id, op);
  const bool read_only = op.code == OpCode::kGetattr;  // nothing to set (fill_setattr)
  CallResult r = call(&scope, single(std::move(op)), read_only);
  if (r.err != 0) return (void)freply_err(req, r.err);
  table.update_attr(r.result.results[0].attr, r.seq);
  reply_attr(req, id, r.result.results[0].attr);
}

int FuseClient::Impl::fill_setattr(const struct stat* attr, int to_set, fs::Op& op) {
  std::uint8_t m = 0;
  if ((to_set & FUSE_SET_ATTR_MODE) != 0) {
    m |= fs::setattr::kMode;
    op.mode = attr->st_mode & 07777;
  }
  if ((to_set & FUSE_SET_ATTR_UID) != 0) {
    m |= fs::setattr::kUid;
    op.uid = attr->st_uid;
  }
  if ((to_set & FUSE_SET_ATTR_GID) != 0) {
    m |= fs::setattr::kGid;
    op.gid = attr->st_gid;
  }
  if ((to_set & FUSE_SET_ATTR_SIZE) != 0) {
    if (attr->st_size < 0) return EINVAL;
    m |= fs::setattr::kSize;
    op.size = static_cast<std::uint64_t>(attr->st_size);
  }
  if ((to_set & FUSE_SET_ATTR_ATIME_NOW) != 0) {
    m |= fs::setattr::kAtimeNow;
  } else if ((to_set & FUSE_SET_ATTR_ATIME) != 0) {
    m |= fs::setattr::kAtime;
    op.atime_ns = timespec_to_wire(attr->st_atim);
  }
  if ((to_set & FUSE_SET_ATTR_MTIME_NOW) != 0) {
    m |= fs::setattr::kMtimeNow;
  } else if ((to_set & FUSE_SET_ATTR_MTIME) != 0) {
    m |= fs::setattr::kMtime;
    op.mtime_ns = timespec_to_wire(attr->st_mtim);
  }
  op.mask = m;
  if (m == 0) op.code = OpCode::kGetattr;  // only ctime or kill-suid asked: nothing the wire sets by itself
  return 0;
}

void FuseClient::Impl::kill_priv_as_root(FuseIno id, fs::Op& op) {
  // A write or truncate by a non-owner makes the kernel clear S_ISUID/S_ISGID with a SETATTR of the mode in
  // the writer's name; the service lets only the owner change a mode. The kernel already decided the
  // clearing (under default_permissions), so a change that only drops those bits goes with root credentials.
  if (op.mask != fs::setattr::kMode || !opt.default_permissions) return;
  const auto s = table.snapshot(id);
  const std::uint32_t old_mode = s ? s->attr.mode : 0;
  const bool only_clears_ids = (op.mode & ~06000u) == (old_mode & ~06000u) &&  // nothing else changes
                               (op.mode & ~old_mode) == 0 &&                  // no bit is set
                               op.mode != old_mode;                            // some bit is cleared
  if (s && s->attr.uid != op.cred.uid && only_clears_ids) {
    op.cred = fs::Cred{0, 0, {}};
  }
}

void FuseClient::Impl::readlink(fuse_req_t req, FuseIno id) {
  const auto h = handle_of(id);
  if (!h) return (void)freply_err(req, ESTALE);
  fs::Op op = make_op(OpCode::kReadlink, cred_of(req));
  op.handle = *h;
  InterruptScope scope(req, table, stopping, ignore_interrupts);
  CallResult r = call(&scope, single(std::move(op)), true);
  if (r.err != 0) return (void)freply_err(req, r.err);
  freply_readlink(req, r.result.results[0].target.c_str());
}

void FuseClient::Impl::statfs(fuse_req_t req) {
  fs::StatFs s;
  const auto now = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> cached(statfs_mu);
  if (statfs_cache_s > 0 && statfs_time && std::chrono::duration<double>(now - *statfs_time).count() < statfs_cache_s) {
    s = statfs_last;
    cached.unlock();
  } else {
    cached.unlock();
    fs::Op op = make_op(OpCode::kStatfs, cred_of(req));
    op.handle = kRootHandle;
    InterruptScope scope(req, table, stopping, ignore_interrupts);
    CallResult r = call(&scope, single(std::move(op)), true);
    if (r.err != 0) return (void)freply_err(req, r.err);
    s = r.result.results[0].statfs;
    cached.lock();
    statfs_last = s;
    statfs_time = now;
    cached.unlock();
  }
  struct statvfs v {};
  v.f_bsize = s.bsize;
  v.f_frsize = s.bsize;
  v.f_blocks = s.blocks;
  v.f_bfree = s.bfree;
  v.f_bavail = s.bavail;
  v.f_files = s.files;
  v.f_ffree = s.ffree;
  v.f_favail = s.ffree;
  v.f_namemax = s.namemax;
  freply_statfs(req, &v);
}

void FuseClient::Impl::access(fuse_req_t req, FuseIno id, int mask) {
  const auto h = handle_of(id);
  if (!h) return (void)freply_err(req, ESTALE);
  InterruptScope scope(req, table, stopping, ignore_interrupts);
  const std::uint8_t want = static_cast<std::uint8_t>(mask & 7);
  if (want == 0) {
    fs::Op op = make_op(OpCode::kGetattr, cred_of(req, {gid_of(id)}));
    op.handle = *h;
    CallResult r = call(&scope, single(std::move(op)), true);
    return (void)freply_err(req, r.err);
  }
  freply_err(req, check_access(scope, cred_of(req, {gid_of(id)}), *h, want));
}

int FuseClient::Impl::check_access(InterruptScope& scope, const fs::Cred& cred, const fs::Handle& h,
                                   std::uint8_t want) {
  fs::Op op = make_op(OpCode::kAccess, cred);
  op.handle = h;
  op.access = want;
  CallResult r = call(&scope, single(std::move(op)), true);
  if (r.err != 0) return r.err;
  return r.result.results[0].granted == want ? 0 : EACCES;
}

}  // namespace bftfs::client
