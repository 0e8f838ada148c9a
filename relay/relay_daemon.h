// The relay daemon (`bftfs relay`, docs/RELAY.md): a Unix-socket server for FUSE mounts in front of one PBFT-CS
// client identity. Each mount connection speaks the relay_wire protocol; every SUBMIT becomes one operation of
// the client library (relay/spec_client_runtime.h) for replicas that run the file service behind the shim,
// or, in NO-REP mode, one request to the unreplicated server (runtime/client_runtime.h DirectClient).
//
// What it guarantees a mount:
//   - every SUBMIT gets exactly one FINAL unless the mount cancels it or disconnects; FIRST (when asked for)
//     precedes it; results are checked with fs::decode_result before they are forwarded;
//   - requests are never given up on: the client library retransmits to replicas forever (an NFS hard mount);
//   - a mount's bytes cannot hurt the relay: every frame is validated (relay/relay_wire.h), a protocol
//     violation closes that connection only, a malformed fs request is refused with a reason;
//   - a dependency is honoured whatever the state of the request it names (in flight: a predicate for the
//     replicas; final: judged by the FINAL sent, and a request relying on a wrong FIRST is answered "not
//     executed" at once), and a dependency on a tag the relay does not know is refused with a reason;
//   - a slow mount cannot block the relay: its output buffer is bounded (a mount that does not read is
//     disconnected), and a mount with too many requests in flight is not read until some complete.
//
// Threading: single-threaded on its own event_base; stop() is thread- and async-signal-safe.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/config.h"
#include "runtime/wan.h"

namespace bftfs {

struct RelayOptions {
  std::string config_path;
  NodeId id = 0;                     // the relay's client id in the configuration
  std::string socket_path;           // the Unix socket mounts connect to (a stale one is replaced)
  mode_t socket_mode = 0660;
  bool norep = false;                // talk to the NO-REP server instead of PBFT replicas
  ReplicaAddress norep_server;       // NO-REP: empty host = replica 0's configured address
  bool speculate = true;             // let the client library deliver first replies (FIRST frames)
  // The 1% rule (PBFT-CS §3.4): a replica's first replies are not delivered while more than
  // distrust_above_permille of its last distrust_window ones differed from the consensus (window 0: always
  // trust the primary, as the paper's fault experiment did, §6.2).
  std::uint32_t distrust_above_permille = 10;
  std::uint32_t distrust_window = 100;
  std::uint32_t window = 64;         // requests the PBFT client keeps on the wire (<= replicas' client window)
  std::size_t connections_max = 256;
  std::size_t conn_in_flight_max = 1024;                  // past this a mount is not read until some complete
  // FINALs per connection whose status the relay remembers, to judge a SUBMIT that depends on a request
  // already final (docs/RELAY.md, "Dependencies"; about 80 bytes each). As many as a mount may have in flight:
  // a mount that depends on a request more FINALs back than that has long been sent its FINAL.
  std::size_t conn_finals_remembered = 1024;
  // The client library's queue for all mounts together (cancelled requests stay in it until they execute):
  // past either bound no mount is read until some complete.
  std::size_t in_flight_max = 4096;
  std::size_t in_flight_bytes_max = 256u * 1024 * 1024;
  std::size_t conn_output_bytes_max = 64u * 1024 * 1024;  // unread bytes past which a mount is disconnected
  std::string status_path;           // status.json-style file rewritten every status_interval_ms ("" = none)
  std::uint32_t status_interval_ms = 500;
  WanSpec wan;
  bool handle_signals = false;       // SIGTERM/SIGINT stop the loop
};

class RelayDaemon {
 public:
  // Loads the identity, connects to the replicas (in the background) and binds the socket. Returns "" or an
  // error (nothing is left listening on an error).
  [[nodiscard]] static std::string create(const RelayOptions& options, std::unique_ptr<RelayDaemon>& out);
  ~RelayDaemon();  // closes every connection and removes the socket file
  RelayDaemon(const RelayDaemon&) = delete;
  RelayDaemon& operator=(const RelayDaemon&) = delete;

  void run();   // until stop() or a signal
  void stop();  // thread-safe, async-signal-safe
  // The STATUS_REPLY text: one `key value` line per fact. Loop thread only.
  std::string status_text() const;

 private:
  struct Impl;
  explicit RelayDaemon(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace bftfs
