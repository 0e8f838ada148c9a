// The client's view of the file service: submit a compound request, learn its first (speculative) and final
// (consensus) result asynchronously. Two implementations: LocalBackend runs FsService in this process (the
// "FUSE passthrough of our own client" baseline and the backend of the fast tests); RelayBackend talks to a
// `bftfs relay` over its Unix socket (docs/RELAY.md).
//
// Why asynchronous with two callbacks although this client only waits for the final result: the
// speculation layer that follows acts on the first reply and later confirms or rolls back on the final one
// (../shared/notes/speculation-constraints.md); requests may also carry dependencies on earlier tags. The
// interface already has both, so that layer is an addition, not a rewrite.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "services/fs/fs_codec.h"

namespace bftfs::client {

// How a request ended.
enum class FinalStatus : std::uint8_t {
  kCommitted = 0,   // result = the consensus result
  kRolledBack = 1,  // result = the consensus result, which differs from the first reply reported
  kRefused = 2,     // never executed: the backend refused it (reason says why); maps to EIO
};

struct Final {
  FinalStatus status = FinalStatus::kCommitted;
  fs::Result result;   // kCommitted, kRolledBack
  std::string reason;  // kRefused
};

struct SubmitOptions {
  bool read_only = false;    // every op is read-only and the caller accepts the read-only optimization
  bool want_first = false;   // report the first (speculative) reply through on_first
  std::vector<std::uint64_t> deps;  // speculation: tags whose first replies this request relies on (empty now)
};

struct Callbacks {
  std::function<void(const fs::Result&)> on_first;  // optional; at most once, before on_final
  std::function<void(Final)> on_final;              // exactly once unless the request is cancelled
};

class Backend {
 public:
  virtual ~Backend() = default;
  // Submits `request` (a request fs::decode_request accepts). Requests execute in submission order (read-only
  // ones may run against any state at least as new as the last final result delivered). Returns the tag;
  // callbacks run on a backend thread and must not block on another request of this backend.
  virtual std::uint64_t submit(const fs::Request& request, const SubmitOptions& options, Callbacks callbacks) = 0;
  // The caller stopped waiting for `tag` (interrupted). The request may still execute; no callback follows.
  virtual void cancel(std::uint64_t tag) = 0;
  // One line per fact, for logs and `bftfs status`.
  virtual std::string describe() const = 0;
};

}  // namespace bftfs::client
