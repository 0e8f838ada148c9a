// The NO-REP baseline: one server, the same transport, framing, authentication and service as a replica, and
// no agreement. Every authenticated Request is executed at once (read-only ones with execute_read_only when
// the service allows it) and answered with the full result (kReplyHasResult). A per-client table of the last
// request id and its reply gives at-most-once execution under client retransmission.
//
// The service is the replicas' (runtime/service_factory.h, without the shim: the relay sends NO-REP plain
// requests); the file service keeps its state on the same disk store as a replica's (<data>/fs,
// storage/disk_object_store.h) and takes a durable checkpoint every 128 executed requests, as a replica does
// every K = 128 sequence numbers. So NO-REP and PBFT pay for the same store.
//
// Durability: without `durable` there is no log: a restart recovers the file service's last checkpoint (the
// counter and null services lose everything). With `durable`, every executed request is appended to the same
// group-committed write-ahead log as the replicas use (a PrePrepareRecord holding a one-request batch) and its
// reply is sent only after the pass's single fdatasync: the promise of a PBFT reply (the request is in a
// durable log, and the state is recovered from the last checkpoint plus the log), which is the fair
// comparison point for PBFT. On restart the log is re-executed from the service's recovered checkpoint; a
// StableRecord after each checkpoint lets the log compact.
#pragma once

#include <memory>
#include <string>

#include "common/config.h"
#include "runtime/transport.h"
#include "storage/wal.h"

namespace bftfs {

struct NorepOptions {
  std::string config_path;
  std::string data_dir;           // status.json, and wal/ when durable
  std::string service = "counter";
  ReplicaAddress listen;          // empty host: replica 0's configured address
  bool durable = false;
  WalOptions wal;
  TransportOptions transport;     // transport.wan: the server is at node 0's site (it authenticates as 0)
  std::uint32_t status_interval_ms = 500;
  bool handle_signals = false;
};

class NorepServer {
 public:
  // The server authenticates as replica 0 of the configuration (clients address it as replica 0).
  [[nodiscard]] static std::string create(const NorepOptions& options, std::unique_ptr<NorepServer>& out);
  ~NorepServer();
  NorepServer(const NorepServer&) = delete;
  NorepServer& operator=(const NorepServer&) = delete;

  void run();   // until stop() or a signal
  void stop();  // thread-safe, async-signal-safe
  std::uint64_t executed() const;  // thread-safe

 private:
  struct Impl;
  explicit NorepServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace bftfs
