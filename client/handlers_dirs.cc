// The FUSE handlers of directories: opendir, readdir and readdirplus, releasedir. Each replies exactly once
// through the freply_* wrappers; client/fuse_client_impl.h lists each one's valid replies. readdir never lists
// the orphan directory (orphans.cc), and readdirplus gives the kernel entries (one lookup reference each).
#include "client/fuse_client_impl.h"

#include <algorithm>
#include <cerrno>
#include <limits>
#include <vector>

namespace bftfs::client {

void FuseClient::Impl::opendir(fuse_req_t req, FuseIno id, fuse_file_info* fi) {
  const auto h = handle_of(id);
  if (!h) return (void)freply_err(req, ESTALE);
  if (!opt.default_permissions) {
    InterruptScope scope(req, table, stopping, ignore_interrupts);
    const int e = check_access(scope, cred_of(req, {gid_of(id)}), *h, 4);
    if (e != 0) return (void)freply_err(req, e);
  }
  fi->fh = 0;
  (void)table.opened(id, DataVersion{});
  if (freply_open(req, fi) != 0) (void)table.released(id);
}

namespace {

// Adds `d` to the reply being built in buf[0, used) of request `req`, and returns true; or returns false, adding
// nothing, if it does not fit. A readdirplus entry other than '.' and '..' gives the kernel a lookup reference on
// its node (remembered in c's node table with submission number `seq`).
bool add_dir_entry(FuseClient::Impl& c, fuse_req_t req, std::vector<char>& buf, std::size_t& used,
                   const fs::DirEntry& d, bool plus, std::uint64_t seq, FuseIno dir) {
  const off_t next = static_cast<off_t>(d.cookie);
  const std::size_t size = buf.size();
  if (!plus) {
    struct stat st {};
    st.st_ino = d.ino;
    st.st_mode = type_bits(d.type);
    const std::size_t need = fuse_add_direntry(req, buf.data() + used, size - used, d.name.c_str(), &st, next);
    if (need > size - used) return false;
    used += need;
    return true;
  }
  fuse_entry_param e{};
  // The size of an entry depends only on its name: check it fits before taking a lookup reference.
  const std::size_t need = fuse_add_direntry_plus(req, nullptr, 0, d.name.c_str(), &e, next);
  if (need > size - used) return false;
  if (d.name == "." || d.name == "..") {
    // ino 0: the kernel takes no reference for '.' and '..' (it knows those inodes already).
    e.attr.st_ino = d.ino;
    e.attr.st_mode = type_bits(d.type);
  } else {
    const FuseIno nid = c.table.remember(d.attr, seq);
    const auto s = c.table.snapshot(nid);
    e.ino = nid;
    e.generation = d.attr.generation;
    e.attr = to_stat(s ? s->attr : d.attr);
    e.attr_timeout = c.attr_timeout();
    e.entry_timeout = c.entry_timeout();
    c.note_entry(dir, d.name);
  }
  used += fuse_add_direntry_plus(req, buf.data() + used, size - used, d.name.c_str(), &e, next);
  return true;
}

}  // namespace

// The kernel's offset is a directory position (a readdir cookie, docs/FILESERVICE.md §7): READDIR(c) returns the
// entries at positions after c, and each entry carries its own position, which is where the kernel resumes
// after it. The service keeps positions below 2^63, so they fit the kernel's signed offset.
void FuseClient::Impl::readdir(fuse_req_t req, FuseIno id, size_t size, off_t off, bool plus) {
  const auto h = handle_of(id);
  if (!h) return (void)freply_err(req, ESTALE);
  if (off < 0) return (void)freply_err(req, EINVAL);
  const bool root = *h == kRootHandle;
  std::vector<char> buf(size);
  std::size_t used = 0;
  std::uint64_t cookie = static_cast<std::uint64_t>(off);
  InterruptScope scope(req, table, stopping, ignore_interrupts);
  for (;;) {
    fs::Op op = make_op(plus ? OpCode::kReaddirPlus : OpCode::kReaddir, cred_of(req, {gid_of(id)}));
    op.handle = *h;
    op.cookie = cookie;
    // An entry takes at least 24 bytes (readdirplus: about 150): ask for what can fit, within the wire's bound.
    const std::size_t per = plus ? 152 : 32;
    op.count = static_cast<std::uint32_t>(std::clamp<std::size_t>(size / per + 1, 1, fs::kReaddirEntriesMax));
    CallResult r = call(&scope, single(std::move(op)), true);
    if (r.err == ESTALE) return (void)freply_buf(req, nullptr, 0);  // removed while open: reads as empty
    if (r.err != 0) return (void)freply_err(req, r.err);
    const fs::OpResult& res = r.result.results[0];
    bool only_hidden = !res.entries.empty();
    for (const fs::DirEntry& d : res.entries) {
      if (d.cookie > static_cast<std::uint64_t>(std::numeric_limits<off_t>::max())) {
        return (void)freply_err(req, EIO);  // not a position the service gives (fs_state.h, kCookieMax)
      }
      if (root && (d.name == kOrphanDir || d.name == kRunDir)) continue;  // the mount's hidden files are nobody's entries
      only_hidden = false;
      if (!add_dir_entry(*this, req, buf, used, d, plus, r.seq, id)) break;
    }
    // A reply with no entry ends the listing for the kernel: if every entry of the batch was hidden, read on
    // from past them instead.
    if (!only_hidden || res.eof) break;
    cookie = res.entries.back().cookie;
  }
  freply_buf(req, buf.data(), used);
}

void FuseClient::Impl::releasedir(fuse_req_t req, FuseIno id) {
  (void)table.released(id);
  freply_err(req, 0);
}

}  // namespace bftfs::client
