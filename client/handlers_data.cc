// The FUSE handlers of open files and their data: open (close-to-open revalidation, with the open-time
// prefetch), create, read, write (staged: write_staging.cc), flush, fsync and release. Each replies exactly
// once through the freply_* wrappers; client/fuse_client_impl.h lists each one's valid replies.
#include "client/fuse_client_impl.h"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <utility>

#include "common/log.h"

namespace bftfs::client {

namespace {

// Access bits an open with `flags` needs.
std::uint8_t open_wants(int flags) {
  switch (flags & O_ACCMODE) {
    case O_RDONLY: return 4;
    case O_WRONLY: return 2;
    default: return 6;
  }
}

int to_errno_or_zero(std::uint32_t e) { return e == 0 ? 0 : static_cast<int>(e); }

// An open with O_DIRECT is answered FOPEN_DIRECT_IO: the kernel then sends every read and write of the
// descriptor here instead of going through its page cache, so no WRITE of it is sent with page locks held and
// direct_io.cc can drop the range's cached pages after the write (docs/CLIENT.md "Direct I/O").
void set_direct(OpenFile* of, fuse_file_info* fi) {
  if ((fi->flags & O_DIRECT) == 0) return;
  fi->direct_io = 1;
  of->direct = true;
}

}  // namespace

// The credentials for I/O on an open descriptor. POSIX checks permission at open, not per read or write:
// a file created 0444 and written through the descriptor that created it (git objects, tar) must work. The
// service checks every WRITE/READ against the mode, so when the opener's credentials no longer pass the mode
// check, the I/O goes with root credentials -- the descriptor is the capability the kernel already granted.
fs::Cred FuseClient::Impl::io_cred(const OpenFile* of, FuseIno id, std::uint32_t want) {
  const auto s = table.snapshot(id);
  if (of == nullptr || !s) return fs::Cred{0, 0, {}};
  if (mode_allows(of->cred, s->attr, want)) return of->cred;
  return fs::Cred{0, 0, {}};
}

// ---- the open-time prefetch (Impl::Prefetch; docs/CLIENT.md "Data cache") ----

// A read-only open of a regular file whose pages the kernel will not keep (no version recorded: the first
// open since the node was known): the kernel will read it from the start.
bool FuseClient::Impl::wants_prefetch(const NodeSnapshot& s, int flags) {
  if ((flags & O_ACCMODE) != O_RDONLY || s.attr.type != fs::FileType::kRegular) return false;
  if (!opt.default_permissions) return false;  // open() asks ACCESS first; keep the plain order
  return !table.data_version(s.id).has_value();
}

// Answers a read of [off, off + size) from the open's prefetch when it holds that range (or its end of
// file) for the file's current version. Returns true if it replied.
bool FuseClient::Impl::serve_prefetched(fuse_req_t req, FuseIno id, std::size_t size, std::uint64_t off) {
  const auto s = table.snapshot(id);
  std::unique_lock<std::mutex> lock(pf_mu);
  auto it = prefetched.find(id);
  if (it == prefetched.end()) return false;
  const Prefetch& p = it->second;
  if (!s || s->has_pending || DataVersion{s->attr.mtime_ns, s->attr.size} != p.version) {
    prefetched.erase(it);  // changed since the open: read from the service
    return false;
  }
  const std::uint64_t have = p.data.size();
  if (off + size > have && !p.eof) return false;  // beyond what was read: ask the service
  const std::uint64_t from = std::min<std::uint64_t>(off, have);
  const std::uint64_t n = std::min<std::uint64_t>(size, have - from);
  Bytes out(p.data.begin() + static_cast<std::ptrdiff_t>(from),
            p.data.begin() + static_cast<std::ptrdiff_t>(from + n));
  if (off + size >= have) prefetched.erase(it);  // the kernel has it all now
  lock.unlock();
  ++stats.read_prefetch_hits;
  freply_buf(req, reinterpret_cast<const char*>(out.data()), out.size());
  return true;
}

void FuseClient::Impl::drop_prefetch(FuseIno id) {
  std::lock_guard<std::mutex> lock(pf_mu);
  prefetched.erase(id);
}

void FuseClient::Impl::open(fuse_req_t req, FuseIno id, fuse_file_info* fi) {
  const auto s = table.snapshot(id);
  if (!s) return (void)freply_err(req, ESTALE);
  const fs::Cred cred = cred_of(req, {s->attr.gid});
  InterruptScope scope(req, table, stopping, ignore_interrupts);
  NsLock ns(ns_mu, scope, false);
  if (!ns.held()) return (void)freply_err(req, EINTR);
  fs::Attr attr = s->attr;
  bool revalidated = false;
  if (!s->has_pending && wants_prefetch(*s, fi->flags)) {
    // Close-to-open revalidation by a READ of the file's start instead of a GETATTR: its result carries
    // the attributes too, and the data the kernel is about to ask for (it holds no pages of this file that
    // it may keep), so the first read costs no request (docs/CLIENT.md "Data cache").
    fs::Op op = make_op(OpCode::kRead, cred);
    op.handle = s->handle;
    op.offset = 0;
    op.count = kPrefetchBytes;
    CallResult r = call(&scope, single(std::move(op)), true);
    if (r.err == EINTR) return (void)freply_err(req, EINTR);
    if (r.err == 0) {
      fs::OpResult& res = r.result.results[0];
      table.update_attr(res.attr, r.seq);
      attr = res.attr;
      revalidated = true;
      ++stats.open_prefetches;
      std::lock_guard<std::mutex> lock(pf_mu);
      prefetched[id] = Prefetch{std::move(res.data), res.eof != 0, DataVersion{attr.mtime_ns, attr.size}};
    }
    // Any error: the GETATTR below decides (and reports the error open() should give).
  }
  if (!s->has_pending && !revalidated) {
    // Close-to-open: the attributes at open come from the service, never from a cache.
    fs::Op op = make_op(OpCode::kGetattr, cred);
    op.handle = s->handle;
    CallResult r = call(&scope, single(std::move(op)), true);
    if (r.err != 0) return (void)freply_err(req, r.err);
    table.update_attr(r.result.results[0].attr, r.seq);
    attr = r.result.results[0].attr;
  }
  if (!opt.default_permissions) {
    const int e = check_access(scope, cred, s->handle, open_wants(fi->flags));
    if (e != 0) return (void)freply_err(req, e);
  }
  const bool keep = table.opened(id, DataVersion{attr.mtime_ns, attr.size});
  if (!keep) {
    // The kernel's cached size and times may predate another client's close: drop them (attributes only;
    // the page cache is dropped by the open reply without keep_cache).
    fuse_lowlevel_notify_inval_inode(se, id, -1, 0);
  }
  auto* of = new OpenFile{id, fi->flags, cred};
  fi->fh = reinterpret_cast<std::uint64_t>(of);
  fi->keep_cache = keep ? 1 : 0;
  // O_APPEND descriptors use the page cache like any other (so they can be mapped: direct_io would forbid
  // shared mappings, and libfuse 3.14 cannot ask for FUSE_DIRECT_IO_ALLOW_MMAP); write() places the data
  // where the service's end is (see write()). O_DIRECT ones bypass it (direct_io.cc).
  set_direct(of, fi);
  if (freply_open(req, fi) != 0) {
    (void)table.released(id);
    delete of;
  }
}

void FuseClient::Impl::create(fuse_req_t req, FuseIno parent, const char* name, mode_t mode, fuse_file_info* fi) {
  const auto dir = handle_of(parent);
  if (!dir) return (void)freply_err(req, ESTALE);
  const fs::Cred cred = cred_of(req, {gid_of(parent)});
  fs::Request r;
  fs::Op op = make_op(OpCode::kCreate, cred);
  op.handle = *dir;
  op.name = name;
  op.mode = mode & 07777;
  op.exclusive = (fi->flags & O_EXCL) != 0;
  r.ops.push_back(std::move(op));
  if ((fi->flags & O_TRUNC) != 0 && (fi->flags & O_EXCL) == 0) {
    // The name may exist after all (another client made it since our negative lookup): O_TRUNC applies.
    fs::Op t = make_op(OpCode::kSetattr, cred);
    t.handle = fs::Handle::result_of(0);
    t.mask = fs::setattr::kSize;
    t.size = 0;
    r.ops.push_back(std::move(t));
  }
  const std::size_t file_op = r.ops.size() - 1;  // the CREATE, or the truncating SETATTR after it
  {
    fs::Op g = make_op(OpCode::kGetattr, fs::Cred{0, 0, {}});  // the directory: see with_dir_attrs
    g.handle = *dir;
    r.ops.push_back(std::move(g));
  }
  InterruptScope scope(req, table, stopping, ignore_interrupts);
  NsLock ns(ns_mu, scope, false);
  if (!ns.held()) return (void)freply_err(req, EINTR);
  CallResult res = call(&scope, r, false);
  if (res.err != 0) return (void)freply_err(req, res.err);
  if (res.result.results[0].attr.type == fs::FileType::kDirectory) return (void)freply_err(req, EISDIR);
  note_dir_attrs(res, file_op + 1);
  const fs::Attr& attr = res.result.results[file_op].attr;
  const FuseIno id = table.remember(attr, res.seq);
  (void)table.opened(id, DataVersion{attr.mtime_ns, attr.size});
  auto* of = new OpenFile{id, fi->flags, cred};
  fi->fh = reinterpret_cast<std::uint64_t>(of);
  fi->keep_cache = 1;
  set_direct(of, fi);
  fuse_entry_param e{};
  e.ino = id;
  e.generation = attr.generation;
  const auto s = table.snapshot(id);
  e.attr = to_stat(s ? s->attr : attr);
  e.attr_timeout = attr_timeout();
  e.entry_timeout = entry_timeout();
  note_entry(parent, name);
  if (freply_create(req, &e, fi) != 0) {
    (void)table.released(id);
    (void)table.forget(id, 1);
    delete of;
  }
}

void FuseClient::Impl::read(fuse_req_t req, FuseIno id, size_t size, off_t off, fuse_file_info* fi) {
  auto* of = reinterpret_cast<OpenFile*>(fi->fh);
  const auto h = handle_of(id);
  if (!h) return (void)freply_err(req, ESTALE);
  if (off < 0) return (void)freply_err(req, EINVAL);
  before_direct_read(of, fi, id, size, off);
  InterruptScope scope(req, table, stopping, ignore_interrupts);
  // Read-your-writes: the data of our writes in flight is only in the service once they are final. Those
  // answered before this read, not those other processes keep making meanwhile (a reader of a file being
  // appended to would otherwise wait for the appenders to stop).
  const std::uint64_t upto = table.last_write_ticket(id);
  kick_writes(id, stats.stage_sends_read);
  if (!table.wait_writes(id, [&] { return scope.interrupted(); }, std::chrono::milliseconds(0), upto)) {
    return (void)freply_err(req, EINTR);
  }
  if (serve_prefetched(req, id, size, static_cast<std::uint64_t>(off))) return;
  const fs::Cred cred = io_cred(of, id, 4);
  Bytes data;
  std::uint64_t pos = static_cast<std::uint64_t>(off);
  while (data.size() < size) {
    fs::Op op = make_op(OpCode::kRead, cred);
    op.handle = *h;
    op.offset = pos;
    op.count = static_cast<std::uint32_t>(std::min<std::uint64_t>(kReadChunkBytes, size - data.size()));
    CallResult r = call(&scope, single(std::move(op)), true);
    if (r.err != 0) return (void)freply_err(req, r.err);
    const fs::OpResult& res = r.result.results[0];
    table.update_attr(res.attr, r.seq);
    data.insert(data.end(), res.data.begin(), res.data.end());
    pos += res.data.size();
    if (res.eof || res.data.empty()) break;
  }
  freply_buf(req, reinterpret_cast<const char*>(data.data()), data.size());
}

void FuseClient::Impl::write(fuse_req_t req, FuseIno id, const char* buf, size_t size, off_t off, fuse_file_info* fi) {
  auto* of = reinterpret_cast<OpenFile*>(fi->fh);
  const auto h = handle_of(id);
  if (!h) return (void)freply_err(req, ESTALE);
  if (off < 0) return (void)freply_err(req, EINVAL);
  if (size > kWriteOpsPerRequest * fs::kIoBytesMax) return (void)freply_err(req, EINVAL);
  // The service's file size limit (the default FsOptions every daemon uses), checked here so that write()
  // itself fails: a write-behind error at close is easily ignored by programs. The service checks again.
  const bool append_mode = of != nullptr && (of->flags & O_APPEND) != 0;
  if (!append_mode && static_cast<std::uint64_t>(off) + size > kFileBytesMax) {
    return (void)freply_err(req, EFBIG);
  }
  if (merges(fi, append_mode) && !is_direct_write(of, fi)) {
    return write_merge(req, id, *h, buf, size, static_cast<std::uint64_t>(off), of);
  }
  send_merged();  // a write that does not join the held one comes after it
  if (is_direct_write(of, fi)) {
    return write_direct(req, id, *h, buf, size, static_cast<std::uint64_t>(off), of, append_mode);
  }
  if (synchronous_writes.load()) {
    return write_sync(req, id, *h, buf, size, static_cast<std::uint64_t>(off), of, append_mode && fi->writepage == 0);
  }
  // Backpressure (write_staging.cc): this writer waits, interruptibly, while the mount's write-behind holds
  // write_behind_bytes_max, and while its piece does not fit its file's staged request and the lane is full.
  InterruptScope scope(req, table, stopping, ignore_interrupts);
  const std::uint64_t limit = opt.write_behind_bytes_max > size ? opt.write_behind_bytes_max - size : 0;
  if (table.pending_bytes() > limit) wb.send_for_memory();  // staged bytes count: send what the lane takes
  if (!table.wait_pending_below(limit, [&] { return scope.interrupted(); })) return (void)freply_err(req, EINTR);
  // O_APPEND: WRITE with the append flag, so the service places the data at the end it sees when the request
  // executes: atomic across clients. The kernel put the same bytes in its page cache at its own idea of the
  // end (`off`); that is the same place unless another client appended meanwhile, and then the callback has
  // this file's cached pages and attributes dropped. Write-back of a shared mapping (fi->writepage) goes to
  // the page's own offset, also on an O_APPEND descriptor.
  const bool append = append_mode && fi->writepage == 0;
  const fs::Cred cred = io_cred(of, id, 2);
  // One WRITE op of at most 512 KiB per request: a PBFT operation is at most 1 MiB including the shim's
  // envelope, so two maximal ops would not fit. The requests execute in submission order, so a large
  // write() is applied in order, like NFS WRITEs of wsize each (not atomic against other clients').
  size_t done = 0;
  do {
    const size_t n = std::min<size_t>(fs::kIoBytesMax, size - done);
    fs::Op op = make_op(OpCode::kWrite, cred);
    op.handle = *h;
    op.append = append;
    op.offset = append ? 0 : static_cast<std::uint64_t>(off) + done;
    op.data.assign(reinterpret_cast<const std::uint8_t*>(buf) + done,
                   reinterpret_cast<const std::uint8_t*>(buf) + done + n);
    if (!queue_write(id, std::move(op), static_cast<std::uint64_t>(off) + done, scope)) break;  // interrupted
    drop_prefetch(id);
    done += n;
  } while (done < size);
  // Interrupted while waiting for room: what was staged is written (a short write), or nothing (EINTR).
  if (done == 0) return (void)freply_err(req, EINTR);
  freply_write(req, done);
}

void FuseClient::Impl::flush(fuse_req_t req, FuseIno id, fuse_file_info* fi) {
  InterruptScope scope(req, table, stopping, ignore_interrupts);
  // The writes answered before this close (not those other descriptors of the file keep making).
  const std::uint64_t upto = table.last_write_ticket(id);
  kick_writes(id, stats.stage_sends_close);
  const pid_t caller = fuse_req_ctx(req)->pid;
  bool exiting = false;
  auto last_check = std::chrono::steady_clock::now();
  const bool done = table.wait_writes(
      id,
      [&] {
        if (scope.interrupted()) return true;
        // At most every kCallerPoll (this runs under the table's lock, at every write's completion).
        const auto now = std::chrono::steady_clock::now();
        if (now - last_check < kCallerPoll) return false;
        last_check = now;
        exiting = thread_exiting(caller);
        return exiting;
      },
      kCallerPoll, upto);
  if (!done && exiting) {
    LOG_INFO("", "client: flush for exiting thread %d answered before its writes are final", static_cast<int>(caller));
    return (void)freply_err(req, 0);
  }
  if (!done) return (void)freply_err(req, EINTR);
  // The kernel may have cached attributes from before the last write became final (mtime and ctime are the
  // service's): after close, stat must show the write, so drop them (attributes only; safe in a handler:
  // the kernel holds no inode lock while it waits for FLUSH).
  if ((fi->flags & O_ACCMODE) != O_RDONLY) fuse_lowlevel_notify_inval_inode(se, id, -1, 0);
  freply_err(req, to_errno_or_zero(table.take_write_error(id)));
}

void FuseClient::Impl::release(fuse_req_t req, FuseIno id, fuse_file_info* fi) {
  auto* of = reinterpret_cast<OpenFile*>(fi->fh);
  // Nobody receives release's answer; the writes still have to be final before the file counts as closed.
  kick_writes(id, stats.stage_sends_close);
  (void)table.wait_writes(id, [this] { return stopping.load(); });
  drop_prefetch(id);
  const auto hidden = table.released(id);
  if (hidden) remove_hidden(*hidden);
  delete of;
  freply_err(req, 0);
}

void FuseClient::Impl::fsync(fuse_req_t req, FuseIno id) {
  const auto h = handle_of(id);
  if (!h) return (void)freply_err(req, ESTALE);
  InterruptScope scope(req, table, stopping, ignore_interrupts);
  // The writes answered before fsync began; later ones are not its to wait for.
  const std::uint64_t upto = table.last_write_ticket(id);
  kick_writes(id, stats.stage_sends_fsync);
  if (!table.wait_writes(id, [&] { return scope.interrupted(); }, std::chrono::milliseconds(0), upto)) {
    return (void)freply_err(req, EINTR);
  }
  const std::uint32_t werr = table.take_write_error(id);
  if (werr != 0) return (void)freply_err(req, static_cast<int>(werr));
  fs::Op op = make_op(OpCode::kFsync, fs::Cred{0, 0, {}});
  op.handle = *h;
  CallResult r = call(&scope, single(std::move(op)), false);
  if (r.err == 0) table.update_attr(r.result.results[0].attr, r.seq);
  freply_err(req, r.err);
}

}  // namespace bftfs::client
