// RelayBackend: the file service through a `bftfs relay` on a Unix socket (docs/RELAY.md, codec
// relay/relay_wire.h). One I/O thread owns the socket; submit() and cancel() only queue and wake it, so a FUSE
// handler never blocks on the socket (a stopped relay cannot wedge a handler beyond an interrupt).
//
// Hard-mount behaviour: while the relay is unreachable the thread reconnects with exponential backoff (50 ms
// up to 2 s) forever; after each (re)connection it resubmits, in tag order, every request that has no FINAL
// yet. A resubmitted mutation may execute twice (the relay's duplicate detection lasts one relay life, like an
// NFS server's duplicate request cache lasts one boot): docs/CLIENT.md says what the client then sees.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "client/backend.h"
#include "os/unique_fd.h"

namespace bftfs::relay {
class FrameSplitter;
}  // namespace bftfs::relay

namespace bftfs::client {

class RelayBackend final : public Backend {
 public:
  explicit RelayBackend(std::string socket_path);
  ~RelayBackend() override;  // stops the I/O thread; requests without FINAL get no callback
  RelayBackend(const RelayBackend&) = delete;
  RelayBackend& operator=(const RelayBackend&) = delete;

  std::uint64_t submit(const fs::Request& request, const SubmitOptions& options, Callbacks callbacks) override;
  void cancel(std::uint64_t tag) override;
  std::string describe() const override;

  // True once a HELLO_OK was received on the current connection (tests, status).
  bool connected() const;
  // The relay's PBFT client id (HELLO_OK), 0 before the first connection: the identity the replicas execute
  // this mount's requests under (a `bftfs run`'s stream belongs to it).
  std::uint32_t client_id() const;

 private:
  struct InFlight {
    Bytes request;
    std::uint8_t flags = 0;
    std::vector<std::uint64_t> deps;
    Callbacks callbacks;
  };
  void run();
  void wake();
  void drain_wake();  // empties the wake pipe (its bytes only say "look again")
  // One connection's life: returns when it breaks or the backend stops.
  void serve_connection(int fd);
  // Appends to `out` the cancellations and submissions made since the last call, once the connection is
  // `ready` (HELLO_OK seen). Returns false if the backend is stopping.
  bool take_outgoing(bool ready, Bytes& out);
  // Sends what it can of out[out_pos..] (the socket is non-blocking). Returns false if the connection broke.
  bool send_some(int fd, Bytes& out, std::size_t& out_pos);
  // Reads what the socket has and handles every whole frame; the first must be HELLO_OK (then `ready` turns
  // true). Returns false if the connection closed or the relay broke the protocol (reconnect).
  bool receive(int fd, relay::FrameSplitter& splitter, bool& ready);
  bool handle_hello(const Bytes& body);  // false: not a HELLO_OK (close the connection)
  bool handle_frame(const Bytes& body);  // false: the relay broke the protocol (close the connection)

  const std::string path_;
  mutable std::mutex mu_;
  std::map<std::uint64_t, InFlight> inflight_;  // by tag: resubmission in tag order
  std::vector<std::uint64_t> to_send_;           // tags submitted since the current connection's resubmission
  std::vector<std::uint64_t> to_cancel_;
  std::uint64_t next_tag_ = 1;
  bool ready_ = false;     // HELLO_OK seen on the current connection
  bool stopping_ = false;
  std::uint32_t client_id_ = 0, n_ = 0, f_ = 0;
  std::uint64_t connections_ = 0;
  std::uint64_t finals_ = 0;
  UniqueFd wake_read_, wake_write_;
  std::thread io_;
};

}  // namespace bftfs::client
