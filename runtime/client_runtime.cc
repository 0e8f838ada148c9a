#include "runtime/client_runtime.h"

#include <algorithm>
#include <cstdio>
#include <mutex>

#include <signal.h>
#include <sys/random.h>
#include <time.h>

#include "common/assert.h"
#include "common/log.h"
#include "os/clock.h"

namespace bftfs {

// One transport and the identity it was created with (destroyed in this order: the transport refers to it).
struct SharedClientTransport {
  std::shared_ptr<const Crypto> owner_crypto;
  std::unique_ptr<Transport> transport;
  ~SharedClientTransport() { transport.reset(); }
};

namespace {

// Live shared transports by (event base, kind, address). A weak reference: the last client to go destroys the
// transport (before its base, which every client must outlive). Clients of different threads (different
// bases) may be created at once, hence the lock.
std::mutex g_shared_mu;
std::map<std::string, std::weak_ptr<SharedClientTransport>> g_shared;

// The shared transport for `key` on `base`, created with `crypto`'s identity and connected by `connect` when
// there is none yet; `crypto`'s identity is then registered on it with `on_message` and `filter`.
std::string join_shared(event_base* base, const std::string& key, std::uint32_t n, const std::shared_ptr<Crypto>& crypto,
                        const TransportOptions& transport_options,
                        const std::function<std::string(Transport&)>& connect,
                        Transport::OnMessage on_message, Transport::FrameFilter filter,
                        std::shared_ptr<SharedClientTransport>& out) {
  char prefix[32];
  std::snprintf(prefix, sizeof prefix, "%p|", static_cast<void*>(base));
  const std::string full_key = prefix + key;
  std::lock_guard<std::mutex> lock(g_shared_mu);
  std::shared_ptr<SharedClientTransport> shared = g_shared[full_key].lock();
  if (shared == nullptr) {
    shared = std::make_shared<SharedClientTransport>();
    shared->owner_crypto = crypto;
    // Frames for an identity that is gone are dropped: every live client is registered with add_identity.
    shared->transport = std::make_unique<Transport>(base, n, *crypto, transport_options, [](NodeId, Message&&) {});
    if (std::string err = connect(*shared->transport); !err.empty()) return err;
    g_shared[full_key] = shared;
  }
  shared->transport->add_identity(crypto, std::move(on_message), std::move(filter));
  out = std::move(shared);
  return "";
}

}  // namespace

std::uint64_t fresh_first_request_id() { return clock_ns(CLOCK_REALTIME); }

std::string load_client_identity(const std::string& config_path, NodeId id, ClusterConfig& config,
                                 std::unique_ptr<Crypto>& crypto) {
  if (std::string err = load_cluster(config_path, config); !err.empty()) return err;
  if (!config.is_client(id)) {
    return "node " + std::to_string(id) + " is not a client of " + config_path + " (clients are " +
           (config.clients.empty() ? std::string("none")
                                   : std::to_string(config.clients.front()) + ".." + std::to_string(config.clients.back())) +
           ")";
  }
  SecretKeys secret;
  if (std::string err = load_secret(secret_path_for(config_path, id), secret); !err.empty()) return err;
  crypto = make_crypto(config, id, secret);
  if (crypto == nullptr) return "cannot build the crypto context of client " + std::to_string(id);
  return "";
}

// ---------------------------------------------------------------------------------------------------------
// ClientLink

std::string ClientLink::create(event_base* base, const std::string& config_path, NodeId id, const WanSpec& wan,
                               Transport::OnMessage on_message, OnTicks on_ticks, std::unique_ptr<ClientLink>& out,
                               Transport::FrameFilter filter) {
  out.reset();
  ::signal(SIGPIPE, SIG_IGN);
  std::unique_ptr<ClientLink> link(new ClientLink());
  link->id_ = id;
  link->on_ticks_ = std::move(on_ticks);
  std::unique_ptr<Crypto> crypto;
  if (std::string err = load_client_identity(config_path, id, link->config_, crypto); !err.empty()) return err;
  link->crypto_ = std::move(crypto);
  TransportOptions transport_options;
  transport_options.send_hello = true;
  transport_options.cork_reads = true;
  transport_options.wan = wan;
  const ClusterConfig& config = link->config_;
  auto connect = [&config](Transport& t) -> std::string {
    for (NodeId r = 0; r < config.n; ++r) {
      if (std::string err = t.connect(r, config.replicas[r]); !err.empty()) return err;
    }
    return "";
  };
  if (wan.enabled()) {
    link->own_transport_ =
        std::make_unique<Transport>(base, link->config_.n, *link->crypto_, transport_options, std::move(on_message));
    link->own_transport_->set_frame_filter(std::move(filter));
    link->transport_ = link->own_transport_.get();
    if (std::string err = connect(*link->transport_); !err.empty()) return err;
  } else {
    if (std::string err = join_shared(base, "pbft|" + config_path, link->config_.n, link->crypto_,
                                      transport_options, connect, std::move(on_message), std::move(filter),
                                      link->shared_);
        !err.empty()) {
      return err;
    }
    link->transport_ = link->shared_->transport.get();
  }
  ClientLink* raw = link.get();
  link->tick_ev_.reset(event_new(
      base, -1, EV_PERSIST, [](int, short, void* a) { static_cast<ClientLink*>(a)->on_timer(); }, raw));
  BFT_ASSERT(link->tick_ev_ != nullptr);
  event_priority_set(link->tick_ev_.get(), kPriorityIo);
  // The core counts 1 ms ticks; on_timer() delivers every elapsed one, so the timer itself may be coarser.
  // 5 ms keeps retransmission timing (100 ms and up) accurate while a process running many clients (the
  // closed-loop benchmark) does not wake up 1000 times a second per client.
  link->arm(kTickMs);
  link->last_tick_ns_ = clock_ns(CLOCK_MONOTONIC);
  out = std::move(link);
  return "";
}

ClientLink::~ClientLink() {
  tick_ev_.reset();
  if (shared_ != nullptr) {
    transport_->remove_identity(id_);
    std::lock_guard<std::mutex> lock(g_shared_mu);
    shared_.reset();  // the last client destroys the transport (under the lock: join_shared may be looking)
  }
  own_transport_.reset();
}

std::uint64_t ClientLink::seed() const {
  std::uint64_t seed = 0;
  if (getrandom(&seed, sizeof seed, 0) != static_cast<ssize_t>(sizeof seed)) seed = clock_ns(CLOCK_MONOTONIC) ^ id_;
  return seed;
}

void ClientLink::arm(std::uint32_t ms) {
  const timeval tv{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>((ms % 1000) * 1000)};
  BFT_ASSERT(event_add(tick_ev_.get(), &tv) == 0);
}

// One core tick per elapsed millisecond even when the timer fires late (as ReplicaRuntime does), so the
// retransmission timeout means what ClientOptions says.
void ClientLink::deliver_ticks() {
  const std::uint64_t now = clock_ns(CLOCK_MONOTONIC);
  const std::uint64_t due = (now - last_tick_ns_) / 1000000ull;
  if (due == 0) return;
  last_tick_ns_ += due * 1000000ull;
  on_ticks_(std::min<std::uint64_t>(due, 100));
}

// An idle client (a relay between two file operations, the gaps of a compile) would otherwise wake 200 times
// a second for nothing on a machine where every wake-up is taken from the replicas and the compiler.
void ClientLink::on_timer() {
  deliver_ticks();
  if (!slow_ && idle_ && idle_()) {
    slow_ = true;
    arm(kIdleTickMs);
  }
}

void ClientLink::wake() {
  if (!slow_) return;
  deliver_ticks();
  slow_ = false;
  arm(kTickMs);
}

// ---------------------------------------------------------------------------------------------------------
// ClientRuntime

std::string ClientRuntime::create(event_base* base, const std::string& config_path, NodeId id, ClientOptions options,
                                  std::unique_ptr<ClientRuntime>& out, const WanSpec& wan) {
  out.reset();
  std::unique_ptr<ClientRuntime> client(new ClientRuntime());
  ClientRuntime* raw = client.get();
  if (std::string err = ClientLink::create(
          base, config_path, id, wan,
          [raw](NodeId from, Message&& m) {
            raw->core_->on_message(from, m);
            raw->drain();
          },
          [raw](std::uint64_t due) {
            for (std::uint64_t i = 0; i < due; ++i) raw->core_->on_tick();
            raw->drain();
          },
          client->link_,
          // The replicas slower than the certificate answer requests that completed already: at most one of
          // every four replies with f = 1 and tentative execution, each a MAC and a decode saved.
          [raw](MsgType type, NodeId, std::uint64_t seq) {
            return type != MsgType::kReply || raw->core_ == nullptr || raw->core_->wants_reply(seq);
          });
      !err.empty()) {
    return err;
  }
  options.n = client->link_->config().n;
  options.f = client->link_->config().f;
  BFT_ASSERT(options.first_request_id > kHelloRequestId);
  client->core_ = std::make_unique<Client>(options, id, client->link_->crypto(), client->link_->seed());
  client->link_->set_idle([raw] { return raw->core_->in_flight() == 0; });
  out = std::move(client);
  return "";
}

// Nothing runs between the two resets (the loop is single-threaded), so no callback can reach the gone core.
ClientRuntime::~ClientRuntime() {
  core_.reset();
  link_.reset();
}

void ClientRuntime::drain() {
  if (draining_) return;  // a callback submitted: the loop below picks its effects up
  draining_ = true;
  for (;;) {
    std::vector<Completion> done = core_->take_completions();
    for (auto& completion : done) {
      auto it = callbacks_.find(completion.request_id);
      if (it == callbacks_.end()) continue;  // the core completes each id once; an unknown id is not ours
      Callback cb = std::move(it->second);
      callbacks_.erase(it);
      if (cb) cb(completion);
    }
    core_->take_first_replies();  // a non-speculating client waits for the certificate only
    Effects e = core_->take_effects();
    BFT_ASSERT(e.persist.empty());  // a client persists nothing
    for (const auto& s : e.sends) link_->transport().send(s);
    if (done.empty() && e.sends.empty()) break;
  }
  draining_ = false;
}

std::uint64_t ClientRuntime::submit(Bytes op, bool read_only, Callback done) {
  link_->wake();
  const std::uint64_t request_id = core_->submit(std::move(op), read_only);
  callbacks_[request_id] = std::move(done);
  drain();
  return request_id;
}

std::size_t ClientRuntime::in_flight() const { return core_->in_flight(); }
std::uint64_t ClientRuntime::retransmissions() const { return core_->stats().retransmissions; }
const ClientStats& ClientRuntime::stats() const { return core_->stats(); }

// ---------------------------------------------------------------------------------------------------------
// DirectClient

std::string DirectClient::create(event_base* base, const std::string& config_path, NodeId id,
                                 const ReplicaAddress& server, std::unique_ptr<DirectClient>& out, const WanSpec& wan) {
  out.reset();
  ::signal(SIGPIPE, SIG_IGN);
  std::unique_ptr<DirectClient> client(new DirectClient());
  client->id_ = id;
  std::unique_ptr<Crypto> crypto;
  if (std::string err = load_client_identity(config_path, id, client->config_, crypto); !err.empty()) return err;
  client->crypto_ = std::move(crypto);
  client->next_request_id_ = fresh_first_request_id();
  DirectClient* raw = client.get();
  TransportOptions transport_options;
  transport_options.send_hello = true;
  // Not corked: with one server and no agreement, 32 closed-loop clients corked into one write per read turn the
  // client and the server into two processes that take turns (measured: half the CPU per request but 5%
  // fewer ops/s); the baseline keeps what serves it best.
  transport_options.cork_reads = false;
  transport_options.wan = wan;
  Transport::OnMessage on_message = [raw](NodeId from, Message&& m) { raw->on_message(from, std::move(m)); };
  const ReplicaAddress addr = server.host.empty() ? client->config_.replicas[0] : server;
  auto connect = [&addr](Transport& t) { return t.connect(0, addr); };
  // Shared exactly as ClientLink shares the replicas' connections, so NO-REP gets the same transport.
  if (wan.enabled()) {
    client->own_transport_ = std::make_unique<Transport>(base, client->config_.n, *client->crypto_,
                                                         transport_options, std::move(on_message));
    client->transport_ = client->own_transport_.get();
    if (std::string err = connect(*client->transport_); !err.empty()) return err;
  } else {
    const std::string key = "norep|" + config_path + "|" + addr.host + ":" + std::to_string(addr.port);
    if (std::string err = join_shared(base, key, client->config_.n, client->crypto_, transport_options, connect,
                                      std::move(on_message), {}, client->shared_);
        !err.empty()) {
      return err;
    }
    client->transport_ = client->shared_->transport.get();
  }
  client->timer_ev_.reset(event_new(
      base, -1, EV_PERSIST, [](int, short, void* a) { static_cast<DirectClient*>(a)->on_timer(); }, raw));
  BFT_ASSERT(client->timer_ev_ != nullptr);
  const timeval every{0, 50 * 1000};
  BFT_ASSERT(event_add(client->timer_ev_.get(), &every) == 0);
  client->now_ms_ = clock_ns(CLOCK_MONOTONIC) / 1000000;
  out = std::move(client);
  return "";
}

DirectClient::~DirectClient() {
  timer_ev_.reset();
  if (shared_ != nullptr) {
    transport_->remove_identity(id_);
    std::lock_guard<std::mutex> lock(g_shared_mu);
    shared_.reset();
  }
  own_transport_.reset();
}

void DirectClient::send(const Request& r) {
  const Bytes frame = encode_frame(r, id_, 0, *crypto_);
  transport_->send_frame(0, frame.data(), frame.size());
}

std::uint64_t DirectClient::submit(Bytes op, bool read_only, Callback done) {
  Request r;
  r.client = id_;
  r.request_id = next_request_id_++;
  r.flags = read_only ? kRequestReadOnly : 0;
  r.replier = 0;
  r.op = std::move(op);
  // The same authenticator a PBFT client computes (one MAC per replica), so both clients cost the same.
  const Digest d = r.digest();
  r.authenticator.reserve(config_.n);
  for (NodeId i = 0; i < config_.n; ++i) r.authenticator.push_back(crypto_->mac(i, d.bytes));
  send(r);
  const std::uint64_t request_id = r.request_id;
  outstanding_[request_id] = Outstanding{std::move(r), std::move(done), clock_ns(CLOCK_MONOTONIC) / 1000000};
  return request_id;
}

void DirectClient::on_message(NodeId from, Message&& m) {
  const auto* reply = std::get_if<Reply>(&m);
  if (from != 0 || reply == nullptr || reply->client != id_ || (reply->flags & kReplyHasResult) == 0) return;
  auto it = outstanding_.find(reply->request_id);
  if (it == outstanding_.end()) return;  // late duplicate
  Completion completion;
  completion.request_id = reply->request_id;
  completion.result = reply->result;  // decode_frame checked it against result_digest
  completion.view = 0;
  completion.read_only = (reply->flags & kReplyReadOnly) != 0;
  Callback cb = std::move(it->second.done);
  outstanding_.erase(it);
  if (cb) cb(completion);
}

void DirectClient::on_timer() {
  now_ms_ = clock_ns(CLOCK_MONOTONIC) / 1000000;
  for (auto& [request_id, entry] : outstanding_) {
    if (now_ms_ - entry.sent_ms >= kRetransmitMs) {
      entry.sent_ms = now_ms_;
      ++retransmissions_;
      send(entry.request);
    }
  }
}

}  // namespace bftfs
