#include "relay/relay_daemon.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/buffer.h>

#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "common/assert.h"
#include "common/codec.h"
#include "common/log.h"
#include "protocol/messages.h"
#include "relay/relay_wire.h"
#include "runtime/client_runtime.h"
#include "os/clock.h"
#include "runtime/event_raii.h"
#include "runtime/loop_stop.h"
#include "relay/spec_client_runtime.h"
#include "runtime/status_file.h"
#include "os/unique_fd.h"
#include "services/fs/fs_codec.h"
#include "shim/envelope.h"

namespace bftfs {
namespace {

constexpr const char* kLog = "relay";

// A request of one mount that has not had its FINAL yet.
struct Pending {
  std::uint64_t backend_id = 0;  // the client library's id (SpecClientRuntime or DirectClient)
  bool report_first = false;     // the mount asked for FIRST
  bool first_seen = false;       // the library delivered a first reply (forwarded or not)
  bool first_sent = false;       // a FIRST frame went to the mount
  bool read_only = false;        // submitted with the read-only optimization allowed
  bool single_lookup = false;    // one LOOKUP op (counted when its final says ENOENT)
};

// What libevent hands a connection's callbacks: the daemon and the connection's id (a closed connection's id
// no longer resolves, so a late callback finds nothing).
struct ConnRef {
  void* impl = nullptr;  // RelayDaemon::Impl
  std::uint64_t conn_id = 0;
};

// What the relay remembers of one connection's FINALs, so that a SUBMIT depending on a request whose FINAL was
// already sent is judged by that FINAL (docs/RELAY.md, "Dependencies"): the status of each of the last `limit`
// FINALs, by tag. A SUBMIT that reuses a tag forgets the earlier request's status, because from then on a
// dependency on that tag names the new request. Bounded: at most `limit` entries, each a hash node and a queue
// slot (about 80 bytes).
class FinalMemory {
 public:
  explicit FinalMemory(std::size_t limit = 0) : limit_(limit) {}

  void record(std::uint64_t tag, relay::FinalStatus status) {
    const std::uint64_t serial = next_serial_++;
    by_tag_[tag] = Entry{status, serial};
    order_.emplace_back(tag, serial);
    while (order_.size() > limit_) {
      const auto [old_tag, old_serial] = order_.front();
      order_.pop_front();
      // A tag recorded again since (or forgotten) has another serial, or none: leave it.
      if (auto it = by_tag_.find(old_tag); it != by_tag_.end() && it->second.serial == old_serial) by_tag_.erase(it);
    }
    BFT_ASSERT(by_tag_.size() <= order_.size());
  }

  void forget(std::uint64_t tag) { by_tag_.erase(tag); }

  // The status of the latest FINAL sent for `tag`, unless it was forgotten.
  std::optional<relay::FinalStatus> find(std::uint64_t tag) const {
    auto it = by_tag_.find(tag);
    if (it == by_tag_.end()) return std::nullopt;
    return it->second.status;
  }

 private:
  struct Entry {
    relay::FinalStatus status = relay::FinalStatus::kCommitted;
    std::uint64_t serial = 0;  // which record() made it
  };
  std::size_t limit_ = 0;
  std::uint64_t next_serial_ = 0;
  std::unordered_map<std::uint64_t, Entry> by_tag_;
  std::deque<std::pair<std::uint64_t, std::uint64_t>> order_;  // (tag, serial) of the last `limit_` records
};

struct Conn {
  std::uint64_t id = 0;
  std::unique_ptr<ConnRef> ref;  // declared before bev: outlives it
  BufferEventPtr bev;
  bool hello_done = false;
  bool closing = false;      // closed: waiting for the late event to free it
  bool read_paused = false;  // too many requests in flight (its own, or the library's)
  std::map<std::uint64_t, Pending> pending;  // by tag
  FinalMemory finals;                        // the last FINALs sent, for dependencies on them
};

struct Counters {
  std::uint64_t connections_accepted = 0;
  std::uint64_t connections_refused = 0;  // over connections_max
  std::uint64_t submitted = 0;
  std::uint64_t completed = 0;  // FINAL committed or rolled back
  std::uint64_t first_sent = 0;
  std::uint64_t rollbacks_sent = 0;
  std::uint64_t refused = 0;     // FINAL refused
  std::uint64_t dependencies_failed = 0;  // SUBMITs answered "not executed" at once: a dependency's FINAL had
                                          // shown the FIRST it relied on wrong
  std::uint64_t cancelled = 0;   // CANCEL, or dropped with a disconnecting mount
  std::uint64_t orphaned = 0;    // results for requests nobody waits for any more
  std::uint64_t protocol_errors = 0;  // connections closed for a malformed frame or a protocol violation
  std::uint64_t slow_disconnects = 0;  // connections closed for not reading
  std::uint64_t bad_results = 0;  // results fs::decode_result rejected (never forwarded)
  std::uint64_t read_pauses = 0;  // a mount not read for a while: too many requests in flight
  // What the mounts ask for (docs/RELAY.md: the cost of a file operation in requests). Counted at SUBMIT, for
  // requests the relay sends on (not the refused ones).
  std::uint64_t sent_read_only = 0;  // submitted with the read-only optimization allowed
  std::uint64_t sent_ordered = 0;    // the others: each one a PBFT agreement (a NO-REP log append)
  std::uint64_t sent_compound = 0;   // requests with more than one op
  std::uint64_t ops_by_code[fs::kOpCodeMax + 1] = {};  // ops inside the sent requests, by op code
  std::uint64_t lookups_enoent = 0;  // final results of one-op LOOKUP requests that said ENOENT
};

// The name of an op code in STATUS keys ("ops_lookup"); codes are validated by the decoder.
const char* op_key(std::uint8_t code) {
  static constexpr const char* kNames[fs::kOpCodeMax + 1] = {
      "ops_unknown", "ops_lookup", "ops_getattr", "ops_setattr", "ops_read",     "ops_write",    "ops_create",
      "ops_remove",  "ops_mkdir",  "ops_rmdir",   "ops_rename",  "ops_link",     "ops_symlink",  "ops_readlink",
      "ops_readdir", "ops_statfs", "ops_fsync",   "ops_readdirplus", "ops_mknod", "ops_access",
      "ops_time",    "ops_fetch",  "ops_reserve", "ops_stage",   "ops_epoch",    "ops_stream_close"};
  BFT_ASSERT(code <= fs::kOpCodeMax);
  return kNames[code];
}

}  // namespace

struct RelayDaemon::Impl {
  RelayOptions options;
  ClusterConfig config;
  EventBasePtr base;
  std::unique_ptr<LoopStop> loop_stop;
  std::unique_ptr<SpecClientRuntime> spec_client;  // PBFT mode
  std::unique_ptr<DirectClient> norep_client;      // NO-REP mode
  ListenerPtr listener;
  bool socket_bound = false;
  EventPtr reap_ev;    // kPriorityLate: frees closed connections after every callback that may use them
  EventPtr resume_ev;  // kPriorityLate: reads mounts paused while the library was full
  EventPtr status_ev;  // rewrites the status file
  std::map<std::uint64_t, std::unique_ptr<Conn>> conns;
  std::vector<std::uint64_t> to_reap;
  std::uint64_t next_conn_id = 1;
  Counters counters;
  // The request bytes each library operation holds until its final event (also after the mount cancelled it).
  std::map<std::uint64_t, std::size_t> library_bytes_by_id;
  std::size_t library_bytes = 0;
  bool started = false;  // create() completed: the backend exists

  ~Impl() {
    // Connections first (their bufferevents belong to the base), then the listener and the socket file.
    conns.clear();
    listener.reset();
    if (socket_bound) ::unlink(options.socket_path.c_str());
    if (started && !options.status_path.empty()) write_status(false);
  }

  NodeId client_id() const { return options.id; }
  std::size_t in_flight_total() const {
    std::size_t n = 0;
    for (const auto& [id, conn] : conns) n += conn->pending.size();
    return n;
  }

  // ---- connections ----

  static void on_accept(evconnlistener*, evutil_socket_t fd, sockaddr*, int, void* arg) {
    static_cast<Impl*>(arg)->accept_conn(fd);
  }

  void accept_conn(evutil_socket_t fd) {
    if (conns.size() >= options.connections_max) {
      ++counters.connections_refused;
      LOG_WARN(kLog, "refusing a mount connection: %zu connections already", conns.size());
      ::close(fd);
      return;
    }
    auto conn = std::make_unique<Conn>();
    conn->id = next_conn_id++;
    conn->finals = FinalMemory(options.conn_finals_remembered);
    conn->bev.reset(bufferevent_socket_new(base.get(), fd, BEV_OPT_CLOSE_ON_FREE));
    if (conn->bev == nullptr) {
      LOG_ERROR(kLog, "bufferevent_socket_new failed");
      ::close(fd);
      return;
    }
    bufferevent_priority_set(conn->bev.get(), kPriorityIo);
    conn->ref = std::make_unique<ConnRef>(ConnRef{this, conn->id});
    bufferevent_setcb(conn->bev.get(), &Impl::on_read, nullptr, &Impl::on_conn_event, conn->ref.get());
    bufferevent_enable(conn->bev.get(), EV_READ | EV_WRITE);
    ++counters.connections_accepted;
    LOG_DEBUG(kLog, "mount connection %llu accepted", static_cast<unsigned long long>(conn->id));
    conns.emplace(conn->id, std::move(conn));
  }

  Conn* find_conn(std::uint64_t id) {
    auto it = conns.find(id);
    if (it == conns.end() || it->second->closing) return nullptr;
    return it->second.get();
  }

  static void on_read(bufferevent*, void* arg) {
    auto* ref = static_cast<ConnRef*>(arg);
    auto* self = static_cast<Impl*>(ref->impl);
    if (Conn* conn = self->find_conn(ref->conn_id)) self->process_input(*conn);
  }

  static void on_conn_event(bufferevent*, short what, void* arg) {
    auto* ref = static_cast<ConnRef*>(arg);
    auto* self = static_cast<Impl*>(ref->impl);
    Conn* conn = self->find_conn(ref->conn_id);
    if (conn == nullptr) return;
    if ((what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) != 0) self->close_conn(*conn, "disconnected");
  }

  // Closes a connection: its requests are cancelled (they may still execute); it is freed by the late event,
  // after every callback of this loop pass that might still hold it.
  void close_conn(Conn& conn, const std::string& why) {
    if (conn.closing) return;
    conn.closing = true;
    counters.cancelled += conn.pending.size();
    if (conn.pending.empty()) {
      LOG_DEBUG(kLog, "mount connection %llu closed (%s)", static_cast<unsigned long long>(conn.id), why.c_str());
    } else {
      LOG_INFO(kLog, "mount connection %llu closed (%s); %zu requests cancelled",
               static_cast<unsigned long long>(conn.id), why.c_str(), conn.pending.size());
    }
    conn.pending.clear();
    bufferevent_disable(conn.bev.get(), EV_READ | EV_WRITE);
    to_reap.push_back(conn.id);
    event_active(reap_ev.get(), EV_TIMEOUT, 0);
  }

  void protocol_error(Conn& conn, const std::string& why) {
    ++counters.protocol_errors;
    LOG_WARN(kLog, "mount connection %llu: %s", static_cast<unsigned long long>(conn.id), why.c_str());
    close_conn(conn, why);
  }

  static void on_reap(evutil_socket_t, short, void* arg) {
    auto* self = static_cast<Impl*>(arg);
    for (std::uint64_t id : self->to_reap) self->conns.erase(id);
    self->to_reap.clear();
  }

  void send(Conn& conn, const relay::RelayMsg& m) {
    if (conn.closing) return;
    // Judged before this frame is queued, so one frame of any size always fits a mount that keeps up.
    if (evbuffer_get_length(bufferevent_get_output(conn.bev.get())) > options.conn_output_bytes_max) {
      ++counters.slow_disconnects;
      LOG_WARN(kLog, "mount connection %llu does not read (over %zu bytes queued): disconnecting",
               static_cast<unsigned long long>(conn.id), options.conn_output_bytes_max);
      close_conn(conn, "not reading");
      return;
    }
    const Bytes frame = relay::encode_relay_frame(m);
    if (bufferevent_write(conn.bev.get(), frame.data(), frame.size()) != 0) close_conn(conn, "write failed");
  }

  // Every FINAL goes through here: the connection remembers its status for later dependencies.
  void send_final(Conn& conn, std::uint64_t tag, relay::FinalStatus status, Bytes result) {
    conn.finals.record(tag, status);
    send(conn, relay::Final{tag, status, std::move(result)});
  }

  void refuse(Conn& conn, std::uint64_t tag, const std::string& reason) {
    ++counters.refused;
    send_final(conn, tag, relay::FinalStatus::kRefused, Bytes(reason.begin(), reason.end()));
  }

  std::size_t library_in_flight() const { return options.norep ? norep_client->in_flight() : spec_client->in_flight(); }
  bool library_full() const {
    return library_in_flight() >= options.in_flight_max || library_bytes >= options.in_flight_bytes_max;
  }
  bool may_read(const Conn& conn) const { return conn.pending.size() < options.conn_in_flight_max && !library_full(); }

  // Decodes every complete frame in the connection's input, stopping when the mount or the library has too
  // many requests in flight (resumed by resume_if_paused when some complete).
  void process_input(Conn& conn) {
    evbuffer* in = bufferevent_get_input(conn.bev.get());
    while (!conn.closing) {
      if (!may_read(conn)) {
        if (!conn.read_paused) {
          conn.read_paused = true;
          ++counters.read_pauses;
          bufferevent_disable(conn.bev.get(), EV_READ);
        }
        return;
      }
      std::uint8_t len_bytes[relay::kFrameLengthBytes];
      if (evbuffer_copyout(in, len_bytes, sizeof len_bytes) != static_cast<ev_ssize_t>(sizeof len_bytes)) return;
      const std::uint32_t len = load_u32_le(len_bytes);
      if (const auto e = relay::check_frame_length(len); e != relay::RelayWireError::kOk) {
        protocol_error(conn, std::string("bad frame length: ") + std::string(relay::to_string(e)));
        return;
      }
      if (evbuffer_get_length(in) < relay::kFrameLengthBytes + len) return;
      evbuffer_drain(in, relay::kFrameLengthBytes);
      Bytes body(len);
      BFT_ASSERT(evbuffer_remove(in, body.data(), len) == static_cast<int>(len));
      relay::MountMsg msg;
      if (const auto e = relay::decode_mount_body(body, msg); e != relay::RelayWireError::kOk) {
        protocol_error(conn, std::string("malformed frame: ") + std::string(relay::to_string(e)));
        return;
      }
      on_frame(conn, std::move(msg));
    }
  }

  void resume_if_paused(Conn& conn) {
    if (!conn.read_paused || conn.closing || !may_read(conn)) return;
    conn.read_paused = false;
    bufferevent_enable(conn.bev.get(), EV_READ);
    process_input(conn);  // frames already buffered get no new read callback
  }

  void on_frame(Conn& conn, relay::MountMsg&& msg) {
    if (auto* hello = std::get_if<relay::Hello>(&msg)) {
      if (conn.hello_done) return protocol_error(conn, "a second HELLO");
      BFT_ASSERT(hello->version == relay::kRelayWireVersion);  // the decoder accepts no other
      conn.hello_done = true;
      const std::uint32_t n = options.norep ? 1 : config.n;
      const std::uint32_t f = options.norep ? 0 : config.f;
      send(conn, relay::HelloOk{relay::kRelayWireVersion, client_id(), n, f});
      return;
    }
    if (!conn.hello_done) return protocol_error(conn, "a frame before HELLO");
    if (auto* submit = std::get_if<relay::Submit>(&msg)) return on_submit(conn, std::move(*submit));
    if (auto* cancel = std::get_if<relay::Cancel>(&msg)) {
      if (conn.pending.erase(cancel->tag) > 0) ++counters.cancelled;
      return;  // a cancelled request stays in the library until it executes: nothing to resume yet
    }
    BFT_ASSERT(std::holds_alternative<relay::StatusQuery>(msg));
    send(conn, relay::StatusReply{status_text()});
  }

  void on_submit(Conn& conn, relay::Submit&& submit) {
    if (conn.pending.count(submit.tag) != 0) {
      return protocol_error(conn, "SUBMIT reuses tag " + std::to_string(submit.tag) + " of a request in flight");
    }
    fs::Request req;
    std::vector<SpecDependency> deps;
    bool dependency_failed = false;
    const std::string why = admit(conn, submit, req, deps, dependency_failed);
    // From here on the tag names this request: a dependency on it must not find an earlier one's FINAL.
    conn.finals.forget(submit.tag);
    if (!why.empty()) return refuse(conn, submit.tag, why);
    if (dependency_failed) {
      // The shim would make it a no-op (its predicate names a result the replicas logged differently): the
      // relay gives the same answer at once, without a round of agreement.
      ++counters.dependencies_failed;
      LOG_DEBUG(kLog, "mount connection %llu: tag %llu not executed: a dependency's FIRST was wrong",
                static_cast<unsigned long long>(conn.id), static_cast<unsigned long long>(submit.tag));
      return send_final(conn, submit.tag, relay::FinalStatus::kRolledBack, Bytes{});
    }
    Pending request;
    request.report_first = (submit.flags & relay::kFlagReportFirst) != 0;
    request.read_only = (submit.flags & relay::kFlagReadOnly) != 0;
    request.single_lookup = req.ops.size() == 1 && req.ops[0].code == fs::OpCode::kLookup;
    count_sent(req, request.read_only);
    send_to_library(conn, std::move(submit), deps, request);
  }

  // Why a SUBMIT must be refused, or "" when it may go to the library: its fs request must decode (into
  // `req`), a read-only one must not write, its dependencies must be known (those in flight go into `deps`
  // as predicates; `dependency_failed` says one of them already failed), and it must fit one operation.
  std::string admit(const Conn& conn, const relay::Submit& submit, fs::Request& req,
                    std::vector<SpecDependency>& deps, bool& dependency_failed) {
    if (const auto e = fs::decode_request(submit.request, req); e != fs::FsDecodeError::kOk) {
      return "malformed fs request: " + std::string(fs::to_string(e));
    }
    const bool read_only = (submit.flags & relay::kFlagReadOnly) != 0;
    if (read_only) {
      for (const fs::Op& op : req.ops) {
        if (!fs::is_read_only(op.code)) return "read-only flag on a request that writes";
      }
    }
    if (std::string why = dependencies(conn, submit, read_only, deps, dependency_failed); !why.empty()) return why;
    static_assert(relay::kDepsMax <= shim::kDependenciesMax);
    // The library sends the request as one PBFT operation (in PBFT mode inside the shim's envelope, with one
    // predicate per dependency), and an operation is at most kOpBytesMax: the client library asserts it. The
    // socket's own limit (kSubmitRequestBytesMax) is larger, so a request that fits the frame may still not
    // fit an operation (a compound of two kIoBytesMax writes does not): refuse it here, never crash on it.
    const std::size_t op_bytes =
        options.norep ? submit.request.size()
                      : shim::kRequestHeaderBytes + deps.size() * shim::kDependencyBytes + submit.request.size();
    if (op_bytes > kOpBytesMax) {
      return "request too large: " + std::to_string(op_bytes) + " bytes as one operation, " + "the limit is " +
             std::to_string(kOpBytesMax);
    }
    return "";
  }

  // Dependencies (docs/RELAY.md, "Dependencies"): each tag names the latest earlier SUBMIT of this connection
  // with that tag, and the mount's prediction for it is the FIRST it was sent. In flight, the prediction goes
  // to the replicas as a predicate (it must be an ordered request whose FIRST was sent). Final, the FINAL's
  // status decides: 0 says the prediction was the consensus (or the mount can only know the consensus), so the
  // dependency holds and is dropped -- keeping it could only hurt: the shim's per-client log may have truncated
  // the request by now, and the predicate would then fail although it holds; 1 says the prediction was wrong
  // or the request did not execute, so `dependency_failed`; 2 (refused) and a tag the connection does not
  // remember are refusals. In NO-REP mode a dependency in flight needs nothing: one server executes the
  // requests in submission order and FIRST = FINAL. Returns why the SUBMIT must be refused, or "".
  std::string dependencies(const Conn& conn, const relay::Submit& submit, bool read_only,
                           std::vector<SpecDependency>& deps, bool& dependency_failed) {
    std::set<std::uint64_t> seen;
    for (std::uint64_t dep : submit.deps) {
      if (!seen.insert(dep).second) continue;
      const std::string name = "depends on tag " + std::to_string(dep);
      if (auto it = conn.pending.find(dep); it != conn.pending.end()) {
        if (options.norep) continue;
        if (it->second.read_only) return name + ", a read-only request in flight";
        // The mount can only have acted on a first reply it was sent (the library's own may have been
        // withheld from the mount as undecodable).
        if (!it->second.first_sent) return name + ", in flight, whose first reply it was not sent";
        BFT_ASSERT(it->second.first_seen);
        deps.push_back(SpecDependency{it->second.backend_id, std::nullopt});
        continue;
      }
      const std::optional<relay::FinalStatus> status = conn.finals.find(dep);
      if (!status) {
        return name + ", which is neither in flight nor among this connection's last " +
               std::to_string(options.conn_finals_remembered) + " FINALs (never submitted, cancelled, or forgotten)";
      }
      if (*status == relay::FinalStatus::kRefused) return name + ", which was refused";
      if (*status == relay::FinalStatus::kRolledBack) dependency_failed = true;
    }
    // §3.3: the shim declines a predicated read-only request, so the library never sends one.
    if (read_only && !deps.empty()) return "a read-only request cannot depend on one in flight";
    return "";
  }

  // What the mounts ask for (Counters: sent_*, ops_by_code), counted for every request sent on.
  void count_sent(const fs::Request& req, bool read_only) {
    ++(read_only ? counters.sent_read_only : counters.sent_ordered);
    if (req.ops.size() > 1) ++counters.sent_compound;
    for (const fs::Op& op : req.ops) ++counters.ops_by_code[static_cast<std::uint8_t>(op.code)];
  }

  // Hands an admitted request to the client library (or the NO-REP client), which reports back to
  // on_spec_event / on_norep_done by (connection, tag).
  void send_to_library(Conn& conn, relay::Submit&& submit, const std::vector<SpecDependency>& deps,
                       const Pending& request) {
    const std::uint64_t conn_id = conn.id;
    const std::uint64_t tag = submit.tag;
    const std::size_t size = submit.request.size();
    ++counters.submitted;
    // The entry exists before submit. Submitting may run other operations' callbacks (the library drains its
    // events), which may close this connection; so the entry is looked up again afterwards, not held.
    conn.pending.emplace(tag, request);
    std::uint64_t backend_id = 0;
    if (options.norep) {
      backend_id = norep_client->submit(std::move(submit.request), request.read_only,
                                  [this, conn_id, tag](const Completion& done) { on_norep_done(conn_id, tag, done); });
    } else {
      backend_id = spec_client->submit(std::move(submit.request), deps, request.read_only,
                                [this, conn_id, tag](const SpecEvent& e) { on_spec_event(conn_id, tag, e); });
    }
    hold_bytes(backend_id, size);
    if (Conn* still = find_conn(conn_id)) {
      if (auto it = still->pending.find(tag); it != still->pending.end()) it->second.backend_id = backend_id;
    }
  }

  void hold_bytes(std::uint64_t backend_id, std::size_t size) {
    BFT_ASSERT(library_bytes_by_id.emplace(backend_id, size).second);
    library_bytes += size;
  }

  // A library operation produced its final event: its bytes are free, and mounts paused for the library's
  // sake may be read again.
  void release_bytes(std::uint64_t backend_id) {
    auto it = library_bytes_by_id.find(backend_id);
    BFT_ASSERT(it != library_bytes_by_id.end());
    BFT_ASSERT(library_bytes >= it->second);
    library_bytes -= it->second;
    library_bytes_by_id.erase(it);
    // Deferred to the late event: resuming reads frames and submits, which must not happen while this
    // completion's own connection is being updated.
    event_active(resume_ev.get(), EV_TIMEOUT, 0);
  }

  static void on_resume(evutil_socket_t, short, void* arg) {
    auto* self = static_cast<Impl*>(arg);
    // Resuming submits, which may run callbacks that close connections (marked, not erased: safe to iterate).
    for (auto& [id, conn] : self->conns) {
      if (self->library_full()) return;
      self->resume_if_paused(*conn);
    }
  }

  // The pending entry a library callback is for, or null when the mount cancelled it or went away.
  Pending* route(std::uint64_t conn_id, std::uint64_t tag, std::uint64_t backend_id, Conn*& conn) {
    conn = find_conn(conn_id);
    if (conn == nullptr) return nullptr;
    auto it = conn->pending.find(tag);
    // The tag may have been cancelled and reused for a later request: match the library's id too.
    if (it == conn->pending.end() || it->second.backend_id != backend_id) return nullptr;
    return &it->second;
  }

  // True when `result` is a file-service result we may forward; counts and logs one that is not. A bad first
  // reply is one replica's (possibly Byzantine) word: a warning. A bad consensus result is our bug: an error.
  bool result_ok(const Bytes& result, const char* what, bool consensus) {
    fs::Result r;
    const auto e = fs::decode_result(result, r);
    if (e == fs::FsDecodeError::kOk) return true;
    ++counters.bad_results;
    const auto reason = fs::to_string(e);
    if (consensus) {
      LOG_ERROR(kLog, "%s result does not decode (%.*s): not forwarded", what, static_cast<int>(reason.size()),
                reason.data());
    } else {
      LOG_WARN(kLog, "%s result does not decode (%.*s): not forwarded", what, static_cast<int>(reason.size()),
               reason.data());
    }
    return false;
  }

  void finish(Conn& conn, std::uint64_t tag, relay::FinalStatus status, Bytes result) {
    if (auto it = conn.pending.find(tag); it != conn.pending.end() && it->second.single_lookup &&
                                          status != relay::FinalStatus::kRefused) {
      fs::Result r;  // small: one LOOKUP's result (already validated by result_ok)
      if (fs::decode_result(result, r) == fs::FsDecodeError::kOk && r.outcome == fs::Outcome::kOpFailed &&
          r.stop < r.results.size() && r.results[r.stop].err == fs::err::kNoEnt) {
        ++counters.lookups_enoent;
      }
    }
    conn.pending.erase(tag);
    if (status == relay::FinalStatus::kRefused) {
      ++counters.refused;
    } else {
      ++counters.completed;
      if (status == relay::FinalStatus::kRolledBack) ++counters.rollbacks_sent;
    }
    send_final(conn, tag, status, std::move(result));
    // Reading the mount again waits for the late event (release_bytes armed it): resuming here would decode
    // and submit from inside the library's callback, under the feet of whoever is iterating its events.
  }

  void on_spec_event(std::uint64_t conn_id, std::uint64_t tag, const SpecEvent& event) {
    if (event.kind != SpecEventKind::kFirst) release_bytes(event.id);
    Conn* conn = nullptr;
    Pending* request = route(conn_id, tag, event.id, conn);
    if (request == nullptr) {
      if (event.kind != SpecEventKind::kFirst) ++counters.orphaned;
      return;
    }
    if (event.kind == SpecEventKind::kFirst) {
      request->first_seen = true;
      if (!request->report_first || event.status != shim::ShimStatus::kExecuted) return;
      if (!result_ok(event.result, "first", false)) return;
      request->first_sent = true;
      ++counters.first_sent;
      send(*conn, relay::First{tag, event.from, event.result});
      return;
    }
    if (event.status != shim::ShimStatus::kExecuted) {
      // A dependency's prediction was wrong, so the shim executed a no-op: nothing to report but "resubmit".
      return finish(*conn, tag, relay::FinalStatus::kRolledBack, Bytes{});
    }
    if (!result_ok(event.result, "consensus", true)) {
      const std::string why = "the replicas' consensus result does not decode (a bug; see the relay log)";
      return finish(*conn, tag, relay::FinalStatus::kRefused, Bytes(why.begin(), why.end()));
    }
    // A rollback matters to the mount only if it saw the first reply; otherwise the result is simply the result.
    const bool rolled_back = event.kind == SpecEventKind::kRollback && request->first_sent;
    finish(*conn, tag, rolled_back ? relay::FinalStatus::kRolledBack : relay::FinalStatus::kCommitted, event.result);
  }

  void on_norep_done(std::uint64_t conn_id, std::uint64_t tag, const Completion& done) {
    release_bytes(done.request_id);
    Conn* conn = nullptr;
    Pending* request = route(conn_id, tag, done.request_id, conn);
    if (request == nullptr) {
      ++counters.orphaned;
      return;
    }
    if (!result_ok(done.result, "NO-REP", true)) {
      const std::string why = "the NO-REP server's result does not decode (a bug; see the relay log)";
      return finish(*conn, tag, relay::FinalStatus::kRefused, Bytes(why.begin(), why.end()));
    }
    // One server, one reply: FIRST and FINAL carry the same result.
    if (request->report_first) {
      ++counters.first_sent;
      send(*conn, relay::First{tag, 0, done.result});
    }
    finish(*conn, tag, relay::FinalStatus::kCommitted, done.result);
  }

  // ---- status ----

  std::uint64_t retransmissions() const {
    return options.norep ? norep_client->retransmissions() : spec_client->client_stats().retransmissions;
  }

  std::string trusted_replicas() const {
    if (options.norep) return "0";
    std::string s;
    for (NodeId r = 0; r < config.n; ++r) {
      if (!spec_client->trusts(r)) continue;
      if (!s.empty()) s += ",";
      s += std::to_string(r);
    }
    return s.empty() ? "-" : s;
  }

  std::string status_text() const {
    std::ostringstream out;
    out << "mode " << (options.norep ? "norep" : "pbft") << "\n"
        << "client_id " << client_id() << "\n"
        << "n " << (options.norep ? 1 : config.n) << "\n"
        << "f " << (options.norep ? 0 : config.f) << "\n"
        << "connections " << conns.size() << "\n"
        << "in_flight " << in_flight_total() << "\n"
        << "library_in_flight " << library_in_flight() << "\n"
        << "library_bytes " << library_bytes << "\n"
        << "submitted " << counters.submitted << "\n"
        << "completed " << counters.completed << "\n"
        << "first_sent " << counters.first_sent << "\n"
        << "rollbacks " << counters.rollbacks_sent << "\n"
        << "refused " << counters.refused << "\n"
        << "dependencies_failed " << counters.dependencies_failed << "\n"
        << "cancelled " << counters.cancelled << "\n"
        << "retransmissions " << retransmissions() << "\n"
        << "replicas_trusted " << trusted_replicas() << "\n"
        << "protocol_errors " << counters.protocol_errors << "\n"
        << "slow_disconnects " << counters.slow_disconnects << "\n"
        << "bad_results " << counters.bad_results << "\n"
        << "read_pauses " << counters.read_pauses << "\n"
        << "sent_read_only " << counters.sent_read_only << "\n"
        << "sent_ordered " << counters.sent_ordered << "\n"
        << "sent_compound " << counters.sent_compound << "\n"
        << "lookups_enoent " << counters.lookups_enoent << "\n";
    for (std::uint8_t code = 1; code <= fs::kOpCodeMax; ++code) {
      out << op_key(code) << " " << counters.ops_by_code[code] << "\n";
    }
    if (!options.norep) {
      out << "reads_ordered " << spec_client->stats().reads_ordered << "\n"
          << "read_only_fallbacks " << spec_client->client_stats().read_only_fallbacks << "\n"
          << "resent_new_view " << spec_client->client_stats().resent_new_view << "\n";
      for (NodeId r = 0; r < config.n; ++r) {
        out << "first_compared_" << r << " " << spec_client->first_compared(r) << "\n"
            << "first_mismatches_" << r << " " << spec_client->first_mismatched(r) << "\n";
      }
    }
    return out.str();
  }

  void write_status(bool running) {
    JsonObject status;
    status.add("pid", static_cast<std::uint64_t>(::getpid()))
        .add("running", running)
        .add("mode", options.norep ? "norep" : "pbft")
        .add("client_id", static_cast<std::uint64_t>(client_id()))
        .add("socket", options.socket_path)
        .add("connections", static_cast<std::uint64_t>(conns.size()))
        .add("in_flight", static_cast<std::uint64_t>(in_flight_total()))
        .add("submitted", counters.submitted)
        .add("completed", counters.completed)
        .add("refused", counters.refused)
        .add("retransmissions", retransmissions())
        .add("replicas_trusted", trusted_replicas())
        .add("protocol_errors", counters.protocol_errors)
        .add("sent_read_only", counters.sent_read_only)
        .add("sent_ordered", counters.sent_ordered)
        .add("sent_compound", counters.sent_compound)
        .add("lookups_enoent", counters.lookups_enoent)
        .add("updated_unix_ms", realtime_ns() / 1000000);
    for (std::uint8_t code = 1; code <= fs::kOpCodeMax; ++code) status.add(op_key(code), counters.ops_by_code[code]);
    if (std::string err = write_file_atomically(options.status_path, status.str() + "\n"); !err.empty()) {
      LOG_WARN(kLog, "status file: %s", err.c_str());
    }
  }

  static void on_status_timer(evutil_socket_t, short, void* arg) { static_cast<Impl*>(arg)->write_status(true); }

  // ---- set-up ----

  // Everything create() promises: the cluster configuration, the event loop, the client library (or the
  // NO-REP client), the late events, the socket and the status timer. Returns "" or an error.
  std::string start() {
    if (std::string err = load_cluster(options.config_path, config); !err.empty()) return err;
    base = make_event_base(options.wan.enabled());
    if (base == nullptr) return "cannot create an event base";
    loop_stop = std::make_unique<LoopStop>(base.get());
    if (options.handle_signals) loop_stop->handle_signals();
    if (std::string err = start_backend(); !err.empty()) return err;
    reap_ev.reset(event_new(base.get(), -1, 0, &Impl::on_reap, this));
    BFT_ASSERT(reap_ev != nullptr);
    event_priority_set(reap_ev.get(), kPriorityLate);
    resume_ev.reset(event_new(base.get(), -1, 0, &Impl::on_resume, this));
    BFT_ASSERT(resume_ev != nullptr);
    event_priority_set(resume_ev.get(), kPriorityLate);
    if (std::string err = bind_socket(); !err.empty()) return err;
    if (!options.status_path.empty()) {
      status_ev.reset(event_new(base.get(), -1, EV_PERSIST, &Impl::on_status_timer, this));
      BFT_ASSERT(status_ev != nullptr);
      const timeval tv{static_cast<time_t>(options.status_interval_ms / 1000),
                       static_cast<suseconds_t>((options.status_interval_ms % 1000) * 1000)};
      BFT_ASSERT(event_add(status_ev.get(), &tv) == 0);
    }
    LOG_INFO(kLog, "relay client %u (%s) listening on %s", options.id, options.norep ? "NO-REP" : "PBFT",
             options.socket_path.c_str());
    started = true;
    return "";
  }

  // The client the requests go through: the PBFT-CS library, or in NO-REP mode the direct client of the server.
  std::string start_backend() {
    if (options.norep) {
      return DirectClient::create(base.get(), options.config_path, options.id, options.norep_server, norep_client,
                                  options.wan);
    }
    SpecClientOptions spec_options;
    spec_options.client.first_request_id = fresh_first_request_id();
    spec_options.client.window = options.window;
    spec_options.speculate = options.speculate;
    spec_options.failure_permille_max = options.distrust_above_permille;
    spec_options.failure_window = options.distrust_window;
    return SpecClientRuntime::create(base.get(), options.config_path, options.id, spec_options, spec_client,
                                     options.wan);
  }

  // Binds and listens on the Unix socket. A socket file nobody accepts on (a relay that died) is replaced; a
  // live one is an error, so two relays never fight over one path.
  std::string bind_socket() {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (options.socket_path.empty() || options.socket_path.size() >= sizeof addr.sun_path) {
      return "socket path must be 1.." + std::to_string(sizeof addr.sun_path - 1) + " bytes: '" +
             options.socket_path + "'";
    }
    std::memcpy(addr.sun_path, options.socket_path.c_str(), options.socket_path.size() + 1);
    struct stat st{};
    if (::lstat(options.socket_path.c_str(), &st) == 0) {
      if (!S_ISSOCK(st.st_mode)) return options.socket_path + " exists and is not a socket";
      UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
      if (probe.valid() && ::connect(probe.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
        return "another relay is listening on " + options.socket_path;
      }
      ::unlink(options.socket_path.c_str());
    }
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) return std::string("socket: ") + std::strerror(errno);
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      return "bind " + options.socket_path + ": " + std::strerror(errno);
    }
    socket_bound = true;
    if (::chmod(options.socket_path.c_str(), options.socket_mode) != 0) {
      return "chmod " + options.socket_path + ": " + std::strerror(errno);
    }
    listener.reset(evconnlistener_new(base.get(), &Impl::on_accept, this, LEV_OPT_CLOSE_ON_FREE, 128, fd.get()));
    if (listener == nullptr) return "listen " + options.socket_path + ": " + std::strerror(errno);
    fd.release();  // the listener owns it now
    return "";
  }
};

RelayDaemon::RelayDaemon(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RelayDaemon::~RelayDaemon() = default;

std::string RelayDaemon::create(const RelayOptions& options, std::unique_ptr<RelayDaemon>& out) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  if (std::string err = impl->start(); !err.empty()) return err;
  out.reset(new RelayDaemon(std::move(impl)));
  return "";
}

void RelayDaemon::run() {
  // The status file says "running" only once the socket accepts: readiness checks poll it.
  if (!impl_->options.status_path.empty()) impl_->write_status(true);
  // LoopStop's event is always pending, so the loop returns only when it breaks it.
  while (!impl_->loop_stop->requested()) {
    if (event_base_loop(impl_->base.get(), 0) != 0) break;
  }
  LOG_INFO(kLog, "relay stopping");
}

void RelayDaemon::stop() { impl_->loop_stop->request(); }

std::string RelayDaemon::status_text() const { return impl_->status_text(); }

}  // namespace bftfs
