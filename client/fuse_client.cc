#define FUSE_USE_VERSION FUSE_MAKE_VERSION(3, 14)
#include "client/fuse_client.h"

#include <fuse_lowlevel.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <chrono>
#include <ctime>
#include <optional>
#include <string>
#include <thread>
#include <csignal>
#include <cstdio>
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <utility>
#include <vector>

#include "common/assert.h"
#include "common/log.h"
#include "runtime/status_file.h"
#include "services/fs/fs_service.h"

namespace bftfs::client {

namespace {

using fs::OpCode;

constexpr fs::Handle kRootHandle = fs::Handle{false, 0, 1, 1};
constexpr std::uint32_t kReadChunkBytes = fs::kIoBytesMax;
// The directory at the root where open-unlinked files wait for their last close (never listed).
const std::string kOrphanDir = ".bftfs-orphans";
// The largest write() the kernel sends (conn->max_write) is this many 512 KiB WRITE ops, one request each.
constexpr std::size_t kWriteOpsPerRequest = 2;
const std::uint64_t kFileBytesMax = fs::FsOptions{}.file_bytes_max;
// How long a daemon told to stop (SIGTERM, SIGINT, SIGHUP) still waits for its writes in flight to become
// final (the backend may be unreachable: a stop must end), and how often a FLUSH checks its caller.
constexpr std::chrono::seconds kStopGrace{10};
constexpr std::chrono::milliseconds kCallerPoll{200};
constexpr unsigned long kPfExiting = 0x4;  // PF_EXITING in /proc/<tid>/stat's flags (include/linux/sched.h)

// ---- errno: one table from the wire's Linux errnos and our own failures to what FUSE replies ----
// The wire carries Linux errno values (services/fs/fs_codec.h err::); this daemon runs on Linux, so a valid
// one passes through unchanged. Anything outside the range a Linux errno can take is a broken result: EIO.
int to_host_errno(std::uint32_t wire) {
  if (wire == 0 || wire > 4095) return EIO;
  return static_cast<int>(wire);
}

mode_t type_bits(fs::FileType t) {
  switch (t) {
    case fs::FileType::kRegular: return S_IFREG;
    case fs::FileType::kDirectory: return S_IFDIR;
    case fs::FileType::kSymlink: return S_IFLNK;
    case fs::FileType::kFifo: return S_IFIFO;
    case fs::FileType::kSocket: return S_IFSOCK;
    case fs::FileType::kCharDevice: return S_IFCHR;
    case fs::FileType::kBlockDevice: return S_IFBLK;
  }
  return S_IFREG;
}

// Times on the wire are nanoseconds since the epoch as a signed 64-bit number in two's complement
// (docs/FILESERVICE.md, Attr): 1677-09-21 .. 2262-04-11. The service stores them unchanged; the conversions
// both ways are here. A kernel time outside that range is clamped to its end (as a local file system clamps
// to its own s_time_min/max), never wrapped: a file from 1600 or 2600 must not come back as 1970 or 2015.
constexpr std::int64_t kNsPerSec = 1000000000;

timespec wire_to_timespec(std::uint64_t wire) {
  const auto v = static_cast<std::int64_t>(wire);  // two's complement by definition of the wire format
  std::int64_t sec = v / kNsPerSec;
  std::int64_t nsec = v % kNsPerSec;
  if (nsec < 0) {  // floor, so that tv_nsec is in [0, 1e9) also before 1970
    nsec += kNsPerSec;
    sec -= 1;
  }
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(sec);
  ts.tv_nsec = static_cast<long>(nsec);
  BFT_ASSERT(ts.tv_nsec >= 0 && ts.tv_nsec < kNsPerSec);
  return ts;
}

std::uint64_t timespec_to_wire(const timespec& ts) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
  const std::int64_t sec = static_cast<std::int64_t>(ts.tv_sec);
  const std::int64_t nsec = std::clamp<std::int64_t>(ts.tv_nsec, 0, kNsPerSec - 1);
  std::int64_t v = 0;
  if (sec > (kMax - nsec) / kNsPerSec) {
    v = kMax;
  } else if (sec < kMin / kNsPerSec) {  // kMin / 1e9 rounds toward zero: sec * 1e9 + nsec still fits at it
    v = kMin;
  } else {
    v = sec * kNsPerSec + nsec;
  }
  return static_cast<std::uint64_t>(v);
}

struct stat to_stat(const fs::Attr& a) {
  struct stat st {};
  st.st_ino = a.ino;
  st.st_mode = type_bits(a.type) | (a.mode & 07777);
  st.st_nlink = a.nlink;
  st.st_uid = a.uid;
  st.st_gid = a.gid;
  st.st_size = static_cast<off_t>(a.size);
  st.st_blocks = static_cast<blkcnt_t>(a.blocks);
  st.st_blksize = 65536;
  st.st_rdev = static_cast<dev_t>(a.rdev);
  st.st_atim = wire_to_timespec(a.atime_ns);
  st.st_mtim = wire_to_timespec(a.mtime_ns);
  st.st_ctim = wire_to_timespec(a.ctime_ns);
  return st;
}

// The caller's credentials for an op. The wire carries at most fs::kGroupsMax (16) supplementary groups (as
// NFS AUTH_SYS does) and Linux allows 65536; the service uses group membership only against the groups of
// the objects the op touches (and a chgrp's new group). So the groups among `relevant` (those gids, when the
// caller is in them) go first and the rest fill what is left: access through the 17th or 30th group counts
// like the first. An object whose group this client does not know yet (e.g. a directory moved by name) is
// checked with the first 16 only; under default_permissions the kernel has already checked it with all.
fs::Cred cred_of(fuse_req_t req, std::initializer_list<std::optional<std::uint32_t>> relevant = {}) {
  const fuse_ctx* ctx = fuse_req_ctx(req);
  fs::Cred c;
  c.uid = ctx->uid;
  c.gid = ctx->gid;
  std::vector<gid_t> groups(64);
  int n = fuse_req_getgroups(req, static_cast<int>(groups.size()), groups.data());
  if (n > static_cast<int>(groups.size())) {  // more than 64: ask again with room for all of them
    groups.resize(static_cast<std::size_t>(n));
    n = fuse_req_getgroups(req, n, groups.data());
  }
  // n < 0: not available (e.g. the process is gone); the primary gid still applies.
  groups.resize(static_cast<std::size_t>(std::clamp(n, 0, static_cast<int>(groups.size()))));
  auto add = [&](std::uint32_t g) {
    if (c.groups.size() >= fs::kGroupsMax || g == c.gid) return;
    if (std::find(c.groups.begin(), c.groups.end(), g) != c.groups.end()) return;
    c.groups.push_back(g);
  };
  for (const auto& g : relevant) {
    if (g && std::find(groups.begin(), groups.end(), static_cast<gid_t>(*g)) != groups.end()) add(*g);
  }
  for (const gid_t g : groups) add(g);
  BFT_ASSERT(c.groups.size() <= fs::kGroupsMax);
  return c;
}

bool in_group(const fs::Cred& c, std::uint32_t gid) {
  return c.gid == gid || std::find(c.groups.begin(), c.groups.end(), gid) != c.groups.end();
}

// Whether `c` has `want` (r=4, w=2, x=1) on `a` by its mode bits (the service's rule).
bool mode_allows(const fs::Cred& c, const fs::Attr& a, std::uint32_t want) {
  if (c.uid == 0) return true;
  std::uint32_t bits = 0;
  if (c.uid == a.uid) {
    bits = (a.mode >> 6) & 7;
  } else if (in_group(c, a.gid)) {
    bits = (a.mode >> 3) & 7;
  } else {
    bits = a.mode & 7;
  }
  return (bits & want) == want;
}

fs::Op make_op(OpCode code, const fs::Cred& cred) {
  fs::Op op;
  op.code = code;
  op.cred = cred;
  return op;
}

fs::Request single(fs::Op op) {
  fs::Request r;
  r.ops.push_back(std::move(op));
  return r;
}

// An open file (fuse_file_info::fh).
struct OpenFile {
  FuseIno node = 0;
  int flags = 0;
  fs::Cred cred;  // the opener's: I/O on the descriptor was authorized at open (see io_cred)
};

// What one waited-for request gave.
struct CallResult {
  int err = 0;              // 0, or the positive errno to reply
  bool predicate_failed = false;
  fs::Result result;        // when err == 0 or predicate_failed (results of ops 0..stop)
  std::uint64_t seq = 0;    // local submission number (orders attribute updates)
};

// Interrupt registration for one FUSE request, RAII: while alive, a FUSE_INTERRUPT for `req` sets the flag and
// wakes every waiter. The destructor unregisters; libfuse runs the callback under the request's lock, so after
// unregistering it can no longer run.
//
// A reply frees the request, so the scope must end before it: every reply goes through the freply_* wrappers
// below, which end the scope active on this thread (handlers reply on the thread that runs them).
class InterruptScope;
thread_local InterruptScope* tl_scope = nullptr;

class InterruptScope {
 public:
  // `stopping`: the daemon's stop flag (SIGTERM): a stopping daemon ends every wait as if interrupted.
  InterruptScope(fuse_req_t req, NodeTable& table, const std::atomic<bool>& stopping)
      : req_(req), table_(table), stopping_(stopping) {
    BFT_ASSERT(tl_scope == nullptr);  // one scope per handler
    tl_scope = this;
    fuse_req_interrupt_func(req_, &InterruptScope::on_interrupt, this);
  }
  ~InterruptScope() { end(); }
  // Unregisters (idempotent). After it returns the callback is not running and will not run.
  void end() {
    if (ended_) return;
    ended_ = true;
    fuse_req_interrupt_func(req_, nullptr, nullptr);
    tl_scope = nullptr;
  }
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;

  bool interrupted() const { return flag_.load() || stopping_.load(); }
  // Waiters on a call's condition variable register it so the interrupt wakes them too.
  void set_wakeup(std::mutex* mu, std::condition_variable* cv) {
    std::lock_guard<std::mutex> lock(wake_mu_);
    mu_ = mu;
    cv_ = cv;
  }

 private:
  static void on_interrupt(fuse_req_t, void* data) {
    auto* self = static_cast<InterruptScope*>(data);
    self->flag_.store(true);
    {
      std::lock_guard<std::mutex> lock(self->wake_mu_);
      if (self->mu_ != nullptr) {
        { std::lock_guard<std::mutex> l2(*self->mu_); }
        self->cv_->notify_all();
      }
    }
    self->table_.notify_waiters();
  }
  fuse_req_t req_;
  NodeTable& table_;
  const std::atomic<bool>& stopping_;
  std::atomic<bool> flag_{false};
  bool ended_ = false;
  std::mutex wake_mu_;
  std::mutex* mu_ = nullptr;
  std::condition_variable* cv_ = nullptr;
};

void end_scope() {
  if (tl_scope != nullptr) tl_scope->end();
}
int freply_err(fuse_req_t req, int err) { end_scope(); return fuse_reply_err(req, err); }
void freply_none(fuse_req_t req) { end_scope(); fuse_reply_none(req); }
int freply_entry(fuse_req_t req, const fuse_entry_param* e) { end_scope(); return fuse_reply_entry(req, e); }
int freply_create(fuse_req_t req, const fuse_entry_param* e, const fuse_file_info* fi) {
  end_scope();
  return fuse_reply_create(req, e, fi);
}
int freply_attr(fuse_req_t req, const struct stat* st, double timeout) {
  end_scope();
  return fuse_reply_attr(req, st, timeout);
}
int freply_readlink(fuse_req_t req, const char* link) { end_scope(); return fuse_reply_readlink(req, link); }
int freply_open(fuse_req_t req, const fuse_file_info* fi) { end_scope(); return fuse_reply_open(req, fi); }
int freply_write(fuse_req_t req, size_t count) { end_scope(); return fuse_reply_write(req, count); }
int freply_buf(fuse_req_t req, const char* buf, size_t size) { end_scope(); return fuse_reply_buf(req, buf, size); }
int freply_statfs(fuse_req_t req, const struct statvfs* st) { end_scope(); return fuse_reply_statfs(req, st); }

struct Waiter {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Final fin;
};

// Whether thread `tid` is exiting (PF_EXITING). A process killed while its writes are in flight closes its
// files from do_exit, and there FLUSH cannot be interrupted any more (the fatal signal is consumed, a second
// SIGKILL is ignored): the kernel waits for our answer, so FLUSH must not wait for a backend that may be
// unreachable. The answer goes to nobody; the writes still go on, and release waits for them. A thread that
// is gone counts as exiting.
bool thread_exiting(pid_t tid) {
  if (tid <= 0) return false;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(tid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT;
  char buf[1024];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  // After the command name's closing parenthesis: state ppid pgrp session tty_nr tpgid flags.
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr) return false;
  char state = 0;
  long ppid = 0, pgrp = 0, session = 0, tty = 0, tpgid = 0;
  unsigned long flags = 0;
  if (std::sscanf(p + 1, " %c %ld %ld %ld %ld %ld %lu", &state, &ppid, &pgrp, &session, &tty, &tpgid, &flags) != 7) {
    return false;
  }
  return (flags & kPfExiting) != 0;
}

}  // namespace

struct FuseClient::Impl {
  MountOptions opt;
  ClientCounters stats;
  NodeTable table{kRootHandle};
  Backend* backend = nullptr;
  fuse_session* se = nullptr;
  std::string mountpoint;
  std::atomic<std::uint64_t> next_seq{1};
  std::atomic<bool> mounted{false};
  // Set by a termination signal (serve()): every wait ends (handlers answer EINTR, un-interruptible waits
  // EIO), the mount goes away, and writes in flight get kStopGrace to become final before the daemon exits.
  std::atomic<bool> stopping{false};
  std::atomic<std::int64_t> stop_deadline_ns{0};  // steady clock
  std::mutex live_mu;
  std::set<std::shared_ptr<Waiter>> live;  // call()s waiting, woken by stop()
  // Hidden files of this mount (silly renames) go to one directory at the root that readdir never lists, so
  // user-visible directories never show them and can be removed while such files are open.
  std::mutex orphans_mu;
  std::optional<fs::Handle> orphans;
  const std::string silly_prefix = std::to_string(::getpid()) + "-" + std::to_string(::time(nullptr)) + "-";
  // Opens take it shared and name removals exclusive, so "is this file open here?" and the removal are
  // atomic with respect to this mount's opens (an open either registers first and the remover hides the
  // file, or starts after the removal and finds no file).
  std::shared_timed_mutex ns_mu;

  explicit Impl(MountOptions o) : opt(o) {}

  // Kernel cache invalidations wanted by backend callbacks. A callback must not write the notification to
  // /dev/fuse itself: the kernel may hold the page locks of a write() whose handler waits for callbacks
  // (write-behind's memory bound), and the invalidation would wait for those locks. One thread sends them.
  std::mutex inval_mu;
  std::condition_variable inval_cv;
  std::vector<FuseIno> inval_queue;
  bool inval_done = false;

  void request_inval(FuseIno id) {
    {
      std::lock_guard<std::mutex> lock(inval_mu);
      inval_queue.push_back(id);
    }
    inval_cv.notify_one();
  }

  // The invalidation thread's body: drops the pages and attributes of each queued node (a node the kernel
  // forgot meanwhile gives ENOENT: nothing to drop). Returns once inval_done is set and the queue is empty.
  void run_invalidations() {
    std::unique_lock<std::mutex> lock(inval_mu);
    for (;;) {
      inval_cv.wait(lock, [this] { return inval_done || !inval_queue.empty(); });
      if (inval_queue.empty()) return;
      std::vector<FuseIno> batch;
      batch.swap(inval_queue);
      lock.unlock();
      for (const FuseIno id : batch) (void)fuse_lowlevel_notify_inval_inode(se, id, 0, 0);
      lock.lock();
    }
  }

  // Ends every wait (see `stopping`). Thread-safe; not async-signal-safe (serve() calls it from a thread).
  void stop() {
    stop_deadline_ns.store(std::chrono::duration_cast<std::chrono::nanoseconds>(
                               (std::chrono::steady_clock::now() + kStopGrace).time_since_epoch())
                               .count());
    stopping.store(true);
    {
      std::lock_guard<std::mutex> lock(live_mu);
      for (const auto& w : live) {
        { std::lock_guard<std::mutex> l2(w->mu); }
        w->cv.notify_all();
      }
    }
    table.notify_waiters();
  }

  bool stop_grace_over() const {
    if (!stopping.load()) return false;
    const auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::steady_clock::now().time_since_epoch()).count();
    return now >= stop_deadline_ns.load();
  }

  // Locks ns_mu (shared or exclusive) unless `scope` is interrupted first; the holder only waits for the
  // backend, interruptibly, so a waiter here stays killable.
  class NsLock {
   public:
    NsLock(std::shared_timed_mutex& mu, InterruptScope& scope, bool exclusive) : mu_(mu), exclusive_(exclusive) {
      while (!scope.interrupted()) {
        if (exclusive ? mu.try_lock_for(std::chrono::milliseconds(20))
                      : mu.try_lock_shared_for(std::chrono::milliseconds(20))) {
          held_ = true;
          return;
        }
      }
    }
    ~NsLock() {
      if (!held_) return;
      if (exclusive_) {
        mu_.unlock();
      } else {
        mu_.unlock_shared();
      }
    }
    NsLock(const NsLock&) = delete;
    NsLock& operator=(const NsLock&) = delete;
    bool held() const { return held_; }

   private:
    std::shared_timed_mutex& mu_;
    bool exclusive_;
    bool held_ = false;
  };

  // ---- calling the backend ----

  // Submits `r` and waits for its final result, or until `scope` is interrupted (then EINTR; the request may
  // still execute). With a null scope the wait is not interruptible (release, forget: the kernel waits for
  // no answer).
  CallResult call(InterruptScope* scope, const fs::Request& r, bool read_only) {
    auto w = std::make_shared<Waiter>();
    // A mutation of an object must execute after every write() of it answered before (a chmod or utimes after
    // a write: the service executes in submission order): the object's staged writes go first, and take
    // their local sequence numbers first (numbers order attribute updates: node_table.h). Other objects'
    // staged writes need not: their order relative to this request is invisible to this client (its reads
    // wait for them) and another client is promised them only after close (close-to-open).
    if (!read_only) kick_writes_of(r);
    CallResult out;
    out.seq = next_seq.fetch_add(1);
    SubmitOptions so;
    so.read_only = read_only;
    ++(read_only ? stats.requests_read_only : stats.requests_ordered);
    if (!read_only) {
      raise_attr_barrier(out.seq);
      note_ordered_submit(out.seq);
    }
    Callbacks cb;
    cb.on_final = [w](Final f) {
      {
        std::lock_guard<std::mutex> lock(w->mu);
        w->fin = std::move(f);
        w->done = true;
      }
      w->cv.notify_all();
    };
    {
      std::lock_guard<std::mutex> lock(live_mu);
      live.insert(w);
    }
    const std::uint64_t tag = backend->submit(r, so, std::move(cb));
    bool done = false;
    {
      if (scope != nullptr) scope->set_wakeup(&w->mu, &w->cv);
      std::unique_lock<std::mutex> lock(w->mu);
      w->cv.wait(lock, [&] { return w->done || stopping.load() || (scope != nullptr && scope->interrupted()); });
      done = w->done;
    }
    if (scope != nullptr) scope->set_wakeup(nullptr, nullptr);
    {
      std::lock_guard<std::mutex> lock(live_mu);
      live.erase(w);
    }
    if (!done) {
      backend->cancel(tag);
      // A mutation that may still execute at any later time: the attribute cache can no longer tell which
      // attributes predate it, so it stops answering for the rest of this mount's life (rare: an interrupt).
      if (!read_only) attr_barrier.store(UINT64_MAX);
      out.err = scope != nullptr ? EINTR : EIO;
      return out;
    }
    // Every request submitted from now on is ordered after this mutation (or, read-only, runs on a state
    // that includes it).
    if (!read_only) {
      raise_attr_barrier(next_seq.load());
      // The attributes in this mutation's own result are the state right after it. If no other ordered
      // request was submitted while it was in flight, nothing of this client can have changed them since:
      // they count as fresh from now on (a number at or above the barrier), so that the kernel's next
      // GETATTR of an object the mutation returned (the created file, the changed directory) costs no
      // request. Otherwise they keep the mutation's own number (ordered by it, stale for the cache).
      if (last_ordered_submit.load() == out.seq) out.seq = next_seq.fetch_add(1);
    }
    return interpret(std::move(w->fin), out);
  }

  // The number of the last ordered request submitted (call() or a staged write).
  std::atomic<std::uint64_t> last_ordered_submit{0};
  void note_ordered_submit(std::uint64_t seq) {
    std::uint64_t cur = last_ordered_submit.load();
    while (cur < seq && !last_ordered_submit.compare_exchange_weak(cur, seq)) {
    }
  }

  // `op` followed by a GETATTR of each directory in `dirs`: a mutation that changes directories (create,
  // mkdir, unlink, rename...) returns their new attributes in the same request, because the kernel asks for
  // them right after (it drops a directory's attributes when it changes, and needs its mode for the next
  // permission check). The GETATTRs cannot fail once the op succeeded in those directories (one request is
  // atomic), and go with root credentials (attributes are not permission-checked data).
  static fs::Request with_dir_attrs(fs::Op op, std::initializer_list<fs::Handle> dirs) {
    fs::Request r;
    r.ops.push_back(std::move(op));
    for (const fs::Handle& d : dirs) {
      if (std::any_of(r.ops.begin() + 1, r.ops.end(), [&](const fs::Op& o) { return o.handle == d; })) continue;
      fs::Op g = make_op(OpCode::kGetattr, fs::Cred{0, 0, {}});
      g.handle = d;
      r.ops.push_back(std::move(g));
    }
    return r;
  }
  // Puts the directory attributes of ops [first, end) of a successful result into the cache.
  void note_dir_attrs(const CallResult& r, std::size_t first) {
    if (r.err != 0) return;
    for (std::size_t i = first; i < r.result.results.size(); ++i) {
      const fs::OpResult& o = r.result.results[i];
      if (o.code == OpCode::kGetattr && o.err == 0) table.update_attr(o.attr, r.seq);
    }
  }

  // Attributes from requests numbered below the barrier are not answered from the attribute cache.
  std::atomic<std::uint64_t> attr_barrier{0};
  void raise_attr_barrier(std::uint64_t to) {
    std::uint64_t cur = attr_barrier.load();
    while (cur < to && !attr_barrier.compare_exchange_weak(cur, to)) {
    }
  }

  static CallResult interpret(Final fin, CallResult out) {
    if (fin.status == FinalStatus::kRefused) {
      LOG_ERROR("", "client: request refused by the backend: %s", fin.reason.c_str());
      out.err = EIO;
      return out;
    }
    const fs::Result& res = fin.result;
    switch (res.outcome) {
      case fs::Outcome::kDone:
        out.result = std::move(fin.result);
        return out;
      case fs::Outcome::kOpFailed:
        if (res.stop >= res.results.size()) {
          out.err = EIO;
          return out;
        }
        out.err = to_host_errno(res.results[res.stop].err);
        out.result = std::move(fin.result);
        return out;
      case fs::Outcome::kPredicateFailed:
        out.predicate_failed = true;
        out.result = std::move(fin.result);
        return out;
      case fs::Outcome::kMalformed:
        // Our own encoder produced something the service rejects: a bug on this side, not the user's.
        LOG_ERROR("", "client: the service rejected a request as malformed (reason %u)", res.stop);
        out.err = EIO;
        return out;
    }
    out.err = EIO;
    return out;
  }

  // ---- replies ----

  void reply_entry(fuse_req_t req, const fs::Attr& attr, std::uint64_t seq) {
    const FuseIno id = table.remember(attr, seq);
    fuse_entry_param e{};
    e.ino = id;
    e.generation = attr.generation;
    const auto s = table.snapshot(id);
    e.attr = to_stat(s ? s->attr : attr);
    e.attr_timeout = opt.attr_timeout_s;
    e.entry_timeout = opt.entry_timeout_s;
    // If the kernel did not take the entry (the request was interrupted), it will never forget it.
    if (freply_entry(req, &e) != 0) (void)table.forget(id, 1);
  }

  void reply_attr(fuse_req_t req, FuseIno id, const fs::Attr& fallback) {
    const auto s = table.snapshot(id);
    const struct stat st = to_stat(s ? s->attr : fallback);
    freply_attr(req, &st, opt.attr_timeout_s);
  }

  // The credentials for I/O on an open descriptor. POSIX checks permission at open, not per read or write:
  // a file created 0444 and written through the descriptor that created it (git objects, tar) must work. The
  // service checks every WRITE/READ against the mode, so when the opener's credentials no longer pass the mode
  // check, the I/O goes with root credentials -- the descriptor is the capability the kernel already granted.
  fs::Cred io_cred(const OpenFile* of, FuseIno id, std::uint32_t want) {
    const auto s = table.snapshot(id);
    if (of == nullptr || !s) return fs::Cred{0, 0, {}};
    if (mode_allows(of->cred, s->attr, want)) return of->cred;
    return fs::Cred{0, 0, {}};
  }

  std::optional<fs::Handle> handle_of(FuseIno id) { return table.handle(id); }
  // The group of node `id` as this client last saw it (for cred_of), or nothing if unknown.
  std::optional<std::uint32_t> gid_of(FuseIno id) {
    const auto s = table.snapshot(id);
    if (!s) return std::nullopt;
    return s->attr.gid;
  }

  // ---- handlers ----

  void lookup(fuse_req_t req, FuseIno parent, const char* name) {
    const auto dir = handle_of(parent);
    if (!dir) return (void)freply_err(req, ESTALE);
    fs::Op op = make_op(OpCode::kLookup, cred_of(req, {gid_of(parent)}));
    op.handle = *dir;
    op.name = name;
    InterruptScope scope(req, table, stopping);
    CallResult r = call(&scope, single(std::move(op)), true);
    if (r.err == ENOENT) ++stats.lookups_enoent;
    if (r.err == ENOENT && opt.negative_timeout_s > 0) {
      fuse_entry_param e{};
      e.ino = 0;
      e.entry_timeout = opt.negative_timeout_s;
      freply_entry(req, &e);
      return;
    }
    if (r.err != 0) return (void)freply_err(req, r.err);
    reply_entry(req, r.result.results[0].attr, r.seq);
  }

  void forget(FuseIno id, std::uint64_t n) {
    std::optional<SillyName> hidden;
    (void)table.forget(id, n, &hidden);
    if (hidden) remove_hidden_async(*hidden);
  }

  // remove_hidden without waiting (forget has no reply and must not hold a handler thread for a round trip).
  void remove_hidden_async(const SillyName& s) {
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

  void getattr(fuse_req_t req, FuseIno id) {
    const auto s = table.snapshot(id);
    if (!s) return (void)freply_err(req, ESTALE);
    InterruptScope scope(req, table, stopping);
    // Our own writes in flight: their size is in the overlay, but their mtime, ctime and blocks are the
    // service's (agreed time) and known only once they are final. stat after write must show them, so wait.
    if (s->has_pending) kick_writes(id, stats.stage_sends_getattr);
    if (s->has_pending && !table.wait_writes(id, [&] { return scope.interrupted(); })) {
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
        now && !now->has_pending && opt.attr_timeout_s > 0 && now->attr_seq >= attr_barrier.load()) {
      const double age_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - now->attr_time).count();
      if (age_s >= 0 && age_s < opt.attr_timeout_s) {
        ++stats.getattr_cache_hits;
        const struct stat st = to_stat(now->attr);
        return (void)freply_attr(req, &st, opt.attr_timeout_s - age_s);
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

  void setattr(fuse_req_t req, FuseIno id, const struct stat* attr, int to_set) {
    const auto h = handle_of(id);
    if (!h) return (void)freply_err(req, ESTALE);
    InterruptScope scope(req, table, stopping);
    // Truncation must follow our writes in flight (a truncate is ordered after them anyway; waiting also keeps
    // the overlay from extending the size the truncate sets).
    if ((to_set & FUSE_SET_ATTR_SIZE) != 0) {
      kick_writes(id, stats.stage_sends_mutation);
      drop_prefetch(id);
    }
    if ((to_set & FUSE_SET_ATTR_SIZE) != 0 && !table.wait_writes(id, [&] { return scope.interrupted(); })) {
      return (void)freply_err(req, EINTR);
    }
    const std::optional<std::uint32_t> new_gid =
        (to_set & FUSE_SET_ATTR_GID) != 0 ? std::optional<std::uint32_t>(attr->st_gid) : std::nullopt;
    fs::Op op = make_op(OpCode::kSetattr, cred_of(req, {gid_of(id), new_gid}));
    op.handle = *h;
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
      if (attr->st_size < 0) return (void)freply_err(req, EINVAL);
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
    // A write or truncate by a non-owner makes the kernel clear S_ISUID/S_ISGID with a SETATTR of the mode in
    // the writer's name; the service lets only the owner change a mode. The kernel already decided the
    // clearing (under default_permissions), so a change that only drops those bits goes with root credentials.
    if (m == fs::setattr::kMode && opt.default_permissions) {
      const auto s = table.snapshot(id);
      const std::uint32_t old_mode = s ? s->attr.mode : 0;
      const bool only_clears_ids = (op.mode & ~06000u) == (old_mode & ~06000u) &&  // nothing else changes
                                   (op.mode & ~old_mode) == 0 &&                  // no bit is set
                                   op.mode != old_mode;                            // some bit is cleared
      if (s && s->attr.uid != op.cred.uid && only_clears_ids) {
        op.cred = fs::Cred{0, 0, {}};
      }
    }
    CallResult r = call(&scope, single(std::move(op)), m == 0);
    if (r.err != 0) return (void)freply_err(req, r.err);
    table.update_attr(r.result.results[0].attr, r.seq);
    reply_attr(req, id, r.result.results[0].attr);
  }

  void readlink(fuse_req_t req, FuseIno id) {
    const auto h = handle_of(id);
    if (!h) return (void)freply_err(req, ESTALE);
    fs::Op op = make_op(OpCode::kReadlink, cred_of(req));
    op.handle = *h;
    InterruptScope scope(req, table, stopping);
    CallResult r = call(&scope, single(std::move(op)), true);
    if (r.err != 0) return (void)freply_err(req, r.err);
    freply_readlink(req, r.result.results[0].target.c_str());
  }

  // MKNOD, MKDIR, SYMLINK and CREATE without open: one op that returns the new object's Attr.
  void make_entry(fuse_req_t req, fs::Op op) {
    InterruptScope scope(req, table, stopping);
    const OpCode code = op.code;
    const fs::Handle dir = code == OpCode::kLink ? op.handle2 : op.handle;
    CallResult r = call(&scope, with_dir_attrs(std::move(op), {dir}), false);
    // The directory is gone (removed while we held it, e.g. as a cwd): no new entry there, as on Linux.
    if (r.err == ESTALE && code != OpCode::kLink) return (void)freply_err(req, ENOENT);
    if (r.err != 0) return (void)freply_err(req, r.err);
    note_dir_attrs(r, 1);
    reply_entry(req, r.result.results[0].attr, r.seq);
  }

  void mknod(fuse_req_t req, FuseIno parent, const char* name, mode_t mode, dev_t rdev) {
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

  void mkdir(fuse_req_t req, FuseIno parent, const char* name, mode_t mode) {
    const auto dir = handle_of(parent);
    if (!dir) return (void)freply_err(req, ESTALE);
    fs::Op op = make_op(OpCode::kMkdir, cred_of(req, {gid_of(parent)}));
    op.handle = *dir;
    op.name = name;
    op.mode = mode & 07777;
    make_entry(req, std::move(op));
  }

  void symlink(fuse_req_t req, const char* link, FuseIno parent, const char* name) {
    const auto dir = handle_of(parent);
    if (!dir) return (void)freply_err(req, ESTALE);
    fs::Op op = make_op(OpCode::kSymlink, cred_of(req, {gid_of(parent)}));
    op.handle = *dir;
    op.name = name;
    op.target = link;
    if (op.target.size() > fs::kSymlinkWireBytesMax) return (void)freply_err(req, ENAMETOOLONG);
    make_entry(req, std::move(op));
  }

  // If (dir, name) names a regular file whose last link that name is and which the kernel still references
  // (an open, or a lookup it may be about to open: another process's path walk may have found this very file
  // and be on its way to OPEN), returns its node: removing the name must then hide the file instead (silly
  // rename), and the hidden name goes at the kernel's last release or forget. This is the inode lifetime of a
  // local file system (an unlinked inode lives while referenced), as libfuse asks of a file system.
  std::optional<FuseIno> open_last_link(InterruptScope& scope, const fs::Cred& cred, const fs::Handle& dir,
                                       const std::string& name, int& err) {
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

  // The orphan directory's handle, made (mode 01777, root's) the first time. Returns 0 or an errno.
  int orphan_dir(InterruptScope& scope, bool refresh, fs::Handle& out) {
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

  bool is_orphan_dir(const fs::Handle& h) {
    std::lock_guard<std::mutex> lock(orphans_mu);
    return orphans && *orphans == h;
  }

  // Moves (dir, name) of open node `id` to a hidden name in the orphan directory, then runs `then` (the same
  // request: all or nothing). Returns 0 or an errno.
  int hide(InterruptScope& scope, const fs::Cred& cred, FuseIno id, const fs::Handle& dir, const std::string& name,
           std::vector<fs::Op>* then) {
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

  void remove_hidden(const SillyName& s) {
    fs::Op op = make_op(OpCode::kRemove, fs::Cred{0, 0, {}});
    op.handle = s.dir;
    op.name = s.name;
    CallResult r = call(nullptr, single(std::move(op)), false);
    if (r.err != 0 && r.err != ENOENT) {
      LOG_WARN("", "client: could not remove hidden file %s: %s", s.name.c_str(), std::strerror(r.err));
    }
  }

  void unlink(fuse_req_t req, FuseIno parent, const char* name) {
    const auto dir = handle_of(parent);
    if (!dir) return (void)freply_err(req, ESTALE);
    const fs::Cred cred = cred_of(req, {gid_of(parent)});
    InterruptScope scope(req, table, stopping);
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

  void rmdir(fuse_req_t req, FuseIno parent, const char* name) {
    const auto dir = handle_of(parent);
    if (!dir) return (void)freply_err(req, ESTALE);
    fs::Op op = make_op(OpCode::kRmdir, cred_of(req, {gid_of(parent)}));
    op.handle = *dir;
    op.name = name;
    InterruptScope scope(req, table, stopping);
    CallResult r = call(&scope, with_dir_attrs(std::move(op), {*dir}), false);
    note_dir_attrs(r, 1);
    freply_err(req, r.err);
  }

  void rename(fuse_req_t req, FuseIno parent, const char* name, FuseIno newparent, const char* newname,
              unsigned flags) {
    if ((flags & ~static_cast<unsigned>(RENAME_NOREPLACE)) != 0) return (void)freply_err(req, EINVAL);
    const auto from = handle_of(parent);
    const auto to = handle_of(newparent);
    if (!from || !to) return (void)freply_err(req, ESTALE);
    const fs::Cred cred = cred_of(req, {gid_of(parent), gid_of(newparent)});
    InterruptScope scope(req, table, stopping);
    fs::Op mv = make_op(OpCode::kRename, cred);
    mv.handle = *from;
    mv.name = name;
    mv.handle2 = *to;
    mv.name2 = newname;
    if ((flags & RENAME_NOREPLACE) != 0) {
      // One request: "the target does not exist" as a predicate, then the rename; all or nothing, so no other
      // client can create the target in between.
      fs::Request r;
      fs::Op probe = make_op(OpCode::kLookup, cred);
      probe.handle = *to;
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
      return (void)freply_err(req, res.err);
    }
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

  void link(fuse_req_t req, FuseIno id, FuseIno newparent, const char* newname) {
    const auto h = handle_of(id);
    const auto dir = handle_of(newparent);
    if (!h || !dir) return (void)freply_err(req, ESTALE);
    fs::Op op = make_op(OpCode::kLink, cred_of(req, {gid_of(newparent), gid_of(id)}));
    op.handle = *h;
    op.handle2 = *dir;
    op.name = newname;
    make_entry(req, std::move(op));
  }

  // Access bits an open with `flags` needs.
  static std::uint8_t open_wants(int flags) {
    switch (flags & O_ACCMODE) {
      case O_RDONLY: return 4;
      case O_WRONLY: return 2;
      default: return 6;
    }
  }

  // Asks the service whether the caller may `want` on `h` (only without default_permissions).
  int check_access(InterruptScope& scope, const fs::Cred& cred, const fs::Handle& h, std::uint8_t want) {
    fs::Op op = make_op(OpCode::kAccess, cred);
    op.handle = h;
    op.access = want;
    CallResult r = call(&scope, single(std::move(op)), true);
    if (r.err != 0) return r.err;
    return r.result.results[0].granted == want ? 0 : EACCES;
  }

  // ---- open-time prefetch ----
  // The data a READ at open brought (see open()), kept for the kernel's first reads of the file. Valid
  // while the file's version (mtime, size) is the one read: our own writes and truncates change it.
  struct Prefetch {
    Bytes data;
    bool eof = false;
    DataVersion version;
  };
  static constexpr std::uint32_t kPrefetchBytes = 128u << 10;  // the kernel's usual first read of a file
  std::mutex pf_mu;
  std::unordered_map<FuseIno, Prefetch> prefetched;

  // A read-only open of a regular file whose pages the kernel will not keep (no version recorded: the first
  // open since the node was known): the kernel will read it from the start.
  bool wants_prefetch(const NodeSnapshot& s, int flags) {
    if ((flags & O_ACCMODE) != O_RDONLY || s.attr.type != fs::FileType::kRegular) return false;
    if (!opt.default_permissions) return false;  // open() asks ACCESS first; keep the plain order
    return !table.data_version(s.id).has_value();
  }

  // Answers a read of [off, off + size) from the open's prefetch when it holds that range (or its end of
  // file) for the file's current version. Returns true if it replied.
  bool serve_prefetched(fuse_req_t req, FuseIno id, std::size_t size, std::uint64_t off) {
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

  void drop_prefetch(FuseIno id) {
    std::lock_guard<std::mutex> lock(pf_mu);
    prefetched.erase(id);
  }

  void open(fuse_req_t req, FuseIno id, fuse_file_info* fi) {
    const auto s = table.snapshot(id);
    if (!s) return (void)freply_err(req, ESTALE);
    const fs::Cred cred = cred_of(req, {s->attr.gid});
    InterruptScope scope(req, table, stopping);
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
    // where the service's end is (see write()).
    if (freply_open(req, fi) != 0) {
      (void)table.released(id);
      delete of;
    }
  }

  void create(fuse_req_t req, FuseIno parent, const char* name, mode_t mode, fuse_file_info* fi) {
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
    InterruptScope scope(req, table, stopping);
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
    fuse_entry_param e{};
    e.ino = id;
    e.generation = attr.generation;
    const auto s = table.snapshot(id);
    e.attr = to_stat(s ? s->attr : attr);
    e.attr_timeout = opt.attr_timeout_s;
    e.entry_timeout = opt.entry_timeout_s;
    if (freply_create(req, &e, fi) != 0) {
      (void)table.released(id);
      (void)table.forget(id, 1);
      delete of;
    }
  }

  void read(fuse_req_t req, FuseIno id, size_t size, off_t off, fuse_file_info* fi) {
    auto* of = reinterpret_cast<OpenFile*>(fi->fh);
    const auto h = handle_of(id);
    if (!h) return (void)freply_err(req, ESTALE);
    if (off < 0) return (void)freply_err(req, EINVAL);
    InterruptScope scope(req, table, stopping);
    // Read-your-writes: the data of our writes in flight is only in the service once they are final.
    kick_writes(id, stats.stage_sends_read);
    if (!table.wait_writes(id, [&] { return scope.interrupted(); })) return (void)freply_err(req, EINTR);
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

  void write(fuse_req_t req, FuseIno id, const char* buf, size_t size, off_t off, fuse_file_info* fi) {
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
    {
      InterruptScope scope(req, table, stopping);
      const std::uint64_t limit = opt.write_behind_bytes_max > size ? opt.write_behind_bytes_max - size : 0;
      if (table.pending_bytes() > limit) kick_all_writes();  // staged bytes count: send them
      if (!table.wait_pending_below(limit, [&] { return scope.interrupted(); })) {
        return (void)freply_err(req, EINTR);
      }
    }
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
      table.write_submitted(id, op.offset, n, append);
      queue_write(id, std::move(op), static_cast<std::uint64_t>(off) + done);
      drop_prefetch(id);
      done += n;
    } while (done < size);
    freply_write(req, size);
  }

  // ---- write coalescing ----
  // write() is answered at once (write-behind) and its data is staged per file; the staged pieces go out as
  // one request when they reach kIoBytesMax or kCoalesceOpsMax ops, when anything needs them at the service
  // (flush at close, fsync, release, a read or getattr of the file, a truncate, any other mutation of this
  // client, the write-behind memory bound, unmount), and at the latest kStageDelay after the first piece
  // was staged (so a file that stays open reaches the service anyway, as NFS's periodic write-back does).
  // A writer of many small pieces (as, ar, ld write an object file in dozens of small writes) then costs one
  // ordered request per file instead of one per write(). Contiguous pieces merge into one WRITE op; others
  // become further ops of the same compound request, which the service executes in order, all or nothing
  // (docs/FILESERVICE.md §1): the same effect as sending them one by one in that order. Every piece stays in
  // the node table's overlay (write_submitted) until its request is final, so waiters (flush, fsync, read,
  // getattr) kick the staged pieces out first and then wait for them as for any write in flight.
  struct WritePiece {
    std::uint64_t offset = 0;
    std::uint64_t len = 0;
    bool append = false;
    std::uint64_t kernel_offset = 0;  // where the kernel's page cache put the bytes
    std::size_t op_index = 0;         // the op of the compound request that carries them
  };
  struct StagedRequest {
    fs::Request request;
    std::vector<WritePiece> pieces;
    std::size_t bytes = 0;
    std::chrono::steady_clock::time_point since;  // when the first piece was staged
  };
  std::mutex wq_mu;
  std::condition_variable wq_cv;  // wakes the stage flusher
  bool wq_stopping = false;
  std::map<FuseIno, StagedRequest> staged_writes;  // by node; ordered so kick_all goes in a fixed order
  std::thread stage_flusher;
  static constexpr std::size_t kCoalesceOpsMax = 32;  // ops per coalesced request (the wire allows 64)
  static constexpr std::chrono::milliseconds kStageDelay{20};

  void queue_write(FuseIno id, fs::Op op, std::uint64_t kernel_offset) {
    WritePiece piece{op.offset, op.data.size(), op.append, kernel_offset, 0};
    std::lock_guard<std::mutex> lock(wq_mu);
    auto it = staged_writes.find(id);
    if (it != staged_writes.end() && (it->second.bytes + op.data.size() > fs::kIoBytesMax ||
                                      it->second.request.ops.size() >= kCoalesceOpsMax)) {
      submit_staged_locked(it, stats.stage_sends_full);
      it = staged_writes.end();
    }
    if (it == staged_writes.end()) {
      it = staged_writes.emplace(id, StagedRequest{}).first;
      it->second.since = std::chrono::steady_clock::now();
      if (staged_writes.size() == 1) wq_cv.notify_all();
    } else {
      ++stats.writes_coalesced;
    }
    StagedRequest& st = it->second;
    st.bytes += op.data.size();
    fs::Op* last = st.request.ops.empty() ? nullptr : &st.request.ops.back();
    if (last != nullptr && !op.append && !last->append && last->offset + last->data.size() == op.offset &&
        last->cred == op.cred) {
      last->data.insert(last->data.end(), op.data.begin(), op.data.end());  // contiguous: one op
    } else {
      st.request.ops.push_back(std::move(op));
    }
    piece.op_index = st.request.ops.size() - 1;
    st.pieces.push_back(piece);
    if (st.bytes >= fs::kIoBytesMax) submit_staged_locked(it, stats.stage_sends_full);
  }

  // Submits node `id`'s staged writes now, if any.
  void kick_writes(FuseIno id, std::atomic<std::uint64_t>& reason) {
    std::lock_guard<std::mutex> lock(wq_mu);
    if (auto it = staged_writes.find(id); it != staged_writes.end()) submit_staged_locked(it, reason);
  }
  // Kicks the staged writes of every object a request names by handle.
  void kick_writes_of(const fs::Request& r) {
    {
      std::lock_guard<std::mutex> lock(wq_mu);
      if (staged_writes.empty()) return;
    }
    for (const fs::Op& op : r.ops) {
      for (const fs::Handle* h : {&op.handle, &op.handle2}) {
        if (h->is_ref || h->ino == 0) continue;
        if (const auto id = table.find(*h)) kick_writes(*id, stats.stage_sends_mutation);
      }
    }
  }
  void kick_all_writes() {
    std::lock_guard<std::mutex> lock(wq_mu);
    while (!staged_writes.empty()) submit_staged_locked(staged_writes.begin(), stats.stage_sends_other);
  }

  // Submits and forgets one staged request. With wq_mu held, so that requests leave in staging order
  // (submit only queues; callbacks run on the backend's thread and never take wq_mu).
  void submit_staged_locked(std::map<FuseIno, StagedRequest>::iterator it, std::atomic<std::uint64_t>& reason) {
    ++reason;
    const FuseIno id = it->first;
    StagedRequest r = std::move(it->second);
    staged_writes.erase(it);
    BFT_ASSERT(!r.request.ops.empty());
    const std::uint64_t seq = next_seq.fetch_add(1);
    note_ordered_submit(seq);
    Callbacks cb;
    cb.on_final = [this, id, pieces = std::move(r.pieces), seq](Final f) {
      CallResult out = interpret(std::move(f), CallResult{});
      std::optional<fs::Attr> attr;
      if (out.err == 0 && !out.result.results.empty()) attr = out.result.results.back().attr;
      // An append lands at (size after it) - len; elsewhere than the kernel's offset (another client appended
      // meanwhile), this mount's cached pages are wrong: dropped now (asynchronously) and, for certain, at the
      // next open. Every append is an op of its own (never merged), with its own result.
      bool misplaced = false;
      for (const WritePiece& p : pieces) {
        if (!p.append || out.err != 0 || p.op_index >= out.result.results.size()) continue;
        const fs::Attr& a = out.result.results[p.op_index].attr;
        misplaced = misplaced || a.size < p.len || a.size - p.len != p.kernel_offset;
      }
      if (misplaced) {
        table.drop_data_version(id);
        request_inval(id);
      }
      for (const WritePiece& p : pieces) {
        table.write_finished(id, p.offset, p.len, static_cast<std::uint32_t>(out.err), attr, seq);
      }
    };
    ++stats.requests_ordered;
    (void)backend->submit(r.request, SubmitOptions{}, std::move(cb));
  }

  // The stage flusher's loop: sends staged writes older than kStageDelay.
  void flush_stale_stages() {
    std::unique_lock<std::mutex> lock(wq_mu);
    while (!wq_stopping) {
      if (staged_writes.empty()) {
        wq_cv.wait(lock);
        continue;
      }
      const auto now = std::chrono::steady_clock::now();
      auto oldest = now;
      for (auto it = staged_writes.begin(); it != staged_writes.end();) {
        auto next = std::next(it);
        if (now - it->second.since >= kStageDelay) {
          submit_staged_locked(it, stats.stage_sends_timer);
        } else {
          oldest = std::min(oldest, it->second.since);
        }
        it = next;
      }
      if (!staged_writes.empty()) wq_cv.wait_until(lock, oldest + kStageDelay);
    }
  }
  void start_stage_flusher() { stage_flusher = std::thread([this] { flush_stale_stages(); }); }
  void stop_stage_flusher() {
    {
      std::lock_guard<std::mutex> lock(wq_mu);
      wq_stopping = true;
    }
    wq_cv.notify_all();
    if (stage_flusher.joinable()) stage_flusher.join();
  }

  void flush(fuse_req_t req, FuseIno id, fuse_file_info* fi) {
    InterruptScope scope(req, table, stopping);
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
        kCallerPoll);
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

  static int to_errno_or_zero(std::uint32_t e) { return e == 0 ? 0 : static_cast<int>(e); }

  void release(fuse_req_t req, FuseIno id, fuse_file_info* fi) {
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

  void fsync(fuse_req_t req, FuseIno id) {
    const auto h = handle_of(id);
    if (!h) return (void)freply_err(req, ESTALE);
    InterruptScope scope(req, table, stopping);
    kick_writes(id, stats.stage_sends_fsync);
    if (!table.wait_writes(id, [&] { return scope.interrupted(); })) return (void)freply_err(req, EINTR);
    const std::uint32_t werr = table.take_write_error(id);
    if (werr != 0) return (void)freply_err(req, static_cast<int>(werr));
    fs::Op op = make_op(OpCode::kFsync, fs::Cred{0, 0, {}});
    op.handle = *h;
    CallResult r = call(&scope, single(std::move(op)), false);
    if (r.err == 0) table.update_attr(r.result.results[0].attr, r.seq);
    freply_err(req, r.err);
  }

  void opendir(fuse_req_t req, FuseIno id, fuse_file_info* fi) {
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

  void readdir(fuse_req_t req, FuseIno id, size_t size, off_t off, bool plus) {
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

  void statfs(fuse_req_t req) {
    fs::Op op = make_op(OpCode::kStatfs, cred_of(req));
    op.handle = kRootHandle;
    InterruptScope scope(req, table, stopping);
    CallResult r = call(&scope, single(std::move(op)), true);
    if (r.err != 0) return (void)freply_err(req, r.err);
    const fs::StatFs& s = r.result.results[0].statfs;
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

  void access(fuse_req_t req, FuseIno id, int mask) {
    const auto h = handle_of(id);
    if (!h) return (void)freply_err(req, ESTALE);
    InterruptScope scope(req, table, stopping);
    const std::uint8_t want = static_cast<std::uint8_t>(mask & 7);
    if (want == 0) {
      fs::Op op = make_op(OpCode::kGetattr, cred_of(req, {gid_of(id)}));
      op.handle = *h;
      CallResult r = call(&scope, single(std::move(op)), true);
      return (void)freply_err(req, r.err);
    }
    freply_err(req, check_access(scope, cred_of(req, {gid_of(id)}), *h, want));
  }
};

// ---- C trampolines ----
namespace {

FuseClient::Impl* impl_of(fuse_req_t req) { return static_cast<FuseClient::Impl*>(fuse_req_userdata(req)); }

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
  impl_of(req)->lookup(req, parent, name);
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
  impl_of(req)->getattr(req, ino);
}
void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info*) {
  ++impl_of(req)->stats.fuse_setattr;
  impl_of(req)->setattr(req, ino, attr, to_set);
}
void op_readlink(fuse_req_t req, fuse_ino_t ino) {
  ++impl_of(req)->stats.fuse_other;
  impl_of(req)->readlink(req, ino);
}
void op_mknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t rdev) {
  ++impl_of(req)->stats.fuse_namespace;
  impl_of(req)->mknod(req, parent, name, mode, rdev);
}
void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  ++impl_of(req)->stats.fuse_namespace;
  impl_of(req)->mkdir(req, parent, name, mode);
}
void op_unlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  ++impl_of(req)->stats.fuse_namespace;
  impl_of(req)->unlink(req, parent, name);
}
void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  ++impl_of(req)->stats.fuse_namespace;
  impl_of(req)->rmdir(req, parent, name);
}
void op_symlink(fuse_req_t req, const char* link, fuse_ino_t parent, const char* name) {
  ++impl_of(req)->stats.fuse_namespace;
  impl_of(req)->symlink(req, link, parent, name);
}
void op_rename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t newparent, const char* newname,
               unsigned int flags) {
  ++impl_of(req)->stats.fuse_namespace;
  impl_of(req)->rename(req, parent, name, newparent, newname, flags);
}
void op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char* newname) {
  ++impl_of(req)->stats.fuse_namespace;
  impl_of(req)->link(req, ino, newparent, newname);
}
void op_open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  ++impl_of(req)->stats.fuse_open;
  impl_of(req)->open(req, ino, fi);
}
void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  ++impl_of(req)->stats.fuse_read;
  impl_of(req)->read(req, ino, size, off, fi);
}
void op_write(fuse_req_t req, fuse_ino_t ino, const char* buf, size_t size, off_t off, fuse_file_info* fi) {
  ++impl_of(req)->stats.fuse_write;
  impl_of(req)->write(req, ino, buf, size, off, fi);
}
void op_flush(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  ++impl_of(req)->stats.fuse_flush;
  impl_of(req)->flush(req, ino, fi);
}
void op_release(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  ++impl_of(req)->stats.fuse_release;
  impl_of(req)->release(req, ino, fi);
}
void op_fsync(fuse_req_t req, fuse_ino_t ino, int, fuse_file_info*) {
  ++impl_of(req)->stats.fuse_fsync;
  impl_of(req)->fsync(req, ino);
}
void op_opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  ++impl_of(req)->stats.fuse_other;
  impl_of(req)->opendir(req, ino, fi);
}
void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  ++impl_of(req)->stats.fuse_readdir;
  impl_of(req)->readdir(req, ino, size, off, false);
}
void op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  ++impl_of(req)->stats.fuse_readdir;
  impl_of(req)->readdir(req, ino, size, off, true);
}
void op_releasedir(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  (void)impl_of(req)->table.released(ino);
  freply_err(req, 0);
}
void op_fsyncdir(fuse_req_t req, fuse_ino_t ino, int, fuse_file_info*) {
  ++impl_of(req)->stats.fuse_fsync;
  impl_of(req)->fsync(req, ino);
}
void op_statfs(fuse_req_t req, fuse_ino_t) {
  ++impl_of(req)->stats.fuse_other;
  impl_of(req)->statfs(req);
}
void op_access(fuse_req_t req, fuse_ino_t ino, int mask) {
  ++impl_of(req)->stats.fuse_other;
  impl_of(req)->access(req, ino, mask);
}
void op_create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi) {
  ++impl_of(req)->stats.fuse_create;
  impl_of(req)->create(req, parent, name, mode, fi);
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

FuseClient::FuseClient(MountOptions options) : impl_(std::make_unique<Impl>(options)) {}

FuseClient::~FuseClient() {
  if (impl_->se != nullptr) {
    if (impl_->mounted.load()) fuse_session_unmount(impl_->se);
    fuse_session_destroy(impl_->se);
  }
}

std::string FuseClient::mount(const std::string& mountpoint, const std::string& fuse_options) {
  BFT_ASSERT(impl_->se == nullptr);
  std::string o = "fsname=bftfs,subtype=bftfs,noatime";
  if (impl_->opt.default_permissions) o += ",default_permissions";
  // Other users (and root) may use the mount, as with any network file system; only root may ask for that
  // unless /etc/fuse.conf has user_allow_other.
  if (geteuid() == 0) o += ",allow_other";
  if (!fuse_options.empty()) o += "," + fuse_options;
  std::vector<std::string> argv_s = {"bftfs", "-o", o};
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
  impl_->se = fuse_session_new(&args, &kOps, sizeof(kOps), impl_.get());
  if (impl_->se == nullptr) return "cannot create the FUSE session (bad -o options?)";
  if (fuse_session_mount(impl_->se, mountpoint.c_str()) != 0) {
    fuse_session_destroy(impl_->se);
    impl_->se = nullptr;
    return "cannot mount at " + mountpoint;
  }
  impl_->mountpoint = mountpoint;
  impl_->mounted.store(true);
  return "";
}

std::string ClientCounters::json() const {
  JsonObject j;
  j.add("pid", static_cast<std::uint64_t>(::getpid()))
      .add("fuse_lookup", fuse_lookup.load())
      .add("fuse_getattr", fuse_getattr.load())
      .add("fuse_setattr", fuse_setattr.load())
      .add("fuse_open", fuse_open.load())
      .add("fuse_create", fuse_create.load())
      .add("fuse_read", fuse_read.load())
      .add("fuse_write", fuse_write.load())
      .add("fuse_flush", fuse_flush.load())
      .add("fuse_release", fuse_release.load())
      .add("fuse_fsync", fuse_fsync.load())
      .add("fuse_readdir", fuse_readdir.load())
      .add("fuse_namespace", fuse_namespace.load())
      .add("fuse_other", fuse_other.load())
      .add("requests_read_only", requests_read_only.load())
      .add("requests_ordered", requests_ordered.load())
      .add("lookups_enoent", lookups_enoent.load())
      .add("getattr_cache_hits", getattr_cache_hits.load())
      .add("getattr_cache_misses", getattr_cache_misses.load())
      .add("open_prefetches", open_prefetches.load())
      .add("read_prefetch_hits", read_prefetch_hits.load())
      .add("writes_coalesced", writes_coalesced.load())
      .add("stage_sends_full", stage_sends_full.load())
      .add("stage_sends_timer", stage_sends_timer.load())
      .add("stage_sends_getattr", stage_sends_getattr.load())
      .add("stage_sends_read", stage_sends_read.load())
      .add("stage_sends_close", stage_sends_close.load())
      .add("stage_sends_fsync", stage_sends_fsync.load())
      .add("stage_sends_mutation", stage_sends_mutation.load())
      .add("stage_sends_other", stage_sends_other.load());
  return j.str() + "\n";
}

const ClientCounters& FuseClient::counters() const { return impl_->stats; }

namespace {

// Rewrites `path` with the counters every second until stopped, and once more at the end (RAII).
class StatusWriter {
 public:
  StatusWriter(const std::string& path, const ClientCounters& c) : path_(path), c_(c) {
    if (!path_.empty()) thread_ = std::thread([this] { loop(); });
  }
  ~StatusWriter() {
    if (path_.empty()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    write();
  }
  StatusWriter(const StatusWriter&) = delete;
  StatusWriter& operator=(const StatusWriter&) = delete;

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      lock.unlock();
      write();
      lock.lock();
      cv_.wait_for(lock, std::chrono::seconds(1), [this] { return stop_; });
    }
  }
  void write() {
    if (std::string err = write_file_atomically(path_, c_.json()); !err.empty()) {
      LOG_WARN("", "client: status file: %s", err.c_str());
    }
  }
  const std::string path_;
  const ClientCounters& c_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace

namespace {

// Termination signals: the handler only marks the session as exited and writes one byte to a pipe (both
// async-signal-safe); a thread of serve() reads it and does the rest (FuseClient::Impl::stop()).
int g_stop_pipe_write = -1;
fuse_session* g_stop_session = nullptr;
constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGHUP};
// Sent to the thread running the FUSE loop after a stop: its wait for the workers (sem_wait) returns EINTR
// and it notices the session has exited, also when the termination signal hit another thread.
constexpr int kWakeSignal = SIGUSR2;

void on_stop_signal(int) {
  if (g_stop_session != nullptr) fuse_session_exit(g_stop_session);
  const char c = 1;
  const ssize_t n = ::write(g_stop_pipe_write, &c, 1);
  (void)n;
}

void on_wake_signal(int) {}

}  // namespace

int FuseClient::serve(Backend& backend, std::function<void()> on_detached, std::chrono::milliseconds detach_after) {
  BFT_ASSERT(impl_->se != nullptr);
  BFT_ASSERT(g_stop_session == nullptr);  // one serving client per process
  impl_->backend = &backend;
  StatusWriter status(impl_->opt.status_path, impl_->stats);
  int pipe_fds[2] = {-1, -1};
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return -1;
  impl_->start_stage_flusher();
  ::fcntl(pipe_fds[1], F_SETFL, O_NONBLOCK);
  g_stop_pipe_write = pipe_fds[1];
  g_stop_session = impl_->se;
  // No SA_RESTART: a blocking read of /dev/fuse or the loop's wait must return EINTR.
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  struct sigaction old_stop[std::size(kStopSignals)] = {};
  for (std::size_t i = 0; i < std::size(kStopSignals); ++i) ::sigaction(kStopSignals[i], &sa, &old_stop[i]);
  struct sigaction wake {}, old_wake {}, ign {}, old_pipe {};
  wake.sa_handler = on_wake_signal;
  sigemptyset(&wake.sa_mask);
  ::sigaction(kWakeSignal, &wake, &old_wake);
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  ::sigaction(SIGPIPE, &ign, &old_pipe);

  const pthread_t loop_thread = pthread_self();
  Impl* impl = impl_.get();
  std::thread stopper([impl, loop_thread, rfd = pipe_fds[0]] {
    bool stopped = false;
    for (;;) {
      char c = 0;
      const ssize_t n = ::read(rfd, &c, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0 || c == 0) return;  // serve() is done
      if (stopped) continue;
      stopped = true;
      LOG_INFO("", "mount: termination signal: stopping (writes in flight get %lld s)",
               static_cast<long long>(kStopGrace.count()));
      impl->stop();
      pthread_kill(loop_thread, kWakeSignal);
    }
  });

  std::thread invalidator([impl] { impl->run_invalidations(); });

  // Once the session has ended (unmounted), the rest of serve() may wait for the backend: handlers still
  // waiting (a release waits for its file's writes) and then the writes in flight. If that takes longer than
  // `detach_after`, on_detached() tells the world this daemon no longer matters to a later mount.
  std::mutex detach_mu;
  std::condition_variable detach_cv;
  bool serve_done = false;
  std::thread detacher([&] {
    std::unique_lock<std::mutex> lock(detach_mu);
    std::optional<std::chrono::steady_clock::time_point> ended_at;
    while (!serve_done) {
      detach_cv.wait_for(lock, std::chrono::milliseconds(100));
      if (serve_done) return;
      const auto now = std::chrono::steady_clock::now();
      if (!ended_at && fuse_session_exited(impl->se) != 0) ended_at = now;
      if (ended_at && now - *ended_at >= detach_after) {
        LOG_WARN("", "mount: unmounted, still waiting for the backend (%llu writes in flight); umount need not wait",
                 static_cast<unsigned long long>(impl->table.writes_in_flight()));
        if (on_detached) on_detached();
        return;
      }
    }
  });

  fuse_loop_config* cfg = fuse_loop_cfg_create();
  fuse_loop_cfg_set_max_threads(cfg, impl_->opt.max_threads);
  fuse_loop_cfg_set_idle_threads(cfg, 4);
  int rc = fuse_session_loop_mt(impl_->se, cfg);
  fuse_loop_cfg_destroy(cfg);
  {
    std::lock_guard<std::mutex> lock(impl_->inval_mu);
    impl_->inval_done = true;
  }
  impl_->inval_cv.notify_one();
  invalidator.join();
  // Nothing more will be served: let the mount point go now (a no-op after `bftfs umount`), then let the
  // writes answered but not yet final reach the service. They may wait as long as the backend retries (a hard
  // mount) unless the daemon was told to stop: then for kStopGrace at most.
  // Writes staged but not yet sent go now (the stage flusher is stopped after them: nothing stages any more).
  impl_->kick_all_writes();
  impl_->stop_stage_flusher();
  fuse_session_unmount(impl_->se);
  impl_->mounted.store(false);
  // The kernel is gone and sends no more forgets: files it still referenced after their last unlink go now.
  for (const SillyName& hidden : impl_->table.take_all_silly()) impl_->remove_hidden(hidden);
  if (!impl_->table.wait_all_writes([impl] { return impl->stop_grace_over(); })) {
    LOG_ERROR("", "mount: stopped with %llu writes still in flight (the backend did not answer in %lld s): "
              "their data is lost", static_cast<unsigned long long>(impl_->table.writes_in_flight()),
              static_cast<long long>(kStopGrace.count()));
    rc = -1;
  }
  {
    std::lock_guard<std::mutex> lock(detach_mu);
    serve_done = true;
  }
  detach_cv.notify_all();
  detacher.join();
  const char zero = 0;
  while (::write(pipe_fds[1], &zero, 1) < 0 && errno == EINTR) {
  }
  stopper.join();
  for (std::size_t i = 0; i < std::size(kStopSignals); ++i) ::sigaction(kStopSignals[i], &old_stop[i], nullptr);
  ::sigaction(kWakeSignal, &old_wake, nullptr);
  ::sigaction(SIGPIPE, &old_pipe, nullptr);
  g_stop_session = nullptr;
  g_stop_pipe_write = -1;
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
  return rc == 0 ? 0 : -1;
}

}  // namespace bftfs::client
