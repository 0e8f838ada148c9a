#include "os/clock.h"
#include "norep/norep_server.h"

#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <unordered_map>

#include "common/assert.h"
#include "common/log.h"
#include "storage/data_dir_lock.h"
#include "runtime/loop_stop.h"
#include "runtime/service_factory.h"
#include "runtime/status_file.h"

namespace bftfs {
namespace {

constexpr NodeId kServerId = 0;
constexpr std::uint64_t kCheckpointInterval = 128;  // = ReplicaOptions::checkpoint_interval's default

}  // namespace

struct NorepServer::Impl {
  NorepOptions options;
  ClusterConfig config;
  DataDirLock lock;   // released last
  EventBasePtr base;
  std::unique_ptr<Crypto> crypto;
  ServiceStack stack;       // the file service on its disk store (<data>/fs), or a small in-memory service
  Service* service = nullptr;  // stack.top()
  std::unique_ptr<Wal> wal;
  std::unique_ptr<Transport> transport;
  std::unique_ptr<LoopStop> stopper;
  EventPtr status_ev;
  std::string status_path;

  struct ClientEntry {
    std::uint64_t last_request_id = 0;
    Reply last_reply;
  };
  std::unordered_map<NodeId, ClientEntry> clients;
  std::uint64_t seq = 0;
  std::vector<Send> pending;
  std::atomic<std::uint64_t> executed{0};
  std::uint64_t read_only = 0;
  std::uint64_t duplicates = 0;
  std::uint64_t ignored = 0;  // messages other than Request, or a Request naming another client
  std::uint64_t flushes = 0;
  std::uint64_t checkpoints = 0;
  bool has_store = false;  // the service checkpoints to its own disk store (fs)
  std::uint64_t last_checkpoint = 0;  // seq of the service's newest checkpoint

  Reply run_request(const Request& r, std::uint64_t timestamp_ns, bool& changed) {
    Reply reply;
    reply.view = 0;
    reply.client = r.client;
    reply.request_id = r.request_id;
    changed = false;
    if (r.read_only() && service->execute_read_only(r.client, r.op, reply.result)) {
      reply.flags = kReplyHasResult | kReplyReadOnly;
      ++read_only;
    } else {
      ExecContext ctx;
      ctx.seq = ++seq;
      ctx.client = r.client;
      ctx.request_id = r.request_id;
      ctx.timestamp_ns = timestamp_ns;
      reply.result = service->execute(ctx, r.op);
      service->commit_through(ctx.seq);  // no rollback ever: drop undo state at once
      reply.flags = kReplyHasResult;
      changed = true;
    }
    reply.result_digest = digest_of(reply.result);
    return reply;
  }

  void on_message(NodeId from, Message&& m) {
    auto* r = std::get_if<Request>(&m);
    if (r == nullptr || r->client != from) {
      ++ignored;
      return;
    }
    ClientEntry& entry = clients[from];
    if (r->request_id < entry.last_request_id) {
      ++duplicates;
      return;
    }
    if (r->request_id == entry.last_request_id && entry.last_request_id != 0) {
      ++duplicates;  // retransmission: answer again from the table, never execute twice
      pending.push_back(Send{from, entry.last_reply});
    } else {
      const std::uint64_t timestamp_ns = realtime_ns();
      bool changed = false;
      Reply reply = run_request(*r, timestamp_ns, changed);
      if (changed && wal != nullptr) {
        PrePrepareRecord rec;
        rec.view = 0;
        rec.seq = seq;
        rec.batch.timestamp_ns = timestamp_ns;
        rec.batch.requests.push_back(std::move(*r));
        wal->append(rec);
      }

      if ((reply.flags & kReplyReadOnly) == 0) {
        entry.last_request_id = reply.request_id;
        entry.last_reply = reply;
      }
      executed.fetch_add(1, std::memory_order_relaxed);
      pending.push_back(Send{from, std::move(reply)});
    }
    // Bound a pass under a flood of requests, and take each checkpoint at its boundary as replicas do (one read
    // may bring hundreds of requests; a pass-end checkpoint alone would cover them all at once).
    if (pending.size() >= 4096 || (has_store && seq - last_checkpoint >= kCheckpointInterval)) flush();
  }

  // Every kCheckpointInterval executed requests the service takes a durable checkpoint, as a replica does every
  // K = 128 sequence numbers (protocol/replica.h): for the file service that is the disk store's index version
  // (fdatasync of its data and index, docs/FILESERVICE.md §6), the same work per checkpoint as a replica's.
  // It runs at the end of a pass, after the log's sync and the replies, so every request the checkpoint covers
  // is in the durable log and answered. A durable server then logs a StableRecord, so the log may drop what the
  // checkpoint covers (storage/wal.h); the duplicate detection of a restarted server therefore covers the
  // requests since its last checkpoint (like an NFS server's duplicate request cache, per boot).
  // Precondition of Service::checkpoint: nothing past seq is executed -- true between requests here.
  void maybe_checkpoint() {
    if (!has_store || seq - last_checkpoint < kCheckpointInterval) return;
    const CheckpointId id = service->checkpoint(seq);
    BFT_ASSERT(id.seq == seq);
    service->discard_checkpoints_below(seq);
    last_checkpoint = seq;
    ++checkpoints;
    if (wal != nullptr) wal->append(StableRecord{seq, id.digest});
  }

  // After every loop pass (run()): the group-commit boundary.
  void flush() {
    if (pending.empty()) {
      maybe_checkpoint();
      return;
    }
    ++flushes;
    if (wal != nullptr && wal->dirty()) wal->sync();  // one fdatasync for the whole pass, before any reply
    transport->cork();
    for (const auto& s : pending) transport->send(s);
    transport->uncork();
    pending.clear();
    maybe_checkpoint();
    if (wal != nullptr) wal->maintain();  // log housekeeping after the replies (storage/wal.h)
  }

  // Re-executes the durable log after a restart (durable mode only), from the service's recovered checkpoint:
  // requests at or below it are in the checkpoint already (the log may still hold them until it compacts).
  std::string replay(const std::vector<PersistRecord>& records) {
    const std::uint64_t from = service->recovered_checkpoint().seq;
    seq = from;
    last_checkpoint = from;
    for (const auto& rec : records) {
      if (std::holds_alternative<StableRecord>(rec)) continue;  // the checkpoint it names is the service's
      const auto* pp = std::get_if<PrePrepareRecord>(&rec);
      if (pp == nullptr || pp->batch.requests.size() != 1) return "NO-REP log holds a record it never writes";
      if (pp->seq <= from) continue;
      if (pp->seq != seq + 1) return "NO-REP log skips from " + std::to_string(seq) + " to " + std::to_string(pp->seq);
      const Request& r = pp->batch.requests[0];
      ExecContext ctx;
      ctx.seq = pp->seq;
      ctx.client = r.client;
      ctx.request_id = r.request_id;
      ctx.timestamp_ns = pp->batch.timestamp_ns;
      seq = pp->seq;
      Reply reply;
      reply.client = r.client;
      reply.request_id = r.request_id;
      reply.flags = kReplyHasResult;
      reply.result = service->execute(ctx, r.op);
      service->commit_through(ctx.seq);
      reply.result_digest = digest_of(reply.result);
      ClientEntry& entry = clients[r.client];
      entry.last_request_id = r.request_id;
      entry.last_reply = std::move(reply);
      maybe_checkpoint();
    }
    return "";
  }

  void write_status(bool running) {
    const TransportStats& ts = transport->stats();
    JsonObject net;
    net.add("frames_received", ts.frames_received)
        .add("frames_sent", ts.frames_sent)
        .add("frames_rejected", ts.frames_rejected)
        .add("connections", static_cast<std::uint64_t>(transport->connection_count()))
        .add("wan", options.transport.wan.describe())
        .add("frames_delayed", ts.frames_delayed)
        .add("delay_dropped", ts.delay_dropped);
    JsonObject o;
    o.add("role", "norep")
        .add("id", static_cast<std::uint64_t>(kServerId))
        .add("pid", static_cast<std::uint64_t>(getpid()))
        .add("running", running)
        .add("service", options.service)
        .add("durable", options.durable)
        .add("store", has_store ? "disk" : "memory")
        .add("checkpoints", checkpoints)
        .add("view", static_cast<std::uint64_t>(0))
        .add("primary", static_cast<std::uint64_t>(0))
        .add("last_executed", seq)
        .add("last_committed", seq)
        .add("stable_checkpoint", static_cast<std::uint64_t>(0))
        .add("requests_executed", executed.load())
        .add("read_only_executed", read_only)
        .add("duplicates", duplicates)
        .add("ignored", ignored)
        .add("flushes", flushes)
        .add("wal_syncs", wal ? wal->stats().syncs : 0)
        .add("wal_direct_writes", wal ? wal->stats().direct_writes : 0)
        .add("updated_unix_ms", realtime_ns() / 1000000)
        .add("net", net);
    if (std::string err = write_file_atomically(status_path, o.str() + "\n"); !err.empty()) {
      LOG_WARN("norep", "status: %s", err.c_str());
    }
  }
};

NorepServer::NorepServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NorepServer::~NorepServer() {
  if (impl_ == nullptr) return;
  impl_->status_ev.reset();
  impl_->stopper.reset();
  impl_->transport.reset();
}

std::string NorepServer::create(const NorepOptions& options, std::unique_ptr<NorepServer>& out) {
  out.reset();
  ::signal(SIGPIPE, SIG_IGN);
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  m.options = options;
  if (std::string err = load_cluster(options.config_path, m.config); !err.empty()) return err;
  SecretKeys secret;
  if (std::string err = load_secret(secret_path_for(options.config_path, kServerId), secret); !err.empty()) return err;
  m.crypto = make_crypto(m.config, kServerId, secret);
  if (m.crypto == nullptr) return "cannot build the crypto context of the server";
  if (std::string err = m.lock.acquire(options.data_dir); !err.empty()) return err;
  m.status_path = options.data_dir + "/status.json";
  // The same service stack a replica runs, minus the shim (the relay sends NO-REP plain requests): the file
  // service keeps its state on disk in <data>/fs, so NO-REP and PBFT pay for the same store.
  if (std::string err = make_service_stack(options.service, nullptr, options.data_dir, false, 1, m.stack);
      !err.empty()) {
    return err;
  }
  m.service = m.stack.top();
  m.has_store = options.service == "fs";
  m.seq = m.last_checkpoint = m.service->recovered_checkpoint().seq;
  if (options.durable) {
    std::vector<PersistRecord> records;
    if (std::string err = Wal::open(options.data_dir + "/wal", options.wal, m.wal, records); !err.empty()) return err;
    if (std::string err = m.replay(records); !err.empty()) return err;
    LOG_INFO("norep", "replayed %zu requests from the log", records.size());
  }
  m.base = make_event_base(options.transport.wan.enabled());
  if (m.base == nullptr) return "cannot create an event base";
  m.stopper = std::make_unique<LoopStop>(m.base.get());
  if (options.handle_signals) m.stopper->handle_signals();
  Impl* raw = impl.get();
  m.transport = std::make_unique<Transport>(m.base.get(), m.config.n, *m.crypto, options.transport,
                                            [raw](NodeId from, Message&& msg) { raw->on_message(from, std::move(msg)); });
  const ReplicaAddress listen = options.listen.host.empty() ? m.config.replicas[kServerId] : options.listen;
  if (std::string err = m.transport->listen(listen); !err.empty()) return err;
  m.status_ev.reset(event_new(
      m.base.get(), -1, EV_PERSIST, [](int, short, void* a) { static_cast<Impl*>(a)->write_status(true); }, raw));
  BFT_ASSERT(m.status_ev);
  LOG_INFO("norep", "NO-REP server (service %s, %s) listening on %s:%u", options.service.c_str(),
           options.durable ? "durable: group-committed log" : "not durable", listen.host.c_str(), listen.port);
  if (options.transport.wan.enabled()) {
    LOG_INFO("norep", "WAN emulation: %s; the server is at site %u (node 0's)",
             options.transport.wan.describe().c_str(), options.transport.wan.site(kServerId));
  }
  out.reset(new NorepServer(std::move(impl)));
  return "";
}

void NorepServer::run() {
  Impl& m = *impl_;
  const timeval status{static_cast<time_t>(m.options.status_interval_ms / 1000),
                       static_cast<suseconds_t>((m.options.status_interval_ms % 1000) * 1000)};
  BFT_ASSERT(event_add(m.status_ev.get(), &status) == 0);
  m.write_status(true);
  while (!m.stopper->requested()) {
    if (event_base_loop(m.base.get(), EVLOOP_ONCE) < 0) break;
    m.flush();
  }
  m.flush();
  m.write_status(false);
  event_del(m.status_ev.get());
}

void NorepServer::stop() { impl_->stopper->request(); }
std::uint64_t NorepServer::executed() const { return impl_->executed.load(std::memory_order_relaxed); }

}  // namespace bftfs
