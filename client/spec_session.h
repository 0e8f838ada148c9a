// A `bftfs run`'s spec session (docs/SPECULATION.md §6.1): the second FUSE connection that the supervisor mounted
// over the mount point in the run's mount namespace and handed to this daemon (ATTACH). It is served by the same
// handler code as the mount's own connection (FuseClient::Impl) with its own node table and kernel caches, over
// the run's SpecBackend, with these differences:
// - interrupts never end a wait: every request gets its normal answer, so a task frozen by a checkpoint inside a
//   request freezes just after it, and a program never sees a spurious EINTR (issue item 5);
// - while the run speculates, write() is synchronous: each is an entry before it is answered, except that
//   consecutive positional writes of a file are merged into one entry, sent before anything else
//   (client/write_merge.cc);
// - the kernel caches attributes, names and "no such name" for the mount's own timeouts, speculating or not;
//   the session remembers every name it let the kernel cache, and a rollback expires them all and drops every
//   node's attributes and pages (invalidate_all). During a restore window the timeouts are 0.
#pragma once

#include <pthread.h>

#include <memory>
#include <string>
#include <thread>

#include "client/backend.h"
#include "client/fuse_client.h"
#include "os/unique_fd.h"

struct fuse_session;

namespace bftfs::client {

class SpecSession {
 public:
  // Serves `fuse` (a /dev/fuse descriptor already mounted) with `backend`, on threads of its own, until the kernel
  // ends the connection (the run's mount namespace is gone) or the session is destroyed. `base` gives the mount's
  // options (permissions, thread count); the cache timeouts are the spec session's own. Returns "" or the reason.
  [[nodiscard]] static std::string start(UniqueFd fuse, const MountOptions& base, Backend& backend,
                                         std::unique_ptr<SpecSession>& out);
  // Ends the loop (the backend must have been closed first, so that no handler waits) and closes the descriptor,
  // which aborts the connection if the supervisor still has it mounted.
  ~SpecSession();
  SpecSession(const SpecSession&) = delete;
  SpecSession& operator=(const SpecSession&) = delete;

  // Writes become synchronous (speculating) or go through write-behind (not speculating).
  void set_synchronous_writes(bool on);
  // Whether replies let the kernel cache attributes and names (not during a restore window: timeouts 0).
  void set_zero_timeouts(bool on);
  // Drops every name the kernel may hold a valid dentry for (a rollback): afterwards each of the tree's lookups
  // reaches this session. Only while no task of the tree runs (it unhashes the dentries of open files).
  void invalidate_entries();
  // Sends the held merged write (client/write_merge.cc) and every staged write now, and waits until no
  // write-behind request is in flight.
  void flush_writes();
  // Drops the held merged write (its writer is dead: a rollback) and sends every staged write, without waiting.
  void kick_writes();
  // Drops the kernel's attributes and cached pages of every node this session ever named, and what the handlers
  // kept of them (data versions, open-time prefetches). Only while no task of the tree runs (ROLLBACK, RESTORED):
  // an invalidation waits for page locks that a running writer may hold.
  void invalidate_all();
  // True once the kernel ended the connection.
  bool ended() const;

 private:
  SpecSession();
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace bftfs::client
