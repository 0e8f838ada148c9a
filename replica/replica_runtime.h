// ReplicaRuntime: runs the pure PBFT replica core (protocol/replica.h) for real. It owns the event loop, the
// transport, the write-ahead log, the service and its snapshot store, and the core, and drains the core's
// Effects with group commit:
//
//   every callback of one loop pass (readable sockets, the tick timer) feeds the core and appends the Effects
//   it returns to one pending list; the loop runs one pass at a time (event_base_loop with EVLOOP_ONCE) and
//   flushes after each. The flush appends every pending record to the log and, when one of them backs a
//   promise, hands everything appended as one group to the sync thread (one group in flight; the next one
//   starts when it completes, with whatever was appended meanwhile). The loop does not wait for it: each
//   send leaves once the records it depends on are durable (protocol/effects.h, send_waits_for_log: promises
//   wait for every must-sync record appended before them, in order; messages that promise nothing wait only
//   for an unsynced ViewRecord), and is held until then. Sends of one flush, or of one completed group, to
//   the same connection leave in one system call (Transport::cork).
//
// A group is written only when a record backs a promise (records are otherwise durable with the next such
// group, or within status_interval_ms): the core only relies on a record once a message that promises it is
// out. Without fsync (measurements only) the write is done on the loop.
//
// Status: <data>/status.json every status_interval_ms (see status_file.h), and snapshot() for tests.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "common/config.h"
#include "protocol/replica.h"
#include "runtime/event_raii.h"
#include "runtime/transport.h"
#include "storage/wal.h"

namespace bftfs {

struct ReplicaRuntimeOptions {
  std::string config_path;      // cluster.conf; the secret key is secret_path_for(config_path, id)
  NodeId id = 0;
  std::string data_dir;         // holds wal/, snapshots/ and status.json; created if missing
  std::string service = "counter";
  bool shim = false;            // run the service behind the PBFT-CS shim (predicated requests)
  // Fault injection for the PBFT-CS experiments (NSDI'09 §6.3): as primary, corrupt this many of every million
  // early (speculative) replies. Never set outside benchmarks and tests.
  std::uint32_t corrupt_early_replies_ppm = 0;
  ReplicaOptions core;          // n and f are overwritten from the configuration
  WalOptions wal;
  TransportOptions transport;    // transport.wan on: the event base gets precise timers (make_event_base)
  std::uint32_t tick_ms = 1;
  std::uint32_t status_interval_ms = 500;
  bool check_invariants = false;  // after every core call (tests; costs CPU)
  bool handle_signals = false;    // SIGTERM/SIGINT stop the loop (daemons; one per process)
};

// A consistent-enough copy of the core's state for other threads (updated by the loop every tick).
struct ReplicaSnapshot {
  std::uint64_t view = 0;
  std::uint64_t last_executed = 0;
  std::uint64_t last_committed = 0;
  std::uint64_t stable_checkpoint = 0;
  bool in_view_change = false;
  bool running = false;
  std::uint64_t state_transfers = 0;       // ReplicaStats, for tests and benchmarks
  std::uint64_t state_transfer_bytes = 0;
  std::uint64_t service_damaged = 0;
};

class ReplicaRuntime {
 public:
  // Loads configuration and keys, opens the data directory, replays the log into the core (Replica::recover),
  // binds the listening socket and starts connecting to the other replicas. Returns "" or an error.
  [[nodiscard]] static std::string create(const ReplicaRuntimeOptions& options, std::unique_ptr<ReplicaRuntime>& out);
  ~ReplicaRuntime();
  ReplicaRuntime(const ReplicaRuntime&) = delete;
  ReplicaRuntime& operator=(const ReplicaRuntime&) = delete;

  // Runs the loop until stop() (or a signal, with handle_signals). Flushes, syncs the log and writes a final
  // status file with running=false before returning.
  void run();
  // Thread-safe and async-signal-safe.
  void stop();

  ReplicaSnapshot snapshot() const;  // thread-safe

 private:
  struct Impl;
  explicit ReplicaRuntime(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace bftfs
