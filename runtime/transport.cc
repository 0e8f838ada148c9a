#include "os/clock.h"
#include "runtime/transport.h"

#include <arpa/inet.h>
#include <endian.h>
#include <event2/buffer.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/random.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>

#include "common/assert.h"
#include "common/log.h"

namespace bftfs {
namespace {

std::uint64_t seed_from_os() {
  std::uint64_t s = 0;
  if (getrandom(&s, sizeof s, 0) != static_cast<ssize_t>(sizeof s)) s = static_cast<std::uint64_t>(getpid());
  return s;
}

void set_nodelay(int fd) {
  int one = 1;
  // Latency matters more than packet count: every protocol message is its own small write.
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

}  // namespace

bool is_hello(const Message& m) {
  const auto* r = std::get_if<Request>(&m);
  return r != nullptr && r->request_id == kHelloRequestId && r->op.empty();
}

struct Transport::Conn {
  Transport* owner = nullptr;
  std::uint64_t id = 0;
  BufferEventPtr bev;
  bool outgoing = false;
  bool connected = false;  // outgoing: handshake done; incoming: always
  bool dead = false;
  NodeId peer = 0;         // outgoing: the replica; incoming: last authenticated sender (if any)
  bool has_peer = false;
  std::uint32_t rejects = 0;
  Bytes corked;  // frames gathered while the transport is corked
  std::size_t input_left = 0;  // bytes of a partial frame left in the input after the last read_frames
  std::vector<NodeId> bound_nodes;  // incoming: every node bound to this connection (multiplexed clients)
};

// The frames on their way to one node at another site, oldest first, and the timer armed for the oldest.
struct Transport::DelayLink {
  struct Frame {
    std::uint64_t due_ns = 0;  // mono_ns() at which it may leave
    Bytes bytes;
  };
  Transport* owner = nullptr;
  NodeId to = 0;
  std::deque<Frame> frames;
  EventPtr timer;
};

struct Transport::Peer {
  Transport* owner = nullptr;
  NodeId id = 0;
  sockaddr_storage addr{};
  socklen_t addr_len = 0;
  std::string text;               // for logs
  std::uint64_t conn_id = 0;      // 0 = none
  std::uint32_t backoff_ms = 0;
  EventPtr reconnect_timer;
};

std::string parse_host_port(const std::string& text, ReplicaAddress& out) {
  std::string host;
  std::string port;
  if (!text.empty() && text[0] == '[') {
    const auto close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return "bad address '" + text + "': expected [v6]:port";
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string::npos) return "bad address '" + text + "': expected host:port";
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  if (host.empty()) return "bad address '" + text + "': empty host";
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) {
    return "bad address '" + text + "': bad port";
  }
  const unsigned long p = std::stoul(port);
  if (p == 0 || p > 65535) return "bad address '" + text + "': port out of range";
  out.host = host;
  out.port = static_cast<std::uint16_t>(p);
  return "";
}

std::string resolve_address(const ReplicaAddress& address, sockaddr_storage& out, socklen_t& len) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(address.port);
  const int rc = getaddrinfo(address.host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return "cannot resolve " + address.host + ":" + port + ": " + gai_strerror(rc);
  }
  BFT_ASSERT(res->ai_addrlen <= sizeof out);
  std::memcpy(&out, res->ai_addr, res->ai_addrlen);
  len = res->ai_addrlen;
  freeaddrinfo(res);
  return "";
}

Transport::Transport(event_base* base, std::uint32_t n, const Crypto& crypto, const TransportOptions& options,
                     OnMessage on_message)
    : base_(base),
      n_(n),
      crypto_(crypto),
      self_(crypto.self()),
      options_(options),
      on_message_(std::move(on_message)),
      prng_(seed_from_os()) {
  BFT_ASSERT(base_ != nullptr);
  BFT_ASSERT(options_.reconnect_ms_min > 0);
  BFT_ASSERT(options_.reconnect_ms_min <= options_.reconnect_ms_max);
  reap_ev_.reset(event_new(base_, -1, 0, &Transport::on_reap, this));
  BFT_ASSERT(reap_ev_ != nullptr);
  event_priority_set(reap_ev_.get(), kPriorityLate);
  park_timer_.reset(event_new(base_, -1, EV_PERSIST, &Transport::on_park_timer, this));
  BFT_ASSERT(park_timer_ != nullptr);
  const timeval every{0, 100 * 1000};
  BFT_ASSERT(event_add(park_timer_.get(), &every) == 0);
  if (options_.wan.enabled()) {
    BFT_ASSERT(options_.wan.delay_ms <= kWanDelayMsMax);
    BFT_ASSERT(options_.delay_bytes_max >= kFrameBytesMax);
    self_site_ = options_.wan.site(self_);
    // The same for every link: all sites are equally far apart (NSDI'09 §6).
    wan_delay_ns_ = options_.wan.site_delay_ns();  // 0 for a delay below 1 ns: off
  }
}

Transport::~Transport() {
  // Connections first (their callbacks point at this), then peers' timers, then the listener.
  park_timer_.reset();
  delay_links_.clear();
  conns_.clear();
  graveyard_.clear();
  peers_.clear();
  listener_.reset();
}

std::string Transport::listen(const ReplicaAddress& address) {
  BFT_ASSERT(listener_ == nullptr);
  sockaddr_storage ss{};
  socklen_t len = 0;
  if (std::string err = resolve_address(address, ss, len); !err.empty()) return err;
  listener_.reset(evconnlistener_new_bind(base_, &Transport::on_accept, this,
                                          LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC, 512,
                                          reinterpret_cast<sockaddr*>(&ss), static_cast<int>(len)));
  if (listener_ == nullptr) {
    return "cannot listen on " + address.host + ":" + std::to_string(address.port) + ": " + std::strerror(errno);
  }
  return "";
}

std::string Transport::connect(NodeId peer, const ReplicaAddress& address) {
  BFT_ASSERT(peer != self_);
  BFT_ASSERT(peers_.count(peer) == 0);
  auto p = std::make_unique<Peer>();
  p->owner = this;
  p->id = peer;
  p->text = address.host + ":" + std::to_string(address.port);
  if (std::string err = resolve_address(address, p->addr, p->addr_len); !err.empty()) return err;
  p->reconnect_timer.reset(evtimer_new(base_, &Transport::on_reconnect_timer, p.get()));
  BFT_ASSERT(p->reconnect_timer != nullptr);
  Peer& ref = *p;
  peers_[peer] = std::move(p);
  start_connect(ref);
  return "";
}

Transport::Conn* Transport::add_conn(int fd, bool outgoing, NodeId peer) {
  bufferevent* bev = bufferevent_socket_new(base_, fd, BEV_OPT_CLOSE_ON_FREE);
  if (bev == nullptr) {
    ::close(fd);
    return nullptr;
  }
  auto c = std::make_unique<Conn>();
  c->owner = this;
  c->id = next_conn_id_++;
  c->bev.reset(bev);
  c->outgoing = outgoing;
  c->connected = !outgoing;
  c->peer = peer;
  c->has_peer = outgoing;
  bufferevent_priority_set(bev, kPriorityIo);
  bufferevent_set_max_single_read(bev, options_.read_bytes_max_per_event);
  bufferevent_setcb(bev, &Transport::on_read, nullptr, &Transport::on_event, c.get());
  bufferevent_enable(bev, EV_READ | EV_WRITE);
  Conn* raw = c.get();
  conns_[raw->id] = std::move(c);
  return raw;
}

void Transport::start_connect(Peer& p) {
  BFT_ASSERT(p.conn_id == 0);
  ++stats_.connects_started;
  const int fd = ::socket(p.addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    LOG_WARN("", "node %u: socket() for %s failed: %s", self_, p.text.c_str(), std::strerror(errno));
    schedule_reconnect(p);
    return;
  }
  set_nodelay(fd);
  Conn* c = add_conn(fd, true, p.id);
  if (c == nullptr) {
    schedule_reconnect(p);
    return;
  }
  p.conn_id = c->id;
  if (options_.send_hello) {
    // Queued ahead of anything sent on this connection; they go out when the connection is up.
    write_hello(c, crypto_);
    for (const auto& [id, ident] : identities_) {
      if (id != self_) write_hello(c, *ident->crypto);
    }
  }
  if (bufferevent_socket_connect(c->bev.get(), reinterpret_cast<sockaddr*>(&p.addr), static_cast<int>(p.addr_len)) !=
      0) {
    close_conn(c, "connect failed");  // schedules the reconnect
  }
}

// One hello of `crypto.self()` queued on `c` (behind whatever is queued there, ahead of what follows).
void Transport::write_hello(Conn* c, const Crypto& crypto) {
  Request hello;
  hello.client = crypto.self();
  hello.request_id = kHelloRequestId;
  hello.authenticator.resize(n_);
  const Bytes frame = encode_frame(hello, crypto.self(), c->peer, crypto);
  bufferevent_write(c->bev.get(), frame.data(), frame.size());
}

void Transport::add_identity(std::shared_ptr<const Crypto> crypto, OnMessage on_message, FrameFilter filter) {
  BFT_ASSERT(crypto != nullptr);
  const NodeId id = crypto->self();
  BFT_ASSERT(id >= n_);  // clients only: replicas have one identity per process
  auto ident = std::make_shared<Identity>(Identity{std::move(crypto), std::move(on_message), std::move(filter)});
  if (options_.send_hello && id != self_) {
    for (const auto& [peer_id, p] : peers_) {
      if (p->conn_id != 0) write_hello(conns_.at(p->conn_id).get(), *ident->crypto);
    }
  }
  identities_[id] = std::move(ident);
}

void Transport::remove_identity(NodeId id) { identities_.erase(id); }

void Transport::schedule_reconnect(Peer& p) {
  // Exponential backoff with jitter in [backoff/2, backoff]: a restarted replica is not hit by every peer at
  // the same instant, and a dead one costs little.
  p.backoff_ms = p.backoff_ms == 0 ? options_.reconnect_ms_min : std::min(p.backoff_ms * 2, options_.reconnect_ms_max);
  const std::uint64_t ms = p.backoff_ms / 2 + prng_.range(0, p.backoff_ms - p.backoff_ms / 2);
  timeval tv{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>((ms % 1000) * 1000)};
  evtimer_add(p.reconnect_timer.get(), &tv);
}

// An authenticated frame from a replica we have no outgoing connection to: it is up again (a restart), so
// connect now instead of when the backoff timer says. A replica that was down for a while is otherwise deaf to
// us for up to reconnect_ms_max after it restarts, long enough for its view-change timer to fire while it
// waits for our NEW-VIEW or CHECKPOINT, which strands it alone in a higher view.
void Transport::reconnect_now_if_waiting(NodeId node) {
  auto it = peers_.find(node);
  if (it == peers_.end() || it->second->conn_id != 0) return;
  Peer& p = *it->second;
  evtimer_del(p.reconnect_timer.get());
  p.backoff_ms = 0;
  ++stats_.reconnects_early;
  start_connect(p);
}

void Transport::on_reconnect_timer(int, short, void* arg) {
  auto* p = static_cast<Peer*>(arg);
  if (p->conn_id == 0) p->owner->start_connect(*p);
}

void Transport::on_accept(evconnlistener*, int fd, sockaddr*, int, void* arg) {
  auto* t = static_cast<Transport*>(arg);
  if (t->incoming_ >= t->options_.incoming_connections_max) {
    ++t->stats_.connections_refused;
    ::close(fd);
    return;
  }
  set_nodelay(fd);
  // evconnlistener made the socket non-blocking (we do not pass LEV_OPT_LEAVE_SOCKETS_BLOCKING).
  Conn* c = t->add_conn(fd, false, 0);
  if (c == nullptr) return;
  ++t->incoming_;
  ++t->stats_.connections_accepted;
}

void Transport::on_event(bufferevent*, short what, void* arg) {
  auto* c = static_cast<Conn*>(arg);
  Transport* t = c->owner;
  if ((what & BEV_EVENT_CONNECTED) != 0) {
    c->connected = true;
    ++t->stats_.connects_succeeded;
    if (auto it = t->peers_.find(c->peer); it != t->peers_.end()) {
      it->second->backoff_ms = 0;
      LOG_DEBUG("", "node %u: connected to %u at %s", t->self_, c->peer, it->second->text.c_str());
    }
    return;
  }
  if ((what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) != 0) {
    t->close_conn(c, (what & BEV_EVENT_EOF) != 0 ? "eof" : "error");
  }
}

void Transport::on_read(bufferevent*, void* arg) {
  auto* c = static_cast<Conn*>(arg);
  Transport* t = c->owner;
  const bool cork = t->options_.cork_reads && !t->corked_;
  if (cork) t->cork();
  t->read_socket(c);
  t->read_frames(c);  // may close `c`; uncork() skips closed connections
  if (!c->dead) c->input_left = evbuffer_get_length(bufferevent_get_input(c->bev.get()));
  if (cork) t->uncork();
}

constexpr std::size_t kLibeventReadMax = 4096;  // EVBUFFER_MAX_READ of libevent 2.1

// libevent 2.1 reads at most 4 KiB per readiness event (EVBUFFER_MAX_READ in evbuffer_read, whatever
// bufferevent_set_max_single_read allows; 2.2 made the cap settable), so a 6 KiB batch of requests took two
// passes of the loop and a 1 MiB write 256, each an epoll_wait and a readv. Read what the socket holds now, up to
// the per-event fairness bound. EOF and errors are left to the bufferevent: the socket stays readable (level
// triggered) and its next read reports them.
void Transport::read_socket(Conn* c) {
  evbuffer* in = bufferevent_get_input(c->bev.get());
  // libevent read min(FIONREAD, 4 KiB): less than 4 KiB means it took everything, and another readv would
  // only return EAGAIN.
  const std::size_t fresh = evbuffer_get_length(in) - std::min(evbuffer_get_length(in), c->input_left);
  if (fresh < kLibeventReadMax) return;
  const int fd = bufferevent_getfd(c->bev.get());
  if (fd < 0) return;
  constexpr std::size_t kChunk = 64u << 10;
  std::size_t budget = options_.read_bytes_max_per_event;
  // A bufferevent keeps the end of its input frozen between its own reads; it unfreezes it the same way.
  evbuffer_unfreeze(in, 0);
  struct Refreeze {
    evbuffer* b;
    ~Refreeze() { evbuffer_freeze(b, 0); }
  } refreeze{in};
  while (budget > 0) {
    const std::size_t want = std::min(budget, kChunk);
    evbuffer_iovec v[2];
    const int nv = evbuffer_reserve_space(in, static_cast<ev_ssize_t>(want), v, 2);
    if (nv <= 0) return;
    std::size_t room = 0;
    for (int i = 0; i < nv; ++i) room += v[i].iov_len;
    ssize_t r;
    do {
      r = ::readv(fd, reinterpret_cast<const iovec*>(v), nv);  // evbuffer_iovec is struct iovec on POSIX
    } while (r < 0 && errno == EINTR);
    ++stats_.direct_reads;
    if (r <= 0) {
      evbuffer_commit_space(in, v, 0);
      return;
    }
    std::size_t left = static_cast<std::size_t>(r);
    int used = 0;
    for (; used < nv && left > 0; ++used) {
      v[used].iov_len = std::min(v[used].iov_len, left);
      left -= v[used].iov_len;
    }
    BFT_ASSERT(evbuffer_commit_space(in, v, used) == 0);
    const std::size_t got = static_cast<std::size_t>(r);
    budget -= std::min(budget, got);
    if (got < room) return;  // the socket is drained
  }
}

void Transport::read_frames(Conn* c) {
  evbuffer* in = bufferevent_get_input(c->bev.get());
  while (!c->dead) {
    const std::size_t avail = evbuffer_get_length(in);
    if (avail < kHeaderBytes) return;
    const std::uint8_t* head = evbuffer_pullup(in, static_cast<ev_ssize_t>(kHeaderBytes));
    BFT_ASSERT(head != nullptr);
    const std::size_t len = checked_frame_length(c, head);
    if (len == 0) return;     // closed: a malformed header
    if (avail < len) return;  // the rest of the frame has not arrived yet
    const std::shared_ptr<Identity> ident = identity_of_frame(head);
    if (filtered_out(ident.get(), head)) {
      evbuffer_drain(in, len);
      ++stats_.frames_skipped;
      stats_.bytes_received += len;
      continue;
    }
    const std::uint8_t* frame = evbuffer_pullup(in, static_cast<ev_ssize_t>(len));
    BFT_ASSERT(frame != nullptr);
    Decoded d = decode_frame(std::span<const std::uint8_t>(frame, len), n_, ident ? *ident->crypto : crypto_);
    evbuffer_drain(in, len);
    ++stats_.frames_received;
    stats_.bytes_received += len;
    if (!d.ok()) {
      if (!tolerate_reject(c, d.reject)) return;  // closed: too many rejected frames
      continue;
    }
    deliver(c, ident, std::move(d));
  }
}

// The frame's length from its header, or 0 after closing the connection: a header that does not parse leaves
// no way to find the next frame.
std::size_t Transport::checked_frame_length(Conn* c, const std::uint8_t* head) {
  Reject reject = Reject::kNone;
  const std::size_t len = frame_length(std::span<const std::uint8_t>(head, kHeaderBytes), reject);
  if (len != 0) return len;
  ++stats_.closed_bad_header;
  ++stats_.rejects_by_reason[static_cast<std::size_t>(reject) % stats_.rejects_by_reason.size()];
  LOG_WARN("", "node %u: closing connection: malformed frame header (%.*s)", self_,
           static_cast<int>(to_string(reject).size()), to_string(reject).data());
  close_conn(c, "malformed header");
  return 0;
}

// The further identity (multiplexing) the frame claims to be for, or null for the transport's own. It is
// checked like any header field: the MAC is computed with that identity's keys, and decode_frame() checks the
// receiver against it.
std::shared_ptr<Transport::Identity> Transport::identity_of_frame(const std::uint8_t* head) const {
  if (identities_.empty()) return nullptr;
  // Header fields at their wire offsets (protocol/wire.h): receiver at 12.
  std::uint32_t receiver = 0;
  std::memcpy(&receiver, head + 12, sizeof receiver);
  auto it = identities_.find(le32toh(receiver));
  return it != identities_.end() ? it->second : nullptr;
}

// True when the receiving identity's filter (or the transport's) skips the frame, judged on its header alone.
bool Transport::filtered_out(const Identity* ident, const std::uint8_t* head) const {
  const FrameFilter& filter = ident != nullptr ? ident->filter : filter_;
  if (!filter) return false;
  // Header fields at their wire offsets (protocol/wire.h): type at 5, sender at 8, seq at 24.
  std::uint32_t sender = 0;
  std::uint64_t seq = 0;
  std::memcpy(&sender, head + 8, sizeof sender);
  std::memcpy(&seq, head + 24, sizeof seq);
  return !filter(static_cast<MsgType>(head[5]), le32toh(sender), le64toh(seq));
}

// Counts a rejected frame; a connection that sends too many is closed (then false).
bool Transport::tolerate_reject(Conn* c, Reject reject) {
  ++stats_.frames_rejected;
  ++stats_.rejects_by_reason[static_cast<std::size_t>(reject) % stats_.rejects_by_reason.size()];
  LOG_DEBUG("", "node %u: frame rejected: %.*s", self_, static_cast<int>(to_string(reject).size()),
            to_string(reject).data());
  if (++c->rejects >= options_.rejects_max) {
    ++stats_.closed_too_many_rejects;
    close_conn(c, "too many rejected frames");
    return false;
  }
  return true;
}

// Hands an authenticated frame to its identity's callback (or the transport's). The first frame of a node on
// an incoming connection binds the node to it; a client's HELLO does nothing else.
void Transport::deliver(Conn* c, const std::shared_ptr<Identity>& ident, Decoded&& d) {
  if (!c->outgoing && d.sender != self_) {
    bind(c, d.sender);
    if (c->dead) return;  // delivering parked frames overflowed it
    reconnect_now_if_waiting(d.sender);
    if (d.sender >= n_ && is_hello(d.message)) {
      ++stats_.hellos_received;
      return;
    }
  }
  if (ident) {
    // `ident` (a shared_ptr) keeps the callback alive even if the identity removes itself in it.
    if (ident->on_message) ident->on_message(d.sender, std::move(d.message));
    return;
  }
  on_message_(d.sender, std::move(d.message));
}

// Authenticated: frames for `node` go over this connection from now on, starting with any parked ones.
void Transport::bind(Conn* c, NodeId node) {
  c->peer = node;
  c->has_peer = true;
  auto [it, inserted] = bound_.insert({node, c->id});
  if (!inserted) {
    if (it->second == c->id) return;
    it->second = c->id;
  }
  // Bounded by the nodes that ever bound here (a node flipping between two connections is listed once).
  if (std::find(c->bound_nodes.begin(), c->bound_nodes.end(), node) == c->bound_nodes.end()) {
    c->bound_nodes.push_back(node);
  }
  auto pit = parked_.find(node);
  if (pit == parked_.end()) return;
  Parked parked = std::move(pit->second);
  parked_.erase(pit);
  for (const Bytes& f : parked.frames) {
    parked_bytes_ -= f.size();
    ++stats_.parked_delivered;
    send_undelayed(node, f.data(), f.size());  // parked frames have served their delay already
  }
}

void Transport::on_park_timer(int, short, void* arg) {
  auto* t = static_cast<Transport*>(arg);
  const std::uint64_t now = mono_ms();
  for (auto it = t->parked_.begin(); it != t->parked_.end();) {
    if (now - it->second.since_ms >= t->options_.park_ms) {
      for (const Bytes& f : it->second.frames) t->parked_bytes_ -= f.size();
      t->stats_.parked_expired += it->second.frames.size();
      it = t->parked_.erase(it);
    } else {
      ++it;
    }
  }
}

void Transport::close_conn(Conn* c, const char* reason) {
  if (c->dead) return;
  c->dead = true;
  ++stats_.connections_closed;
  LOG_DEBUG("", "node %u: connection %llu (%s, peer %u) closed: %s", self_, static_cast<unsigned long long>(c->id),
            c->outgoing ? "out" : "in", c->has_peer ? c->peer : 0u, reason);
  // Close the socket now; free the object after the current callback returns (it may be on the stack).
  c->bev.reset();
  if (!c->outgoing) {
    BFT_ASSERT(incoming_ > 0);
    --incoming_;
    // Every node bound here, not only the last sender: a connection may carry many clients.
    for (NodeId node : c->bound_nodes) {
      auto it = bound_.find(node);
      if (it != bound_.end() && it->second == c->id) bound_.erase(it);
    }
  }
  auto it = conns_.find(c->id);
  BFT_ASSERT(it != conns_.end());
  std::unique_ptr<Conn> owned = std::move(it->second);
  conns_.erase(it);
  if (c->outgoing) {
    auto pit = peers_.find(c->peer);
    if (pit != peers_.end() && pit->second->conn_id == c->id) {
      pit->second->conn_id = 0;
      schedule_reconnect(*pit->second);
    }
  }
  graveyard_.push_back(std::move(owned));
  event_active(reap_ev_.get(), EV_TIMEOUT, 0);
}

void Transport::on_reap(int, short, void* arg) { static_cast<Transport*>(arg)->graveyard_.clear(); }

bool Transport::send_frame(NodeId to, const std::uint8_t* data, std::size_t size) {
  // LAN (the default) costs this one branch; same-site links a map lookup.
  if (wan_delay_ns_ != 0 && options_.wan.site(to) != self_site_) return delay_frame(to, data, size);
  return send_undelayed(to, data, size);
}

bool Transport::delay_frame(NodeId to, const std::uint8_t* data, std::size_t size) {
  if (delayed_frames_ >= options_.delay_frames_max || delayed_bytes_ + size > options_.delay_bytes_max) {
    ++stats_.delay_dropped;
    LOG_DEBUG("", "node %u: delay links full (%zu frames, %zu bytes); frame for %u dropped", self_, delayed_frames_,
              delayed_bytes_, to);
    return false;
  }
  std::unique_ptr<DelayLink>& slot = delay_links_[to];
  if (slot == nullptr) {
    slot = std::make_unique<DelayLink>();
    slot->owner = this;
    slot->to = to;
    slot->timer.reset(evtimer_new(base_, &Transport::on_delay_timer, slot.get()));
    BFT_ASSERT(slot->timer != nullptr);
    // With the sockets, not after them: a due frame is as urgent as a readable one.
    event_priority_set(slot->timer.get(), kPriorityIo);
  }
  DelayLink& link = *slot;
  link.frames.push_back(DelayLink::Frame{mono_ns() + wan_delay_ns_, Bytes(data, data + size)});
  ++delayed_frames_;
  delayed_bytes_ += size;
  ++stats_.frames_delayed;
  if (link.frames.size() == 1) {
    // libevent measures a timeout from the time it cached when this loop pass began, which is earlier than the
    // send time just taken: without a refresh the timer would wake up a little before the frame is due and
    // need a second wake-up (measured: the median hop late by 35-55 us instead of about 90 us at 2.5 ms).
    event_base_update_cache_time(base_);
    arm_delay_timer(link, wan_delay_ns_);
  }
  return true;
}

void Transport::arm_delay_timer(DelayLink& link, std::uint64_t in_ns) {
  const std::uint64_t us = (in_ns + 999) / 1000;  // never early: round up to libevent's microseconds
  const timeval tv{static_cast<time_t>(us / 1000000), static_cast<suseconds_t>(us % 1000000)};
  BFT_ASSERT(evtimer_add(link.timer.get(), &tv) == 0);
}

void Transport::on_delay_timer(int, short, void* arg) {
  auto* link = static_cast<DelayLink*>(arg);
  link->owner->release_due(*link);
}

// Hands every due frame of `link` to the connection, oldest first, in one write when they share one, then
// re-arms for the next. The timer may wake before our clock says the head is due (libevent's clock is not
// ours); then nothing leaves and it re-arms for the rest.
void Transport::release_due(DelayLink& link) {
  BFT_ASSERT(!link.frames.empty());
  const std::uint64_t now = mono_ns();
  const bool cork_here = !corked_;
  if (cork_here) cork();
  while (!link.frames.empty() && link.frames.front().due_ns <= now) {
    DelayLink::Frame f = std::move(link.frames.front());
    link.frames.pop_front();
    BFT_ASSERT(delayed_frames_ > 0);
    BFT_ASSERT(delayed_bytes_ >= f.bytes.size());
    --delayed_frames_;
    delayed_bytes_ -= f.bytes.size();
    send_undelayed(link.to, f.bytes.data(), f.bytes.size());
  }
  if (cork_here) uncork();
  if (!link.frames.empty()) arm_delay_timer(link, link.frames.front().due_ns - now);
}

bool Transport::send_undelayed(NodeId to, const std::uint8_t* data, std::size_t size) {
  Conn* c = nullptr;
  if (auto pit = peers_.find(to); pit != peers_.end()) {
    if (pit->second->conn_id != 0) c = conns_.at(pit->second->conn_id).get();
  } else if (auto bit = bound_.find(to); bit != bound_.end()) {
    c = conns_.at(bit->second).get();
  }
  if (c == nullptr) {
    if (peers_.count(to) == 0 && crypto_.knows(to)) {
      // A node that reaches us over its own connection but has not (yet) authenticated on one: park.
      Parked& p = parked_[to];
      if (p.frames.empty()) p.since_ms = mono_ms();
      if (p.frames.size() < options_.park_frames_max && parked_bytes_ + size <= options_.park_bytes_max) {
        p.frames.emplace_back(data, data + size);
        parked_bytes_ += size;
        ++stats_.frames_parked;
        return true;
      }
      ++stats_.parked_expired;
    }
    ++stats_.sends_dropped_no_connection;
    LOG_DEBUG("", "node %u: no connection to %u; frame dropped", self_, to);
    return false;
  }
  evbuffer* out = bufferevent_get_output(c->bev.get());
  if (evbuffer_get_length(out) + c->corked.size() + size > options_.output_bytes_max) {
    ++stats_.closed_slow_peer;
    LOG_WARN("", "node %u: peer %u does not read (output over %zu bytes); disconnecting", self_, to,
             options_.output_bytes_max);
    close_conn(c, "slow peer");
    return false;
  }
  ++stats_.frames_sent;
  if (corked_ && c->connected && evbuffer_get_length(out) == 0) {
    if (c->corked.empty()) {
      corked_conns_.push_back(c->id);
    } else {
      ++stats_.corked_frames;
    }
    c->corked.insert(c->corked.end(), data, data + size);
    return true;
  }
  return write_now(c, data, size);
}

// Writes straight to the socket when nothing is queued on the connection. Going through the bufferevent
// would cost an epoll_ctl to arm the write event, another loop iteration to see it, and an epoll_ctl to
// disarm it: a few microseconds on every protocol hop. Whatever the kernel does not take is queued as usual.
bool Transport::write_now(Conn* c, const std::uint8_t* data, std::size_t size) {
  evbuffer* out = bufferevent_get_output(c->bev.get());
  if (c->connected && evbuffer_get_length(out) == 0) {
    const int fd = bufferevent_getfd(c->bev.get());
    ssize_t w;
    do {
      w = ::send(fd, data, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    } while (w < 0 && errno == EINTR);
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      close_conn(c, "send failed");
      return false;
    }
    const std::size_t sent = w > 0 ? static_cast<std::size_t>(w) : 0;
    ++stats_.direct_writes;
    stats_.bytes_sent += sent;
    if (sent == size) return true;
    data += sent;
    size -= sent;
  }
  if (bufferevent_write(c->bev.get(), data, size) != 0) {
    close_conn(c, "write failed");
    return false;
  }
  stats_.bytes_sent += size;
  return true;
}

void Transport::cork() {
  BFT_ASSERT(!corked_);
  corked_ = true;
}

void Transport::uncork() {
  BFT_ASSERT(corked_);
  corked_ = false;
  for (std::uint64_t id : corked_conns_) {
    auto it = conns_.find(id);
    if (it == conns_.end()) continue;  // closed while corked: its frames are lost like any queued output
    Conn* c = it->second.get();
    Bytes frames = std::move(c->corked);
    c->corked.clear();
    write_now(c, frames.data(), frames.size());
  }
  corked_conns_.clear();
}

void Transport::send(const Send& s) {
  // A multiplexed client's request leaves under its own identity (clients send nothing but requests).
  if (!identities_.empty()) {
    if (const auto* r = std::get_if<Request>(&s.message); r != nullptr && r->client != self_) {
      if (auto it = identities_.find(r->client); it != identities_.end()) {
        const std::shared_ptr<const Crypto> crypto = it->second->crypto;
        send_with(*crypto, s);
        return;
      }
    }
  }
  send_with(crypto_, s);
}

void Transport::send_with(const Crypto& crypto, const Send& s) {
  const NodeId from = crypto.self();
  if (s.to == kAllReplicas) {
    const Bytes unsealed = encode_unsealed(s.message, from);
    for (NodeId r = 0; r < n_; ++r) {
      if (r == from) continue;
      const Bytes frame = seal_for(unsealed, r, crypto);
      send_frame(r, frame.data(), frame.size());
    }
    return;
  }
  BFT_ASSERT(s.to != from);  // the cores never address themselves
  const Bytes frame = encode_frame(s.message, from, s.to, crypto);
  send_frame(s.to, frame.data(), frame.size());
}

bool Transport::connected(NodeId peer) const {
  auto it = peers_.find(peer);
  if (it == peers_.end() || it->second->conn_id == 0) return false;
  return conns_.at(it->second->conn_id)->connected;
}

}  // namespace bftfs
