// Clients on a libevent loop. Both kinds share one interface so benchmarks and the CLI drive either:
//   - ClientRuntime: the PBFT client core (protocol/client.h) on the transport, connected to every replica,
//     ticking every millisecond;
//   - DirectClient: the NO-REP client: sends each Request to the one server and accepts its single reply
//     (retransmitting to it on a timeout). It authenticates exactly like a PBFT client (frame MAC plus an
//     n-entry authenticator), so the comparison measures agreement, not crypto differences.
// Several clients may share one event_base (closed-loop benchmarks run K of them in one thread). A client
// belongs to its base's thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "common/config.h"
#include "protocol/client.h"
#include "runtime/event_raii.h"
#include "runtime/transport.h"

namespace bftfs {

class SubmitClient {
 public:
  // Called once per submitted operation with its accepted result.
  using Callback = std::function<void(const Completion&)>;
  virtual ~SubmitClient() = default;
  virtual std::uint64_t submit(Bytes op, bool read_only, Callback done) = 0;
  virtual std::size_t in_flight() const = 0;
  virtual NodeId id() const = 0;
  virtual std::uint64_t retransmissions() const = 0;
};

// The first request id for a client process: wall-clock nanoseconds, so ids grow across restarts of a client
// id without any stored state (ClientOptions::first_request_id).
std::uint64_t fresh_first_request_id();

// Loads cluster.conf and the secret of client `id`; returns "" or an error.
[[nodiscard]] std::string load_client_identity(const std::string& config_path, NodeId id, ClusterConfig& config,
                                               std::unique_ptr<Crypto>& crypto);

// Connection sharing (multiplexing): without WAN emulation, every client of one event_base that talks to the
// same cluster (or the same NO-REP server) shares one Transport, so K clients of one process (the closed-loop
// benchmark) use one connection per replica instead of K: the replicas' replies to them leave in one system
// call per loop pass, and the client process reads them in one. Each client keeps its own identity and keys
// (Transport::add_identity); the replicas see K authenticated clients exactly as before. With WAN emulation
// each client keeps its own transport, since clients of one process may be placed at different sites.
struct SharedClientTransport;

// What every replicated-client runtime needs below its protocol core: the client's identity, a transport to
// every replica (with the emulated WAN delay, if any; shared as above), and a timer that hands the core every
// elapsed 1 ms tick even when it fires late. ClientRuntime (PBFT) and SpecClientRuntime (PBFT-CS) are built on
// it.
class ClientLink {
 public:
  using OnTicks = std::function<void(std::uint64_t due_ticks)>;
  // `on_message` and `on_ticks` run on `base`'s loop (never during create). `base` must outlive the link.
  // `filter` (may be empty) is asked about this client's frames before they are authenticated
  // (Transport::FrameFilter).
  [[nodiscard]] static std::string create(event_base* base, const std::string& config_path, NodeId id,
                                          const WanSpec& wan, Transport::OnMessage on_message, OnTicks on_ticks,
                                          std::unique_ptr<ClientLink>& out, Transport::FrameFilter filter = {});
  ~ClientLink();
  ClientLink(const ClientLink&) = delete;
  ClientLink& operator=(const ClientLink&) = delete;

  NodeId id() const { return id_; }
  const ClusterConfig& config() const { return config_; }
  // Idle pacing: while `idle()` is true (nothing in flight: the core's ticks only count time) the tick timer
  // wakes every kIdleTickMs instead of every 5 ms; wake() must then be called before anything is submitted,
  // so that the ticks that elapsed reach the core first and its retransmission deadlines start from the right
  // time. Without set_idle the timer always runs at 5 ms.
  void set_idle(std::function<bool()> idle) { idle_ = std::move(idle); }
  void wake();
  static constexpr std::uint32_t kTickMs = 5;
  static constexpr std::uint32_t kIdleTickMs = 50;
  const Crypto& crypto() const { return *crypto_; }
  Transport& transport() { return *transport_; }
  // A seed for the core's PRNG (retransmission jitter): from getrandom, else the clock and the id.
  std::uint64_t seed() const;

 private:
  ClientLink() = default;
  void on_timer();
  NodeId id_ = 0;
  ClusterConfig config_;
  std::shared_ptr<Crypto> crypto_;  // shared with the transport while this identity is registered
  std::shared_ptr<SharedClientTransport> shared_;  // the shared transport (no WAN), or
  std::unique_ptr<Transport> own_transport_;       // this client's own (WAN emulation)
  Transport* transport_ = nullptr;                 // whichever of the two
  EventPtr tick_ev_;
  std::uint64_t last_tick_ns_ = 0;
  OnTicks on_ticks_;
  std::function<bool()> idle_;
  bool slow_ = false;  // the tick timer runs at kIdleTickMs
  void deliver_ticks();
  void arm(std::uint32_t ms);
};

class ClientRuntime final : public SubmitClient {
 public:
  // `options.n`/`f` are taken from the configuration. `base` must outlive the client. `wan` is the emulated
  // wide-area delay (runtime/wan.h), the same spec every process of the run has; with it on, `base` should
  // come from make_event_base(true).
  [[nodiscard]] static std::string create(event_base* base, const std::string& config_path, NodeId id,
                                          ClientOptions options, std::unique_ptr<ClientRuntime>& out,
                                          const WanSpec& wan = {});
  ~ClientRuntime() override;

  std::uint64_t submit(Bytes op, bool read_only, Callback done) override;
  std::size_t in_flight() const override;
  NodeId id() const override { return link_->id(); }
  std::uint64_t retransmissions() const override;
  const ClientStats& stats() const;
  const TransportStats& transport_stats() const { return link_->transport().stats(); }

 private:
  ClientRuntime() = default;
  void drain();
  std::unique_ptr<Client> core_;  // refers to link_'s crypto: the destructor destroys it first
  std::unique_ptr<ClientLink> link_;
  std::map<std::uint64_t, Callback> callbacks_;
  bool draining_ = false;
};

class DirectClient final : public SubmitClient {
 public:
  // Talks to the NO-REP server, which authenticates as replica 0, at `server` (empty host: replica 0's
  // configured address). `wan` as for ClientRuntime::create; the server is at node 0's site.
  [[nodiscard]] static std::string create(event_base* base, const std::string& config_path, NodeId id,
                                          const ReplicaAddress& server, std::unique_ptr<DirectClient>& out,
                                          const WanSpec& wan = {});
  ~DirectClient() override;

  std::uint64_t submit(Bytes op, bool read_only, Callback done) override;
  std::size_t in_flight() const override { return outstanding_.size(); }
  NodeId id() const override { return id_; }
  std::uint64_t retransmissions() const override { return retransmissions_; }

 private:
  struct Outstanding {
    Request request;
    Callback done;
    std::uint64_t sent_ms = 0;
  };
  DirectClient() = default;
  void on_message(NodeId from, Message&& m);
  void on_timer();
  void send(const Request& r);
  NodeId id_ = 0;
  ClusterConfig config_;
  std::shared_ptr<Crypto> crypto_;
  std::shared_ptr<SharedClientTransport> shared_;  // as ClientLink: shared without WAN emulation
  std::unique_ptr<Transport> own_transport_;
  Transport* transport_ = nullptr;
  EventPtr timer_ev_;
  std::uint64_t next_request_id_ = 0;
  std::uint64_t now_ms_ = 0;
  std::uint64_t retransmissions_ = 0;
  std::map<std::uint64_t, Outstanding> outstanding_;
  static constexpr std::uint64_t kRetransmitMs = 500;
};

}  // namespace bftfs
