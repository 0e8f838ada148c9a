// The TCP transport of every bftfs process (replica, NO-REP server, clients), on libevent bufferevents.
//
// Connections. A node keeps one outgoing connection to each replica it talks to (connect(), reconnecting with
// jittered exponential backoff when it fails) and accepts connections on its listening address (listen()).
// Replicas send to replicas over their own outgoing connections; a replica answers a client over the
// connection that client opened: the client id is bound to a connection once an authenticated frame from that
// client arrived on it (the latest such connection wins, so a reconnecting client is followed). One connection
// may carry several clients (a client process multiplexing its clients, add_identity): each is bound by its
// own frames, and closing the connection unbinds them all.
//
// Hello: a client (send_hello) starts every outgoing connection with one authenticated "hello" frame, a
// Request with request_id 0 and an empty operation. The receiving transport binds the connection to the
// client and does not deliver the hello to the core. Without it a backup could not answer a client that has
// so far only talked to the primary (the reply would have no connection to go over, and the client would
// wait for its retransmission timeout). Request ids start at 1 (ClientOptions::first_request_id), so the
// hello is never mistaken for a request.
//
// Parking: a frame for a node that has no connection yet (a client whose connection has not been read yet,
// or that is reconnecting) is held for up to park_ms (at most park_frames_max per node and park_bytes_max in
// all) and sent as soon as that node authenticates on a connection. A reply racing the client's first frame
// on a new connection is therefore not lost.
//
// Framing and untrusted input (protocol/wire.h): the reader waits for kHeaderBytes, asks frame_length() for the
// size (which validates magic, version and the size limit before anything is allocated), waits for the whole
// frame and calls decode_frame(), which checks the MAC before parsing the body.
//   - a malformed header: the stream is out of sync or hostile; the connection is closed and counted;
//   - a frame that fails authentication or body checks: counted by reason and dropped; after rejects_max such
//     frames on one connection it is closed.
// Output is capped per connection (output_bytes_max): a peer that does not read is disconnected rather than
// allowed to grow our memory; what was queued for it is lost, which the protocol's retransmission tolerates.
//
// WAN emulation (runtime/wan.h, options.wan): a frame for a node at another site is not written at once but
// held in that node's delay link, a FIFO, and handed to the code above (connection, parking, drop) once its
// send time plus the delay has passed; each link has its own timer armed for its oldest frame. Only the sender
// delays, so each direction of a round trip is delayed once. A link releases frames in the order they were
// sent and never before they are due (the timer re-arms if libevent wakes it early); frames that fall due
// together leave in one write. The links together hold at most delay_frames_max frames and delay_bytes_max
// bytes: past that a frame is dropped and counted, like a congested router's buffer, and the protocol's
// retransmission copes. Same-site frames, and every frame when the delay is 0, take the direct path, which
// costs one extra branch. Connection set-up (TCP handshake, a client's hello) is not delayed. Frames still in
// a link when the transport is destroyed are lost, like packets in flight. The event_base should have precise
// timers (make_event_base(true)) or a 2.5 ms delay is rounded to the clock's 4 ms jiffy.
//
// Threading: one Transport belongs to one event_base and is used only from that base's thread.
#pragma once

#include <sys/socket.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/crypto.h"
#include "common/prng.h"
#include "protocol/effects.h"
#include "protocol/wire.h"
#include "runtime/event_raii.h"
#include "runtime/wan.h"

namespace bftfs {

struct TransportOptions {
  std::size_t output_bytes_max = (64u << 20) + kFrameBytesMax;  // per connection; above one maximal frame
  std::uint32_t rejects_max = 64;               // bad frames tolerated on one connection before closing it
  std::uint32_t reconnect_ms_min = 5;
  std::uint32_t reconnect_ms_max = 1000;
  std::uint32_t incoming_connections_max = 4096;
  std::size_t read_bytes_max_per_event = 256u << 10;  // fairness between connections in one loop pass
  bool send_hello = false;                      // clients: bind each new connection at once (see above)
  // Clients: what the callbacks of one read send leaves when the read is done, one write per connection (the
  // K closed-loop clients answered by one frame group send their next requests in one write, not K).
  bool cork_reads = false;
  std::uint32_t park_ms = 1000;
  std::uint32_t park_frames_max = 64;
  std::size_t park_bytes_max = 16u << 20;
  WanSpec wan;                                  // emulated wide-area delay (see WAN emulation); LAN by default
  std::uint32_t delay_frames_max = 1u << 16;    // frames held in all delay links together
  std::size_t delay_bytes_max = (64u << 20) + kFrameBytesMax;  // bytes held in all delay links; above one frame
};

inline constexpr std::uint64_t kHelloRequestId = 0;
bool is_hello(const Message& m);

struct TransportStats {
  std::uint64_t frames_received = 0;
  std::uint64_t bytes_received = 0;
  std::uint64_t frames_sent = 0;
  std::uint64_t bytes_sent = 0;
  std::uint64_t connections_accepted = 0;
  std::uint64_t connections_refused = 0;  // over incoming_connections_max
  std::uint64_t connects_started = 0;
  std::uint64_t connects_succeeded = 0;
  std::uint64_t connections_closed = 0;
  std::uint64_t reconnects_early = 0;  // a peer we were backing off from spoke to us: connected at once
  std::uint64_t closed_bad_header = 0;    // malformed header: stream closed
  std::uint64_t closed_too_many_rejects = 0;
  std::uint64_t closed_slow_peer = 0;     // output cap exceeded
  std::uint64_t frames_rejected = 0;      // sum of rejects_by_reason
  std::uint64_t frames_skipped = 0;       // dropped unread by the frame filter (see set_frame_filter)
  std::uint64_t sends_dropped_no_connection = 0;
  std::uint64_t hellos_received = 0;
  std::uint64_t frames_parked = 0;        // held for a node without a connection (see Parking)
  std::uint64_t parked_delivered = 0;
  std::uint64_t parked_expired = 0;       // dropped: the node did not connect in time, or over the caps
  std::uint64_t direct_writes = 0;        // send() calls straight to the socket (nothing was queued)
  std::uint64_t direct_reads = 0;         // readv() calls past libevent's 4 KiB read (see read_socket)
  std::uint64_t corked_frames = 0;        // frames that shared a send() with others of the same flush
  std::uint64_t frames_delayed = 0;       // held in a delay link (WAN emulation)
  std::uint64_t delay_dropped = 0;        // dropped: the delay links were full
  std::array<std::uint64_t, 32> rejects_by_reason{};  // index = static_cast<int>(Reject)
};

class Transport {
 public:
  // Called for every authenticated, well-formed message, in arrival order per connection.
  using OnMessage = std::function<void(NodeId from, Message&& message)>;
  // Asked, before authentication, about every complete frame whose header parsed: false drops the frame unread
  // (counted in frames_skipped). The header is not authenticated, so a filter may only say false for frames
  // whose authentic version its receiver would drop anyway (a client: replies to requests it completed).
  using FrameFilter = std::function<bool(MsgType type, NodeId sender, std::uint64_t seq)>;

  // `n` is the number of replicas (decode_frame needs it). `crypto.self()` is this node. `base` and `crypto`
  // must outlive the transport.
  Transport(event_base* base, std::uint32_t n, const Crypto& crypto, const TransportOptions& options,
            OnMessage on_message);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // Listens on exactly the configured address (not a wildcard, so several nodes can share a host and network
  // namespaces with their own addresses work). Returns "" or an error.
  [[nodiscard]] std::string listen(const ReplicaAddress& address);
  // Keeps an outgoing connection to `peer` at `address` from now on. Returns "" or an error (address does not
  // resolve). Frames sent before the connection is up are queued in it (within the output cap).
  [[nodiscard]] std::string connect(NodeId peer, const ReplicaAddress& address);

  // Sends one encoded frame to `to`: over the outgoing connection to `to` if there is one, else over the
  // connection `to` last authenticated itself on. Returns false if there is none (counted, dropped). A frame
  // for another site (WAN emulation) goes through `to`'s delay link first: then the result is true if the
  // frame was queued, false if the links were full (counted, dropped), and what happens at release time is
  // counted in the stats as above.
  bool send_frame(NodeId to, const std::uint8_t* data, std::size_t size);
  // Encodes and sends one Send of the core: a broadcast (kAllReplicas) encodes the body once and seals it per
  // receiver; other sends are encoded for their one receiver.
  void send(const Send& s);

  // Between cork() and uncork(), frames for a connection with nothing queued are gathered and written with
  // one system call per connection at uncork() (the runtimes cork around each flush). Not nestable.
  void cork();
  void uncork();

  // Installs the filter above (none by default).
  void set_frame_filter(FrameFilter filter) { filter_ = std::move(filter); }

  // Multiplexing (several clients of one process over one connection per replica): a further local identity.
  // A frame whose header names `crypto->self()` as its receiver is authenticated with that identity's keys,
  // filtered by its filter and delivered to its callback; a Request whose client is that identity is sealed
  // with its keys (send()). With send_hello the identity binds itself on every outgoing connection, now and
  // after every reconnect, so a replica answers it over the shared connection (the replica side needs nothing:
  // it binds each client id to the connection its frames arrived on). The transport's own identity (the
  // constructor's crypto) may be added too, to give it a removable callback. `crypto` is kept alive by the
  // transport while the identity is registered.
  void add_identity(std::shared_ptr<const Crypto> crypto, OnMessage on_message, FrameFilter filter);
  // Frames for `id` are dropped from now on (those of the transport's own identity go to the constructor's
  // callback again). Safe to call from that identity's own callback.
  void remove_identity(NodeId id);

  // True if an outgoing connection to `peer` is established.
  bool connected(NodeId peer) const;
  std::size_t connection_count() const { return conns_.size(); }
  const TransportStats& stats() const { return stats_; }
  NodeId self() const { return self_; }

 private:
  struct Conn;
  struct Peer;
  static void on_read(bufferevent* bev, void* arg);
  static void on_event(bufferevent* bev, short what, void* arg);
  static void on_accept(evconnlistener* l, int fd, sockaddr* sa, int socklen, void* arg);
  static void on_reconnect_timer(int fd, short what, void* arg);
  static void on_reap(int fd, short what, void* arg);
  static void on_park_timer(int fd, short what, void* arg);
  void bind(Conn* c, NodeId node);

  Conn* add_conn(int fd, bool outgoing, NodeId peer);
  void read_socket(Conn* c);
  void read_frames(Conn* c);
  void close_conn(Conn* c, const char* reason);
  void start_connect(Peer& p);
  void schedule_reconnect(Peer& p);
  void reconnect_now_if_waiting(NodeId node);
  bool write_now(Conn* c, const std::uint8_t* data, std::size_t size);
  bool send_undelayed(NodeId to, const std::uint8_t* data, std::size_t size);
  bool delay_frame(NodeId to, const std::uint8_t* data, std::size_t size);
  struct DelayLink;
  static void on_delay_timer(int fd, short what, void* arg);
  void release_due(DelayLink& link);
  void arm_delay_timer(DelayLink& link, std::uint64_t in_ns);

  event_base* base_;
  std::uint32_t n_;
  const Crypto& crypto_;
  NodeId self_;
  TransportOptions options_;
  OnMessage on_message_;
  FrameFilter filter_;
  struct Identity {
    std::shared_ptr<const Crypto> crypto;
    OnMessage on_message;
    FrameFilter filter;
  };
  std::map<NodeId, std::shared_ptr<Identity>> identities_;  // further local identities (multiplexing)
  // read_frames()'s steps.
  std::size_t checked_frame_length(Conn* c, const std::uint8_t* head);
  std::shared_ptr<Identity> identity_of_frame(const std::uint8_t* head) const;
  bool filtered_out(const Identity* ident, const std::uint8_t* head) const;
  bool tolerate_reject(Conn* c, Reject reject);
  void deliver(Conn* c, const std::shared_ptr<Identity>& ident, Decoded&& d);
  void send_with(const Crypto& crypto, const Send& s);
  void write_hello(Conn* c, const Crypto& crypto);
  Prng prng_;
  ListenerPtr listener_;
  std::uint64_t next_conn_id_ = 1;
  std::map<std::uint64_t, std::unique_ptr<Conn>> conns_;
  std::map<NodeId, std::unique_ptr<Peer>> peers_;          // outgoing
  std::map<NodeId, std::uint64_t> bound_;                  // node -> incoming connection it authenticated on
  std::vector<std::unique_ptr<Conn>> graveyard_;            // closed in a callback; freed by reap_ev_
  EventPtr reap_ev_;
  struct Parked {
    std::vector<Bytes> frames;
    std::uint64_t since_ms = 0;
  };
  std::map<NodeId, Parked> parked_;
  std::size_t parked_bytes_ = 0;
  EventPtr park_timer_;
  bool corked_ = false;
  std::vector<std::uint64_t> corked_conns_;
  std::uint32_t incoming_ = 0;
  // WAN emulation: the delay to every node at another site (0: off), this node's site, and one link per node
  // that frames were delayed for.
  std::uint64_t wan_delay_ns_ = 0;
  std::uint32_t self_site_ = 0;
  std::map<NodeId, std::unique_ptr<DelayLink>> delay_links_;
  std::size_t delayed_frames_ = 0;
  std::size_t delayed_bytes_ = 0;
  TransportStats stats_;
};

// Resolves host:port (numeric or a name) to a socket address. Returns "" or an error.
[[nodiscard]] std::string resolve_address(const ReplicaAddress& address, sockaddr_storage& out, socklen_t& len);
// Parses "host:port" or "[v6]:port". Returns "" or an error.
[[nodiscard]] std::string parse_host_port(const std::string& text, ReplicaAddress& out);

}  // namespace bftfs
