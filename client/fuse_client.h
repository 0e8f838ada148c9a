// The FUSE daemon (libfuse3 low-level API, multithreaded): turns kernel requests into file-service requests
// through a Backend and keeps the client cache (client/node_table.h).
//
// Semantics (docs/CLIENT.md has the argument for each):
// - Close-to-open consistency: open() revalidates attributes with a GETATTR and lets the kernel keep its page
//   cache only if mtime and size are what this client last saw; flush/close makes every write final first.
//   Attributes and entries are cached by the kernel for the attr/entry timeouts (like NFS actimeo).
// - Writes are write-behind: write() is answered at once and sent in order; flush, fsync and release wait for
//   them and report their first error. Reads and getattr see this client's own pending writes.
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
  double negative_timeout_s = 0.0;  // no negative entries by default: another client's create shows at once
  bool default_permissions = true;  // false: the kernel asks access()/open() and the service decides alone
  std::uint64_t write_behind_bytes_max = 16u << 20;  // write() blocks while this much is in flight
  unsigned max_threads = 32;
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

  // For the handlers (public so the C trampolines can reach them).
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace bftfs::client
