// The table of low-level operations the daemon gives libfuse (fuse_operations()): op_init chooses the kernel
// capabilities; every other entry counts the request by kind (ClientCounters) and runs its handler on
// FuseClient::Impl (handlers_*.cc), which replies exactly once, after sending a write the spec session holds
// (ready(); write_merge.cc). forget and forget_multi reply none here.
#include "client/fuse_client_impl.h"

namespace bftfs::client {

namespace {

FuseClient::Impl* impl_of(fuse_req_t req) { return static_cast<FuseClient::Impl*>(fuse_req_userdata(req)); }

// The handler's object, once a write the spec session holds (write_merge.cc) has been sent: every request after
// a write() is handled after that write (none is held outside a spec session, and this costs one load then).
FuseClient::Impl* ready(fuse_req_t req) {
  FuseClient::Impl* impl = impl_of(req);
  impl->send_merged();
  return impl;
}

void op_init(void* userdata, fuse_conn_info* conn) {
  auto* impl = static_cast<FuseClient::Impl*>(userdata);
  (void)impl;
  // No writeback cache (fuse_client.h says why); no atomic O_TRUNC (the kernel sends a truncating setattr,
  // which waits for our writes in flight); readdirplus so `ls -l` and a build's stat storm cost one request
  // per directory chunk; symlink targets cached by the kernel (they never change).
  conn->want &= ~static_cast<unsigned>(FUSE_CAP_WRITEBACK_CACHE);
  conn->want &= ~static_cast<unsigned>(FUSE_CAP_ATOMIC_O_TRUNC);
  // No automatic data invalidation: with it the kernel asks GETATTR before reads whenever its attributes
  // are stale (after every write of ours) and drops the file's pages whenever mtime moved -- which every
  // write of ours does (the agreed time), so a program that writes and reads back its own output (ld, as)
  // would read every page from the service again, and each of those GETATTRs would push out the writes
  // being coalesced. Close-to-open needs neither: open() revalidates and decides whether the pages stay
  // (keep_cache); a size change seen later still drops the pages (the kernel always does that), and reads
  // past the cached end of file still ask for the size. What an open descriptor no longer sees is another
  // client's same-size overwrite before it reopens the file (docs/CLIENT.md "Data cache").
  conn->want &= ~static_cast<unsigned>(FUSE_CAP_AUTO_INVAL_DATA);
  if ((conn->capable & FUSE_CAP_READDIRPLUS) != 0) conn->want |= FUSE_CAP_READDIRPLUS;
  if ((conn->capable & FUSE_CAP_READDIRPLUS_AUTO) != 0) conn->want |= FUSE_CAP_READDIRPLUS_AUTO;
  if ((conn->capable & FUSE_CAP_CACHE_SYMLINKS) != 0) conn->want |= FUSE_CAP_CACHE_SYMLINKS;
  // The service clears set-uid bits on write, truncate and chown itself.
  if ((conn->capable & FUSE_CAP_HANDLE_KILLPRIV) != 0) conn->want |= FUSE_CAP_HANDLE_KILLPRIV;
  conn->max_write = static_cast<unsigned>(kWriteOpsPerRequest * fs::kIoBytesMax);
  conn->max_readahead = static_cast<unsigned>(fs::kIoBytesMax);
}

void op_lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  ++impl_of(req)->stats.fuse_lookup;
  ready(req)->lookup(req, parent, name);
}
void op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t n) {
  impl_of(req)->forget(ino, n);
  freply_none(req);
}
void op_forget_multi(fuse_req_t req, size_t count, fuse_forget_data* f) {
  for (size_t i = 0; i < count; ++i) impl_of(req)->forget(f[i].ino, f[i].nlookup);
  freply_none(req);
}
void op_getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  ++impl_of(req)->stats.fuse_getattr;
  ready(req)->getattr(req, ino);
}
void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info*) {
  ++impl_of(req)->stats.fuse_setattr;
  ready(req)->setattr(req, ino, attr, to_set);
}
void op_readlink(fuse_req_t req, fuse_ino_t ino) {
  ++impl_of(req)->stats.fuse_other;
  ready(req)->readlink(req, ino);
}
void op_mknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t rdev) {
  ++impl_of(req)->stats.fuse_namespace;
  ready(req)->mknod(req, parent, name, mode, rdev);
}
void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  ++impl_of(req)->stats.fuse_namespace;
  ready(req)->mkdir(req, parent, name, mode);
}
void op_unlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  ++impl_of(req)->stats.fuse_namespace;
  ready(req)->unlink(req, parent, name);
}
void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  ++impl_of(req)->stats.fuse_namespace;
  ready(req)->rmdir(req, parent, name);
}
void op_symlink(fuse_req_t req, const char* link, fuse_ino_t parent, const char* name) {
  ++impl_of(req)->stats.fuse_namespace;
  ready(req)->symlink(req, link, parent, name);
}
void op_rename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t newparent, const char* newname,
               unsigned int flags) {
  ++impl_of(req)->stats.fuse_namespace;
  ready(req)->rename(req, parent, name, newparent, newname, flags);
}
void op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char* newname) {
  ++impl_of(req)->stats.fuse_namespace;
  ready(req)->link(req, ino, newparent, newname);
}
void op_open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  ++impl_of(req)->stats.fuse_open;
  ready(req)->open(req, ino, fi);
}
void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  ++impl_of(req)->stats.fuse_read;
  ready(req)->read(req, ino, size, off, fi);
}
void op_write(fuse_req_t req, fuse_ino_t ino, const char* buf, size_t size, off_t off, fuse_file_info* fi) {
  ++impl_of(req)->stats.fuse_write;
  impl_of(req)->write(req, ino, buf, size, off, fi);
}
void op_flush(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  ++impl_of(req)->stats.fuse_flush;
  ready(req)->flush(req, ino, fi);
}
void op_release(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  ++impl_of(req)->stats.fuse_release;
  ready(req)->release(req, ino, fi);
}
void op_fsync(fuse_req_t req, fuse_ino_t ino, int, fuse_file_info*) {
  ++impl_of(req)->stats.fuse_fsync;
  ready(req)->fsync(req, ino);
}
void op_opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  ++impl_of(req)->stats.fuse_other;
  ready(req)->opendir(req, ino, fi);
}
void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  ++impl_of(req)->stats.fuse_readdir;
  ready(req)->readdir(req, ino, size, off, false);
}
void op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  ++impl_of(req)->stats.fuse_readdir;
  ready(req)->readdir(req, ino, size, off, true);
}
void op_releasedir(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) { impl_of(req)->releasedir(req, ino); }
void op_fsyncdir(fuse_req_t req, fuse_ino_t ino, int, fuse_file_info*) {
  ++impl_of(req)->stats.fuse_fsync;
  ready(req)->fsync(req, ino);
}
void op_statfs(fuse_req_t req, fuse_ino_t) {
  ++impl_of(req)->stats.fuse_other;
  ready(req)->statfs(req);
}
void op_access(fuse_req_t req, fuse_ino_t ino, int mask) {
  ++impl_of(req)->stats.fuse_other;
  ready(req)->access(req, ino, mask);
}
void op_create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi) {
  ++impl_of(req)->stats.fuse_create;
  ready(req)->create(req, parent, name, mode, fi);
}

fuse_lowlevel_ops make_ops() {
  fuse_lowlevel_ops o{};
  o.init = op_init;
  o.lookup = op_lookup;
  o.forget = op_forget;
  o.forget_multi = op_forget_multi;
  o.getattr = op_getattr;
  o.setattr = op_setattr;
  o.readlink = op_readlink;
  o.mknod = op_mknod;
  o.mkdir = op_mkdir;
  o.unlink = op_unlink;
  o.rmdir = op_rmdir;
  o.symlink = op_symlink;
  o.rename = op_rename;
  o.link = op_link;
  o.open = op_open;
  o.read = op_read;
  o.write = op_write;
  o.flush = op_flush;
  o.release = op_release;
  o.fsync = op_fsync;
  o.opendir = op_opendir;
  o.readdir = op_readdir;
  o.readdirplus = op_readdirplus;
  o.releasedir = op_releasedir;
  o.fsyncdir = op_fsyncdir;
  o.statfs = op_statfs;
  o.access = op_access;
  o.create = op_create;
  return o;
}

const fuse_lowlevel_ops kOps = make_ops();

}  // namespace

const fuse_lowlevel_ops& fuse_operations() { return kOps; }

}  // namespace bftfs::client
