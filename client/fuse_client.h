// The FUSE daemon (libfuse3 low-level API, multithreaded): turns kernel requests into file-service requests
// through a Backend and keeps the table of the nodes the kernel holds (client/node_table.h). Its
// implementation is spread over files of one concern each; client/fuse_client_impl.h maps them.
//
// Semantics (docs/CLIENT.md has the argument for each):
// - Close-to-open consistency: open() revalidates attributes with a GETATTR and lets the kernel keep its page
//   cache only if mtime and size are what this client last saw; flush/close makes every write final first.
//   Attributes and entries are cached by the kernel for the attr/entry timeouts (like NFS actimeo).
// - Writes are write-behind: write() is answered at once and sent in order; flush, fsync and release wait for
//   them and report their first error. Reads and getattr wait for this client's writes in flight.
// - No FUSE writeback cache: with it the kernel would own i_size and mtime and flush dirty pages whenever it
//   likes, so another client's change could be overwritten by stale pages and close would not mean durable.
// - Permissions: the kernel checks them with the cached attributes (default_permissions), and every op also
//   carries the caller's credentials so the service checks them again.
// - Open-unlinked files: unlink or rename over a file this client has open renames it to a hidden name,
//   removed at its last close (as NFS clients do).
// - Every handler replies exactly once. A handler that waits for the backend answers EINTR if the kernel
//   interrupts it (the request may still execute, as an NFS "intr" mount); otherwise it waits as long as the
//   backend retries (a hard mount).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "client/backend.h"
#include "client/node_table.h"

struct fuse_session;

namespace bftfs::client {

struct MountOptions {
  double attr_timeout_s = 1.0;
  double entry_timeout_s = 1.0;
  double negative_timeout_s = 1.0;  // "no such name" is cached as long as names are (docs/CLIENT.md)
  bool default_permissions = true;  // false: the kernel asks access()/open() and the service decides alone
  std::uint64_t write_behind_bytes_max = 16u << 20;  // write() blocks while this much is in flight
  // Write-behind requests in flight at once (docs/CLIENT.md "The write-behind lane"): every other request of
  // the mount waits behind at most this many writes at the service; a writer whose staged request is full
  // waits while the lane is. 8 requests of at most 512 KiB keep a large write() stream at the cluster's
  // throughput (`make bench-large-write`) while a stat waits behind at most 4 MiB.
  std::uint32_t write_behind_requests_max = 8;
  unsigned max_threads = 32;
  // If set, the daemon writes its counters (ClientCounters) there as JSON every second and at exit.
  std::string status_path;
};

// What the mount did, for `--status FILE` and benchmarks (requests per file operation). Thread-safe: every
// counter is an atomic that handlers bump.
struct ClientCounters {
  // FUSE requests received, by kind.
  std::atomic<std::uint64_t> fuse_lookup{0}, fuse_getattr{0}, fuse_setattr{0}, fuse_open{0}, fuse_create{0},
      fuse_read{0}, fuse_write{0}, fuse_flush{0}, fuse_release{0}, fuse_fsync{0}, fuse_readdir{0},
      fuse_namespace{0};  // namespace: mkdir, mknod, symlink, link, unlink, rmdir, rename
  std::atomic<std::uint64_t> fuse_other{0};  // readlink, opendir, statfs, access, forget
  // Requests sent to the backend.
  std::atomic<std::uint64_t> requests_read_only{0}, requests_ordered{0};
  // Answers from the client's own cache instead of a request (docs/CLIENT.md "Caching").
  std::atomic<std::uint64_t> lookups_enoent{0};      // LOOKUPs the service answered ENOENT
  std::atomic<std::uint64_t> getattr_cache_hits{0};  // getattr answered from attributes fresher than attr_timeout
  std::atomic<std::uint64_t> getattr_cache_misses{0};
  std::atomic<std::uint64_t> open_prefetches{0};     // opens revalidated by a READ that also brought data
  std::atomic<std::uint64_t> read_prefetch_hits{0};  // reads answered from an open's prefetched data
  std::atomic<std::uint64_t> writes_coalesced{0};    // write() pieces sent in a request with an earlier one
  std::atomic<std::uint64_t> ops_joined{0};          // of those, pieces that joined an earlier op (no op of their own)
  std::atomic<std::uint64_t> write_behind_waits{0};  // write() calls that waited for room in the lane
  // Why staged writes were sent (docs/CLIENT.md "Coalescing").
  std::atomic<std::uint64_t> stage_sends_full{0}, stage_sends_timer{0}, stage_sends_getattr{0},
      stage_sends_read{0}, stage_sends_close{0}, stage_sends_fsync{0}, stage_sends_mutation{0},
      stage_sends_other{0};
  // Direct I/O (docs/CLIENT.md "Direct I/O"): writes taken synchronously, reads of O_DIRECT descriptors
  // that wrote mapped pages back first, and the page-cache invalidations both asked the kernel for.
  std::atomic<std::uint64_t> direct_writes{0}, direct_reads{0}, direct_invalidations{0};
  std::string json() const;
};

class FuseClient {
 public:
  FuseClient(MountOptions options);
  ~FuseClient();
  FuseClient(const FuseClient&) = delete;
  FuseClient& operator=(const FuseClient&) = delete;

  // Creates the session and mounts it at `mountpoint` with the extra -o options `fuse_options` (comma list,
  // may be empty). Returns "" or the reason.
  [[nodiscard]] std::string mount(const std::string& mountpoint, const std::string& fuse_options);
  // Serves requests until unmounted or a termination signal; the backend must be attached. Returns 0 or -1.
  // Then unmounts if still mounted and waits for every pending write (after a termination signal, for 10 s
  // at most). If they are not all final `detach_after` after the unmount (the backend is unreachable), calls
  // `on_detached` once (if given) and keeps waiting: `bftfs umount` need not wait for a backend that is down.
  int serve(Backend& backend, std::function<void()> on_detached = nullptr,
            std::chrono::milliseconds detach_after = std::chrono::milliseconds(2000));
  const ClientCounters& counters() const;

  // For the handlers (public so the C trampolines can reach them).
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace bftfs::client
