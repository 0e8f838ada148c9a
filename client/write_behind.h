// Write-behind (docs/CLIENT.md "Writes: write-behind"): the data of write() is answered at once, staged here per
// file, and sent as one compound request that the service executes in order, all or nothing (docs/FILESERVICE.md
// §1). Independent of FUSE and of the backend, so that it is unit-tested (tests/unit/test_client_write_behind.cc);
// the daemon's glue is client/write_staging.cc.
//
// Coalescing. A writer of many small pieces (as, ar and ld write an object file in dozens of small writes; a
// logger appends records of a few bytes; a mapping's write-back sends scattered pages) costs one ordered request
// per file and round instead of one per write(), and few ops in it:
//   - consecutive appends with the same credentials become one append op: the service places the op's bytes at
//     the end it sees when the request executes, so each piece still lands whole, at the end, after everything
//     this mount staged or sent before it, in staging order (the order write() was answered). No other append
//     can come between two pieces of one op, which is one of the orders O_APPEND allows (each write atomic at
//     the end of file);
//   - a positional write joins an earlier op of the request that it overlaps or touches (its bytes win), when
//     that op has its credentials, no op between them overlaps it, and no append lies between them (an append's
//     place depends on the size the writes before it leave): moving it earlier is then invisible, because the
//     request executes as a whole and only overlapping writes' order matters;
//   - otherwise it becomes a further op of the same request (at most ops_max).
//
// The lane. At most requests_max staged requests are in flight (submitted, not final) at once: every other
// request of the mount (a stat, a lookup, a read) then waits at the service behind at most that many writes, and
// the replicas are never handed a backlog that takes them minutes to order. A staged request leaves
//   - when anything needs it at the service (kick: flush at close, fsync, release, a read or getattr of the file,
//     a truncate, another mutation naming the file; kick_all: unmount), at once, whatever the lane holds (the
//     caller waits for it, so these are bounded by the callers waiting);
//   - once it is stage_delay old (the flusher; so a file that stays open reaches the service anyway, as NFS's
//     periodic write-back) or full, when the lane has room. While the lane is full it keeps growing, so a heavy
//     writer's pieces coalesce more the busier the service is.
// A piece that does not fit its file's staged request while the lane is full waits for room (interruptibly):
// backpressure on the writing process alone, not on every process of the mount.
//
// Every piece counts among the node table's writes in flight (NodeTable::write_submitted, with a ticket) from
// stage() until its request is final, so waiters (flush, fsync, read, getattr) kick the staged pieces out and
// then wait for them as for any write in flight.
//
// Thread safety: every member takes the one mutex. The submit function runs with it held (so requests leave in
// the order they are taken from staging) and must only queue; the owner calls finished() when a submitted request
// is final, from any thread that holds no lock of its own that a stage() caller might wait for.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "client/fuse_client.h"
#include "client/node_table.h"
#include "services/fs/fs_codec.h"

namespace bftfs::client {

class WriteBehind {
 public:
  struct Options {
    std::uint32_t requests_max = 8;  // the lane (MountOptions::write_behind_requests_max)
    std::size_t ops_max = 32;        // ops per staged request (the wire allows 64)
    std::chrono::milliseconds stage_delay{20};
  };

  // One write() piece staged: where it goes and which op of the staged request carries it.
  struct Piece {
    std::uint64_t offset = 0;  // positional writes; 0 for appends
    std::uint64_t len = 0;
    bool append = false;
    std::uint64_t kernel_offset = 0;  // where the kernel's page cache put the bytes
    std::size_t op_index = 0;         // the op of the compound request that carries them
    std::uint64_t op_pos = 0;         // an append's place in its op's data (consecutive appends share an op)
    std::uint64_t ticket = 0;         // its write in the node table
  };

  // Sends a staged request of node `id` carrying `pieces`. Runs with the lock held: it must only queue.
  using SubmitFn = std::function<void(FuseIno id, const fs::Request& request, std::vector<Piece> pieces)>;

  WriteBehind(Options options, NodeTable& table, ClientCounters& counters, SubmitFn submit);
  ~WriteBehind();  // stops the flusher if it runs
  WriteBehind(const WriteBehind&) = delete;
  WriteBehind& operator=(const WriteBehind&) = delete;

  // Stages `op` (a WRITE of at most kIoBytesMax; `append` with offset 0, or positional) of node `id`, which the
  // node table knows, and counts it there. Waits while it does not fit the file's staged request and the lane is
  // full, until room or `interrupted()` (checked at every wake_waiters() and finished()); returns false, with
  // nothing staged or counted, if interrupted first.
  [[nodiscard]] bool stage(FuseIno id, fs::Op op, std::uint64_t kernel_offset,
                           const std::function<bool()>& interrupted);
  // Submits node `id`'s staged request now, if any, whatever the lane holds; `reason` counts it.
  void kick(FuseIno id, std::atomic<std::uint64_t>& reason);
  // Submits every staged request now, whatever the lane holds (unmount).
  void kick_all();
  // The mount's write-behind memory bound was reached: staged requests go as the lane takes them, young ones
  // too, oldest first.
  void send_for_memory();
  bool any_staged() const;
  // A submitted request became final (after the owner reported its pieces to the node table).
  void finished();
  // Wakes stage() calls waiting for room, so that they look at their interrupted() again.
  void wake_waiters();
  // What a waiter's interrupt must lock and notify (InterruptScope::set_wakeup).
  std::mutex& mutex() { return mu_; }
  std::condition_variable& room_cv() { return room_cv_; }
  std::uint64_t in_flight() const;  // submitted, not final

  // The flusher thread (stage_delay): started by the daemon's serve(), stopped before unmount's kick_all.
  void start_flusher();
  void stop_flusher();

  // ---- the rules, pure (exposed for the tests) ----
  // The op of `request` that `op` may join (see "Coalescing"), or nothing.
  static std::optional<std::size_t> join_target(const fs::Request& request, const fs::Op& op);
  // Whether an executed request's appends landed elsewhere than the kernel put them (another client appended
  // meanwhile): `result` is the request's result (results by op), `pieces` what it carried.
  static bool appends_misplaced(const std::vector<Piece>& pieces, const fs::Result& result);

 private:
  struct Staged {
    fs::Request request;
    std::vector<Piece> pieces;
    std::size_t bytes = 0;  // of the pieces (an upper bound of the request's data)
    std::chrono::steady_clock::time_point since;  // when the first piece was staged
  };
  bool fits(const Staged& st, const fs::Op& op) const;
  bool room_locked() const { return in_flight_ < options_.requests_max; }
  void add_locked(FuseIno id, fs::Op op, std::uint64_t kernel_offset);
  void submit_locked(std::map<FuseIno, Staged>::iterator it, std::atomic<std::uint64_t>& reason);
  // Sends staged requests, oldest first, while the lane has room: those due (stage_delay old, or full), or all
  // with `all`. Returns when the oldest request left staged was staged, if any.
  std::optional<std::chrono::steady_clock::time_point> send_locked(bool all, std::atomic<std::uint64_t>& reason);
  void run_flusher();

  const Options options_;
  NodeTable& table_;
  ClientCounters& counters_;
  const SubmitFn submit_;
  mutable std::mutex mu_;
  std::condition_variable flusher_cv_;  // a new stage, a completion, stopping
  std::condition_variable room_cv_;     // stage() calls waiting for room
  std::map<FuseIno, Staged> staged_;    // by node; ordered so that kick_all goes in a fixed order
  std::uint64_t in_flight_ = 0;
  bool flusher_stopping_ = false;
  std::thread flusher_;
};

}  // namespace bftfs::client
