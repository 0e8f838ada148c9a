// Open-unlinked files (silly rename, docs/CLIENT.md): unlink, or a rename over a regular file whose last link
// that name is, while the kernel still references the file (an open, or a lookup on its way to OPEN), moves it
// to a hidden name in /.bftfs-orphans instead; the kernel's last release or FORGET of the file removes the
// hidden name, and the daemon removes those left when it stops serving (Impl::drain). Opens hold ns_mu shared
// and removals exclusive, so the check "is it referenced here?" and the removal are atomic with respect to this
// mount's opens.
#include "client/fuse_client_impl.h"

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "common/assert.h"
#include "common/log.h"

namespace bftfs::client {

// If (dir, name) names a regular file whose last link that name is and which the kernel still references
// (an open, or a lookup it may be about to open: another process's path walk may have found this very file
// and be on its way to OPEN), returns its node: removing the name must then hide the file instead (silly
// rename), and the hidden name goes at the kernel's last release or forget. This is the inode lifetime of a
// local file system (an unlinked inode lives while referenced), as libfuse asks of a file system.
std::optional<FuseIno> FuseClient::Impl::open_last_link(InterruptScope& scope, const fs::Cred& cred,
                                                       const fs::Handle& dir, const std::string& name, int& err) {
  err = 0;
  fs::Op op = make_op(OpCode::kLookup, cred);
  op.handle = dir;
  op.name = name;
  CallResult r = call(&scope, single(std::move(op)), true);
  if (r.err == EINTR) {
    err = EINTR;
    return std::nullopt;
  }
  if (r.err != 0) return std::nullopt;  // the remove itself will report it
  const fs::Attr& a = r.result.results[0].attr;
  if (a.type != fs::FileType::kRegular || a.nlink != 1) return std::nullopt;
  const auto id = table.find(a.handle());
  if (!id || !table.referenced(*id)) return std::nullopt;
  return id;
}

int FuseClient::Impl::orphan_dir(InterruptScope& scope, bool refresh, fs::Handle& out) {
  {
    std::lock_guard<std::mutex> lock(orphans_mu);
    if (orphans && !refresh) {
      out = *orphans;
      return 0;
    }
  }
  const fs::Cred root{0, 0, {}};
  fs::Op mk = make_op(OpCode::kMkdir, root);
  mk.handle = kRootHandle;
  mk.name = kOrphanDir;
  mk.mode = 01777;
  CallResult r = call(&scope, single(std::move(mk)), false);
  if (r.err == EEXIST) {
    fs::Op lk = make_op(OpCode::kLookup, root);
    lk.handle = kRootHandle;
    lk.name = kOrphanDir;
    r = call(&scope, single(std::move(lk)), true);
  }
  if (r.err != 0) return r.err;
  const fs::Attr& a = r.result.results[0].attr;
  if (a.type != fs::FileType::kDirectory) return EIO;
  std::lock_guard<std::mutex> lock(orphans_mu);
  orphans = a.handle();
  out = *orphans;
  return 0;
}

bool FuseClient::Impl::is_orphan_dir(const fs::Handle& h) {
  std::lock_guard<std::mutex> lock(orphans_mu);
  return orphans && *orphans == h;
}

int FuseClient::Impl::hide(InterruptScope& scope, const fs::Cred& cred, FuseIno id, const fs::Handle& dir,
                           const std::string& name, std::vector<fs::Op>* then) {
  const auto h = table.handle(id);
  BFT_ASSERT(h.has_value());
  const std::string hidden = silly_prefix + table.silly_name_for(*h);
  // Under default_permissions the kernel already checked that the caller may remove the name (w+x on the
  // directory, the sticky rule), so the move goes as root; otherwise as the caller (the orphan directory
  // is writable by all).
  const fs::Cred mover = opt.default_permissions ? fs::Cred{0, 0, {}} : cred;
  for (int attempt = 0; attempt < 2; ++attempt) {
    fs::Handle od;
    const int e = orphan_dir(scope, attempt > 0, od);
    if (e != 0) return e;
    fs::Request req;
    fs::Op op = make_op(OpCode::kRename, mover);
    op.handle = dir;
    op.name = name;
    op.handle2 = od;
    op.name2 = hidden;
    req.ops.push_back(std::move(op));
    if (then != nullptr) {
      for (const auto& o : *then) req.ops.push_back(o);
    }
    CallResult r = call(&scope, req, false);
    // The orphan directory was removed behind our back: make it again, once.
    if (r.err == ESTALE && attempt == 0 && r.result.stop == 0) continue;
    if (r.err != 0) return r.err;
    // Closed meanwhile: nobody will remove the hidden name at release, so do it now.
    if (!table.set_silly(id, SillyName{od, hidden})) remove_hidden(SillyName{od, hidden});
    return 0;
  }
  return EIO;
}

void FuseClient::Impl::remove_hidden(const SillyName& s) {
  fs::Op op = make_op(OpCode::kRemove, fs::Cred{0, 0, {}});
  op.handle = s.dir;
  op.name = s.name;
  CallResult r = call(nullptr, single(std::move(op)), false);
  if (r.err != 0 && r.err != ENOENT) {
    LOG_WARN("", "client: could not remove hidden file %s: %s", s.name.c_str(), std::strerror(r.err));
  }
}

void FuseClient::Impl::remove_hidden_async(const SillyName& s) {
  fs::Op op = make_op(OpCode::kRemove, fs::Cred{0, 0, {}});
  op.handle = s.dir;
  op.name = s.name;
  Callbacks cb;
  cb.on_final = [name = s.name](Final f) {
    const CallResult r = interpret(std::move(f), CallResult{});
    if (r.err != 0 && r.err != ENOENT) {
      LOG_WARN("", "client: could not remove hidden file %s: %s", name.c_str(), std::strerror(r.err));
    }
  };
  (void)backend->submit(single(std::move(op)), SubmitOptions{}, std::move(cb));
}

}  // namespace bftfs::client
