// Private to the files of the FUSE daemon (client/fuse_*.cc, handlers_*.cc, write_staging.cc, orphans.cc,
// interrupts.cc, backend_calls.cc): the definition of FuseClient::Impl and the helpers its files share. Nothing
// outside client/ includes it; the public face is client/fuse_client.h.
//
// Where each part lives (client/README.md has the reading order):
//   fuse_client.cc     the daemon: mount, serve (the FUSE loop, stop signals, the drain at unmount), status
//   fuse_ops.cc        the table of low-level operations given to libfuse: count the request, run the handler
//   fuse_wire.cc       FUSE types <-> wire types: errno, file types, times, struct stat, the caller's credentials
//   interrupts.cc      how a waiting handler stops waiting: FUSE interrupts, the daemon's stop, an exiting caller
//   backend_calls.cc   one request to the backend and its wait (a hard mount: no timeout), its result's errno
//   handlers_names.cc  lookup, forget, mknod, mkdir, symlink, link, unlink, rmdir, rename
//   handlers_attrs.cc  getattr, setattr, readlink, statfs, access
//   handlers_data.cc   open, create, read (and the open-time prefetch), write, flush, fsync, release
//   handlers_dirs.cc   opendir, readdir(plus), releasedir
//   write_staging.cc   write-behind's glue (the mechanism, without FUSE, is write_behind.h): staging with a
//                      handler's interrupt, kicks, a staged request to the backend and its result to the table
//   direct_io.cc       O_DIRECT: synchronous direct writes that leave no stale cached page of their range
//   orphans.cc         open-unlinked files: hiding them in /.bftfs-orphans and removing them at the last close
//
// The reply rule (libfuse's low-level API; example/passthrough_hp.cc is the model): every handler replies
// exactly once, with an error as a positive errno, on the thread that runs it, and always through the freply_*
// wrappers below (they end the handler's InterruptScope first: a reply frees the request). A handler that
// replies early ends there (`return (void)freply_err(req, E);`). Each handler's declaration below lists its
// valid replies.
#pragma once

#define FUSE_USE_VERSION FUSE_MAKE_VERSION(3, 14)
#include <fuse_lowlevel.h>

#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <ctime>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unistd.h>
#include <unordered_map>
#include <vector>

#include "client/backend.h"
#include "client/fuse_client.h"
#include "client/node_table.h"
#include "client/write_behind.h"
#include "services/fs/fs_codec.h"
#include "services/fs/fs_service.h"

namespace bftfs::client {

using fs::OpCode;

inline constexpr fs::Handle kRootHandle = fs::Handle{false, 0, 1, 1};
inline constexpr std::uint32_t kReadChunkBytes = fs::kIoBytesMax;
// The directory at the root where open-unlinked files wait for their last close (never listed).
inline const std::string kOrphanDir = ".bftfs-orphans";
// The directory at the root that holds each `bftfs run`'s temporary directories (never listed either).
inline const std::string kRunDir = ".bftfs-run";
// The largest write() the kernel sends (conn->max_write) is this many 512 KiB WRITE ops, one request each.
inline constexpr std::size_t kWriteOpsPerRequest = 2;
inline const std::uint64_t kFileBytesMax = fs::FsOptions{}.file_bytes_max;
// How long a daemon told to stop (SIGTERM, SIGINT, SIGHUP) still waits for its writes in flight to become
// final (the backend may be unreachable: a stop must end), and how often a FLUSH checks its caller.
inline constexpr std::chrono::seconds kStopGrace{10};
inline constexpr std::chrono::milliseconds kCallerPoll{200};
// How often an unmount that waits for writes in flight says how many are left and how long they will take.
inline constexpr std::chrono::seconds kDrainReportInterval{2};

// ---- FUSE types <-> wire types (fuse_wire.cc) ----

// One table from the wire's Linux errnos to what FUSE replies: a valid errno passes, anything else is EIO.
int to_host_errno(std::uint32_t wire);
mode_t type_bits(fs::FileType t);
// Wire times (signed 64-bit nanoseconds since the epoch) <-> timespec; out-of-range kernel times are clamped.
timespec wire_to_timespec(std::uint64_t wire);
std::uint64_t timespec_to_wire(const timespec& ts);
struct stat to_stat(const fs::Attr& a);
// The caller's credentials for an op, its groups among `relevant` (the gids of the objects the op names) first.
fs::Cred cred_of(fuse_req_t req, std::initializer_list<std::optional<std::uint32_t>> relevant = {});
// Whether `c` has `want` (r=4, w=2, x=1) on `a` by its mode bits (the service's rule).
bool mode_allows(const fs::Cred& c, const fs::Attr& a, std::uint32_t want);
fs::Op make_op(OpCode code, const fs::Cred& cred);
fs::Request single(fs::Op op);

// An open file (fuse_file_info::fh).
struct OpenFile {
  FuseIno node = 0;
  int flags = 0;
  fs::Cred cred;  // the opener's: I/O on the descriptor was authorized at open (see io_cred)
  // Opened with O_DIRECT and answered FOPEN_DIRECT_IO: the kernel sends every read and write of it straight
  // here, never through its page cache (direct_io.cc).
  bool direct = false;
};

// What one waited-for request gave.
struct CallResult {
  int err = 0;              // 0, or the positive errno to reply
  bool predicate_failed = false;
  fs::Result result;        // when err == 0 or predicate_failed (results of ops 0..stop)
  std::uint64_t seq = 0;    // local submission number (orders attribute updates)
};

// ---- interrupts and replies (interrupts.cc) ----

// Interrupt registration for one FUSE request, RAII: while alive, a FUSE_INTERRUPT for `req` sets the flag and
// wakes every waiter. The destructor unregisters; libfuse runs the callback under the request's lock, so after
// unregistering it can no longer run.
//
// A reply frees the request, so the scope must end before it: every reply goes through the freply_* wrappers
// below, which end the scope active on this thread (handlers reply on the thread that runs them).
class InterruptScope {
 public:
  // `stopping`: the daemon's stop flag (SIGTERM): a stopping daemon ends every wait as if interrupted.
  // `ignore`: FUSE interrupts are not registered at all (the spec session: every request gets its normal answer,
  // so that a task frozen by a checkpoint inside a request freezes just after it, docs/SPECULATION.md §6.1).
  InterruptScope(fuse_req_t req, NodeTable& table, const std::atomic<bool>& stopping, bool ignore = false);
  ~InterruptScope() { end(); }
  // Unregisters (idempotent). After it returns the callback is not running and will not run.
  void end();
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;

  bool interrupted() const { return flag_.load() || stopping_.load(); }
  // Waiters on a call's condition variable register it so the interrupt wakes them too.
  void set_wakeup(std::mutex* mu, std::condition_variable* cv);

 private:
  static void on_interrupt(fuse_req_t, void* data);
  fuse_req_t req_;
  NodeTable& table_;
  const std::atomic<bool>& stopping_;
  std::atomic<bool> flag_{false};
  bool ended_ = false;
  bool registered_ = false;
  std::mutex wake_mu_;
  std::mutex* mu_ = nullptr;
  std::condition_variable* cv_ = nullptr;
};

// The only ways a handler replies (see the reply rule at the top). Each ends this thread's InterruptScope,
// then calls the fuse_reply_* of the same name.
int freply_err(fuse_req_t req, int err);
void freply_none(fuse_req_t req);
int freply_entry(fuse_req_t req, const fuse_entry_param* e);
int freply_create(fuse_req_t req, const fuse_entry_param* e, const fuse_file_info* fi);
int freply_attr(fuse_req_t req, const struct stat* st, double timeout);
int freply_readlink(fuse_req_t req, const char* link);
int freply_open(fuse_req_t req, const fuse_file_info* fi);
int freply_write(fuse_req_t req, size_t count);
int freply_buf(fuse_req_t req, const char* buf, size_t size);
int freply_statfs(fuse_req_t req, const struct statvfs* st);

// Whether thread `tid` is exiting (PF_EXITING): FLUSH from a dying process must answer without waiting.
bool thread_exiting(pid_t tid);

// Locks a shared_timed_mutex (shared or exclusive) unless `scope` is interrupted first; the holder only waits
// for the backend, interruptibly, so a waiter here stays killable.
class NsLock {
 public:
  NsLock(std::shared_timed_mutex& mu, InterruptScope& scope, bool exclusive);
  ~NsLock();
  NsLock(const NsLock&) = delete;
  NsLock& operator=(const NsLock&) = delete;
  bool held() const { return held_; }

 private:
  std::shared_timed_mutex& mu_;
  bool exclusive_;
  bool held_ = false;
};

// A call()'s wait for its final result.
struct Waiter {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Final fin;
};

// The FUSE daemon's state and its handlers. The handlers run on libfuse's worker threads (up to
// MountOptions::max_threads at once); every member below says what guards it.
struct FuseClient::Impl {
  explicit Impl(MountOptions o) : opt(o) {}

  MountOptions opt;
  ClientCounters stats;
  // The spec session of a `bftfs run` (client/spec_session.h) sets these: interrupts never end a wait (every
  // request gets its normal answer), and while the run speculates each write() is a request of its own,
  // answered once its result is known (no write-behind: a write answered before a seal must be in the sealed
  // epoch, docs/SPECULATION.md §6.1).
  bool ignore_interrupts = false;
  std::atomic<bool> synchronous_writes{false};
  // The spec session merges consecutive positional writes of one file into one entry (write_merge.cc): an
  // unpack's writes of 10 KiB were 3.4 entries per file, each rewriting the file's data block and inode on every
  // replica. Guarded by merged_mu; merged_held says, without the lock, whether a write is held.
  struct MergedWrite {
    FuseIno id = 0;
    fs::Handle handle;
    fs::Cred cred;
    std::uint64_t offset = 0;
    std::vector<std::uint8_t> data;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> tickets;  // (ticket, len) of each write() it holds
  };
  bool merge_writes = false;
  std::mutex merged_mu;
  std::optional<MergedWrite> merged;
  std::atomic<bool> merged_held{false};
  void send_merged_locked();
  // While set, replies let the kernel cache no attribute, name or "no such name" (timeouts 0): a speculating spec
  // session, whose cached answers a rollback would otherwise have to find and drop one by one.
  std::atomic<bool> zero_timeouts{false};
  double attr_timeout() const { return zero_timeouts.load() ? 0.0 : opt.attr_timeout_s; }
  double entry_timeout() const { return zero_timeouts.load() ? 0.0 : opt.entry_timeout_s; }
  double negative_timeout() const { return zero_timeouts.load() ? 0.0 : opt.negative_timeout_s; }
  // With track_entries (the spec session), every (parent, name) the kernel may hold a valid dentry for is
  // remembered: names it was allowed to cache (note_entry), and both names of every rename and the name of every
  // removal (note_name: the kernel moves a cached dentry to a rename's target with the time it was cached for).
  // A rollback drops them all (SpecSession::invalidate_entries); dropping them when speculation starts instead
  // would unhash the dentries of files the tree holds open, which CRIU then takes for deleted files.
  bool track_entries = false;
  std::mutex entries_mu;
  std::set<std::pair<FuseIno, std::string>> cached_entries;  // guarded by entries_mu
  void note_entry(FuseIno parent, const std::string& name);
  void note_name(FuseIno parent, const std::string& name);
  NodeTable table{kRootHandle};  // thread-safe itself
  Backend* backend = nullptr;    // set by serve() before the loop starts
  fuse_session* se = nullptr;
  std::string mountpoint;
  std::atomic<bool> mounted{false};

  // ---- the daemon (fuse_client.cc) ----

  // Kernel cache invalidations wanted by backend callbacks. A callback must not write the notification to
  // /dev/fuse itself: the kernel may hold the page locks of a write() whose handler waits for callbacks
  // (write-behind's memory bound), and the invalidation would wait for those locks. One thread sends them.
  std::mutex inval_mu;
  std::condition_variable inval_cv;
  std::vector<FuseIno> inval_queue;
  bool inval_done = false;
  void request_inval(FuseIno id);
  // The invalidation thread's body: drops the pages and attributes of each queued node (a node the kernel
  // forgot meanwhile gives ENOENT: nothing to drop). Returns once inval_done is set and the queue is empty.
  void run_invalidations();
  void end_invalidations();  // sets inval_done and wakes run_invalidations()
  // After the FUSE loop ended: sends staged writes, unmounts, removes hidden files, waits for every write in
  // flight (for kStopGrace at most once stopping). Returns false if writes were still in flight then (lost).
  bool drain();
  // The progress of an unmount's wait for writes in flight, reported every kDrainReportInterval by serve()'s
  // detach thread (fuse_client.cc): start_drain_report when the session ended, then report_drain.
  struct DrainProgress {
    std::uint64_t writes = 0;  // in flight at the last report
    std::uint64_t bytes = 0;
    std::chrono::steady_clock::time_point start, last;
  };
  DrainProgress start_drain_report();
  void report_drain(DrainProgress& p);

  // ---- stopping (interrupts.cc) ----

  // Set by a termination signal (serve()): every wait ends (handlers answer EINTR, un-interruptible waits
  // EIO), the mount goes away, and writes in flight get kStopGrace to become final before the daemon exits.
  std::atomic<bool> stopping{false};
  std::atomic<std::int64_t> stop_deadline_ns{0};  // steady clock
  std::mutex live_mu;
  std::set<std::shared_ptr<Waiter>> live;  // call()s waiting, woken by stop()
  // Ends every wait (see `stopping`). Thread-safe; not async-signal-safe (serve() calls it from a thread).
  void stop();
  bool stop_grace_over() const;

  // ---- calling the backend (backend_calls.cc) ----

  std::atomic<std::uint64_t> next_seq{1};
  // The number of the last ordered request submitted (call() or a staged write).
  std::atomic<std::uint64_t> last_ordered_submit{0};
  // Attributes from requests numbered below the barrier are not answered from the attribute cache.
  std::atomic<std::uint64_t> attr_barrier{0};

  // Submits `r` and waits for its final result, or until `scope` is interrupted (then EINTR; the request may
  // still execute). With a null scope the wait is not interruptible (release, forget: the kernel waits for
  // no answer). No timeout otherwise: the backend retries as long as it takes (a hard mount).
  CallResult call(InterruptScope* scope, const fs::Request& r, bool read_only);
  void note_ordered_submit(std::uint64_t seq);
  void raise_attr_barrier(std::uint64_t to);
  // `op` followed by a GETATTR of each directory in `dirs` (their new attributes come back in the same
  // request; root credentials).
  static fs::Request with_dir_attrs(fs::Op op, std::initializer_list<fs::Handle> dirs);
  // Puts the directory attributes of ops [first, end) of a successful result into the cache.
  void note_dir_attrs(const CallResult& r, std::size_t first);
  // The backend's final answer as a CallResult: the failed op's errno, or EIO for a refused or malformed one.
  static CallResult interpret(Final fin, CallResult out);
  std::optional<fs::Handle> handle_of(FuseIno id) { return table.handle(id); }
  // The group of node `id` as this client last saw it (for cred_of), or nothing if unknown.
  std::optional<std::uint32_t> gid_of(FuseIno id);

  // ---- handlers: names and entries (handlers_names.cc) ----

  // Valid replies: entry (ino 0: a "no such name" the kernel caches for negative_timeout), err.
  void lookup(fuse_req_t req, FuseIno parent, const char* name);
  // No reply of its own (the trampoline replies none): drops `n` kernel references.
  void forget(FuseIno id, std::uint64_t n);
  // Valid replies: entry, err.
  void mknod(fuse_req_t req, FuseIno parent, const char* name, mode_t mode, dev_t rdev);
  // Valid replies: entry, err.
  void mkdir(fuse_req_t req, FuseIno parent, const char* name, mode_t mode);
  // Valid replies: entry, err.
  void symlink(fuse_req_t req, const char* link, FuseIno parent, const char* name);
  // Valid replies: entry, err.
  void link(fuse_req_t req, FuseIno id, FuseIno newparent, const char* newname);
  // Valid replies: err (0 on success).
  void unlink(fuse_req_t req, FuseIno parent, const char* name);
  // Valid replies: err (0 on success).
  void rmdir(fuse_req_t req, FuseIno parent, const char* name);
  // Valid replies: err (0 on success; EINVAL for RENAME_EXCHANGE and unknown flags).
  void rename(fuse_req_t req, FuseIno parent, const char* name, FuseIno newparent, const char* newname,
              unsigned flags);
  // rename's RENAME_NOREPLACE case, `mv` its RENAME op. Valid replies: err (EEXIST if the target exists).
  void rename_noreplace(fuse_req_t req, InterruptScope& scope, const fs::Cred& cred, const fs::Handle& to,
                        const char* newname, fs::Op mv);
  // MKNOD, MKDIR, SYMLINK, LINK and CREATE without open. Valid replies: entry, err.
  void make_entry(fuse_req_t req, fs::Op op);
  // Replies entry for `attr` (one new kernel reference to its node).
  void reply_entry(fuse_req_t req, const fs::Attr& attr, std::uint64_t seq);

  // ---- handlers: attributes (handlers_attrs.cc) ----

  // Valid replies: attr, err.
  void getattr(fuse_req_t req, FuseIno id);
  // Valid replies: attr, err.
  void setattr(fuse_req_t req, FuseIno id, const struct stat* attr, int to_set);
  // Valid replies: readlink, err.
  void readlink(fuse_req_t req, FuseIno id);
  // Valid replies: statfs, err.
  void statfs(fuse_req_t req);
  // The spec session answers statfs from a result younger than this (0: never): CRIU asks for every descriptor
  // of every task at each checkpoint, and the counts are advisory (SpecBackend never logs a STATFS).
  double statfs_cache_s = 0;
  std::mutex statfs_mu;
  std::optional<std::chrono::steady_clock::time_point> statfs_time;  // guarded by statfs_mu
  fs::StatFs statfs_last;                                              // guarded by statfs_mu
  // Valid replies: err (0: granted).
  void access(fuse_req_t req, FuseIno id, int mask);
  // Fills the SETATTR `op` with what `to_set` asks of `attr` (its mask; a GETATTR if nothing the wire sets).
  // Returns 0 or EINVAL.
  static int fill_setattr(const struct stat* attr, int to_set, fs::Op& op);
  // The kernel's clearing of set-uid/set-gid bits after a non-owner's write goes as root (see setattr).
  void kill_priv_as_root(FuseIno id, fs::Op& op);
  // Replies attr with the node's cached attributes (`fallback` if it is gone).
  void reply_attr(fuse_req_t req, FuseIno id, const fs::Attr& fallback);
  // Asks the service whether the caller may `want` on `h` (only without default_permissions). 0 or an errno.
  int check_access(InterruptScope& scope, const fs::Cred& cred, const fs::Handle& h, std::uint8_t want);

  // ---- handlers: open files and their data (handlers_data.cc) ----

  // Valid replies: open, err.
  void open(fuse_req_t req, FuseIno id, fuse_file_info* fi);
  // Valid replies: create, err.
  void create(fuse_req_t req, FuseIno parent, const char* name, mode_t mode, fuse_file_info* fi);
  // Valid replies: buf, err.
  void read(fuse_req_t req, FuseIno id, size_t size, off_t off, fuse_file_info* fi);
  // Valid replies: write (always the whole size: write-behind), err.
  void write(fuse_req_t req, FuseIno id, const char* buf, size_t size, off_t off, fuse_file_info* fi);
  // Sends [off, off + size) of `buf` as WRITEs of at most kIoBytesMax, each final before the next, and puts their
  // attributes in the table. Returns the bytes written; `err` is the errno that stopped it (0: none), `landed`
  // where an append's data went. Shared by direct and synchronous writes (write_sync.cc).
  size_t write_final(InterruptScope& scope, FuseIno id, const fs::Handle& h, const char* buf, size_t size,
                     std::uint64_t off, const OpenFile* of, bool append, std::uint64_t& landed, int& err);
  // write()'s synchronous form (synchronous_writes): each WRITE waits for its result. Valid replies: write, err.
  void write_sync(fuse_req_t req, FuseIno id, const fs::Handle& h, const char* buf, size_t size, std::uint64_t off,
                  const OpenFile* of, bool append);
  // Merged writes (merge_writes, write_merge.cc): a positional write() of the spec session is answered at once
  // and held, joined by the writes that continue it, and sent as one WRITE before anything else this session
  // sends. Valid replies: write.
  void write_merge(fuse_req_t req, FuseIno id, const fs::Handle& h, const char* buf, size_t size,
                   std::uint64_t off, const OpenFile* of);
  // Whether write_merge takes this write (synchronous_writes and merge_writes on, and it fits what it allows).
  bool merges(const fuse_file_info* fi, bool append) const;
  // Sends the held write, if any, and returns once it is final (its errno kept for the file's next flush).
  // Every request handler calls it first (fuse_ops.cc), so the held write precedes whatever comes after it.
  void send_merged();
  // Drops the held write (a rollback: the tree that wrote it is gone, its epoch failed). No error is kept for
  // the file: the restored tree, which writes it again, would be the one to see it.
  void drop_merged();
  // Valid replies: err (0, or the first error of the file's writes since the last report).
  void flush(fuse_req_t req, FuseIno id, fuse_file_info* fi);
  // Valid replies: err (always 0: nobody receives it).
  void release(fuse_req_t req, FuseIno id, fuse_file_info* fi);
  // Also fsyncdir. Valid replies: err (0 on success).
  void fsync(fuse_req_t req, FuseIno id);
  // The credentials for I/O on an open descriptor (the opener's, or root's when the mode no longer admits
  // them: the descriptor is the capability).
  fs::Cred io_cred(const OpenFile* of, FuseIno id, std::uint32_t want);

  // The data a READ at open brought (see open()), kept for the kernel's first reads of the file. Valid
  // while the file's version (mtime, size) is the one read: our own writes and truncates change it.
  struct Prefetch {
    Bytes data;
    bool eof = false;
    DataVersion version;
  };
  static constexpr std::uint32_t kPrefetchBytes = 128u << 10;  // the kernel's usual first read of a file
  std::mutex pf_mu;
  std::unordered_map<FuseIno, Prefetch> prefetched;  // guarded by pf_mu
  bool wants_prefetch(const NodeSnapshot& s, int flags);
  bool serve_prefetched(fuse_req_t req, FuseIno id, std::size_t size, std::uint64_t off);
  void drop_prefetch(FuseIno id);

  // ---- direct I/O (direct_io.cc) ----

  // Whether a WRITE comes from the kernel's direct-I/O path (its sender holds no page lock): every write of
  // a descriptor opened with O_DIRECT, and the direct writes of one switched to O_DIRECT by fcntl.
  static bool is_direct_write(const OpenFile* of, const fuse_file_info* fi);
  // The WRITE of [off, off + size) (`append`: at the service's end of file) as a direct write: final before
  // the reply, with this mount's cached pages of its range dropped after it. Valid replies: write, err.
  void write_direct(fuse_req_t req, FuseIno id, const fs::Handle& h, const char* buf, size_t size,
                    std::uint64_t off, const OpenFile* of, bool append);
  // Before a direct read of a descriptor opened with O_DIRECT: dirty mapped pages of the range are written
  // back (and the range's cached pages dropped), so that the read sees them. Does nothing for other reads.
  void before_direct_read(const OpenFile* of, const fuse_file_info* fi, FuseIno id, size_t size, off_t off);
  // Drops the kernel's cached pages of [off, off + len) of `id` (writing dirty ones back first) and its
  // attributes. Only from a handler whose request's sender holds no page lock (direct_io.cc says why).
  void invalidate_range(FuseIno id, std::uint64_t off, std::uint64_t len);

  // ---- handlers: directories (handlers_dirs.cc) ----

  // Valid replies: open, err.
  void opendir(fuse_req_t req, FuseIno id, fuse_file_info* fi);
  // READDIR and READDIRPLUS. Valid replies: buf (empty for a directory removed while open), err.
  void readdir(fuse_req_t req, FuseIno id, size_t size, off_t off, bool plus);
  // Valid replies: err (always 0).
  void releasedir(fuse_req_t req, FuseIno id);

  // ---- write-behind (client/write_behind.h; the glue in write_staging.cc) ----

  static constexpr std::size_t kCoalesceOpsMax = 32;  // ops per coalesced request (the wire allows 64)
  static constexpr std::chrono::milliseconds kStageDelay{20};
  // Staging, coalescing and the lane of write() data; its requests go out through submit_write.
  WriteBehind wb{WriteBehind::Options{.requests_max = opt.write_behind_requests_max,
                                      .ops_max = kCoalesceOpsMax,
                                      .stage_delay = kStageDelay},
                 table, stats,
                 [this](FuseIno id, const fs::Request& r, std::vector<WriteBehind::Piece> pieces) {
                   submit_write(id, r, std::move(pieces));
                 }};

  // Stages one piece of a write() (an op of at most kIoBytesMax): WriteBehind::stage with this handler's
  // interrupt. Returns false, with nothing staged or counted, if interrupted while it waited for room.
  bool queue_write(FuseIno id, fs::Op op, std::uint64_t kernel_offset, InterruptScope& scope);
  // Submits node `id`'s staged writes now, if any, whatever the lane holds; `reason` counts why.
  void kick_writes(FuseIno id, std::atomic<std::uint64_t>& reason);
  // Kicks the staged writes of every object a request names by handle.
  void kick_writes_of(const fs::Request& r);
  // WriteBehind's submit function: the request goes to the backend (which only queues); its final result is
  // reported to the node table (each piece's write), the kernel's cache (a misplaced append) and the lane.
  void submit_write(FuseIno id, const fs::Request& r, std::vector<WriteBehind::Piece> pieces);

  // ---- open-unlinked files (orphans.cc) ----

  // Hidden files of this mount (silly renames) go to one directory at the root that readdir never lists, so
  // user-visible directories never show them and can be removed while such files are open.
  std::mutex orphans_mu;
  std::optional<fs::Handle> orphans;  // guarded by orphans_mu
  const std::string silly_prefix = std::to_string(::getpid()) + "-" + std::to_string(::time(nullptr)) + "-";
  // Opens take it shared and name removals exclusive, so "is this file open here?" and the removal are
  // atomic with respect to this mount's opens (an open either registers first and the remover hides the
  // file, or starts after the removal and finds no file).
  std::shared_timed_mutex ns_mu;

  // The node of (dir, name) if removing that name must hide the file instead (see orphans.cc); `err` is
  // EINTR if interrupted, else 0.
  std::optional<FuseIno> open_last_link(InterruptScope& scope, const fs::Cred& cred, const fs::Handle& dir,
                                       const std::string& name, int& err);
  // The orphan directory's handle, made (mode 01777, root's) the first time. Returns 0 or an errno.
  int orphan_dir(InterruptScope& scope, bool refresh, fs::Handle& out);
  bool is_orphan_dir(const fs::Handle& h);
  // Moves (dir, name) of open node `id` to a hidden name in the orphan directory, then runs `then` (the same
  // request: all or nothing). Returns 0 or an errno.
  int hide(InterruptScope& scope, const fs::Cred& cred, FuseIno id, const fs::Handle& dir, const std::string& name,
           std::vector<fs::Op>* then);
  // Removes a hidden name and waits for it (not interruptible: release, unmount).
  void remove_hidden(const SillyName& s);
  // remove_hidden without waiting (forget has no reply and must not hold a handler thread for a round trip).
  void remove_hidden_async(const SillyName& s);
};

// The low-level operations given to fuse_session_new (fuse_ops.cc).
const fuse_lowlevel_ops& fuse_operations();

}  // namespace bftfs::client
