// The FUSE handlers of directories: opendir, readdir and readdirplus, releasedir. Each replies exactly once
// through the freply_* wrappers; client/fuse_client_impl.h lists each one's valid replies. readdir never lists
// the orphan directory (orphans.cc), and readdirplus gives the kernel entries (one lookup reference each).
#include "client/fuse_client_impl.h"

#include <algorithm>
#include <cerrno>
#include <vector>

namespace bftfs::client {

void FuseClient::Impl::opendir(fuse_req_t req, FuseIno id, fuse_file_info* fi) {
  const auto h = handle_of(id);
  if (!h) return (void)freply_err(req, ESTALE);
  if (!opt.default_permissions) {
    InterruptScope scope(req, table, stopping);
    const int e = check_access(scope, cred_of(req, {gid_of(id)}), *h, 4);
    if (e != 0) return (void)freply_err(req, e);
  }
  fi->fh = 0;
  (void)table.opened(id, DataVersion{});
  if (freply_open(req, fi) != 0) (void)table.released(id);
}

void FuseClient::Impl::readdir(fuse_req_t req, FuseIno id, size_t size, off_t off, bool plus) {
  const auto h = handle_of(id);
  if (!h) return (void)freply_err(req, ESTALE);
  if (off < 0) return (void)freply_err(req, EINVAL);
  fs::Op op = make_op(plus ? OpCode::kReaddirPlus : OpCode::kReaddir, cred_of(req, {gid_of(id)}));
  op.handle = *h;
  op.cookie = static_cast<std::uint64_t>(off);
  // An entry takes at least 24 bytes (readdirplus: about 150): ask for what can fit, within the wire's bound.
  const std::size_t per = plus ? 152 : 32;
  op.count = static_cast<std::uint32_t>(std::clamp<std::size_t>(size / per + 1, 1, fs::kReaddirEntriesMax));
  InterruptScope scope(req, table, stopping);
  CallResult r = call(&scope, single(std::move(op)), true);
  if (r.err == ESTALE) return (void)freply_buf(req, nullptr, 0);  // removed while open: reads as empty
  if (r.err != 0) return (void)freply_err(req, r.err);
  std::vector<char> buf(size);
  std::size_t used = 0;
  const bool root = *h == kRootHandle;
  for (const fs::DirEntry& d : r.result.results[0].entries) {
    const off_t next = static_cast<off_t>(d.cookie);
    if (root && d.name == kOrphanDir) continue;  // the mount's hidden files are nobody's entries
    if (!plus) {
      struct stat st {};
      st.st_ino = d.ino;
      st.st_mode = type_bits(d.type);
      const std::size_t need = fuse_add_direntry(req, buf.data() + used, size - used, d.name.c_str(), &st, next);
      if (need > size - used) break;
      used += need;
      continue;
    }
    fuse_entry_param e{};
    const bool dot = d.name == "." || d.name == "..";
    // The size of an entry depends only on its name: check it fits before taking a lookup reference.
    const std::size_t need = fuse_add_direntry_plus(req, nullptr, 0, d.name.c_str(), &e, next);
    if (need > size - used) break;
    if (dot) {
      // ino 0: the kernel takes no reference for '.' and '..' (it knows those inodes already).
      e.attr.st_ino = d.ino;
      e.attr.st_mode = type_bits(d.type);
    } else {
      const FuseIno nid = table.remember(d.attr, r.seq);
      const auto s = table.snapshot(nid);
      e.ino = nid;
      e.generation = d.attr.generation;
      e.attr = to_stat(s ? s->attr : d.attr);
      e.attr_timeout = opt.attr_timeout_s;
      e.entry_timeout = opt.entry_timeout_s;
    }
    used += fuse_add_direntry_plus(req, buf.data() + used, size - used, d.name.c_str(), &e, next);
  }
  freply_buf(req, buf.data(), used);
}

void FuseClient::Impl::releasedir(fuse_req_t req, FuseIno id) {
  (void)table.released(id);
  freply_err(req, 0);
}

}  // namespace bftfs::client
