// sim::Cluster: the in-process cluster driver. The seeded simulator (sim/simulation.h) and the unit tests
// (tests/unit/test_replica_*.cc, test_fs_engine.cc, test_shim_engine.cc) all drive real replicas through it.
//
// A cluster is n real Replica cores (protocol/replica.h) with ids 0..n-1 and client endpoints with ids n..,
// every node with keys from one seed. Each replica runs over a service stack that a factory builds over the
// replica's snapshot store, at its first start and again at every restart. Its store and its durable records
// (the PersistRecords it emitted, in order) survive crashes; its core and services do not. A crash may lose the
// records no sync covered yet (when the cluster has a fault Prng), and may come between persisting and sending
// (arm_crash), tearing the last write.
//
// After every step of a replica (a message, a tick, a restart) the cluster drains its Effects: records to its
// durable list, sends to the packet queue (each send of a correct replica checked against its durable records:
// "durable before sent", protocol/effects.h); then it asserts the replica's invariants and tells the observer.
//
// Packets travel one of two ways (ClusterOptions::delivery):
//   kFifo     scripted tests: messages (not encoded) in one queue, delivered in order by run() until it is empty;
//             a drop filter loses packets by rule, and every packet delivered to a replica is logged;
//   kNetwork  the seeded simulation: every message goes through the real wire codec (encoded and MACed with the
//             sender's keys, decoded and authenticated with the receiver's) and the simulated network of
//             sim/network.h (delay, loss, duplication, partitions, slow links), delivered by deliver_due();
//             Byzantine replicas (sim/byzantine.h) rewrite and inject frames.
// A message to a client endpoint goes to its `receive` handler (a client core) or, without one, its reply into
// the client's inbox, where accepted() applies the clients' acceptance rule (protocol/client.h).
//
// Time is ticks (now()); steps (step()) count the cluster's events, strictly increasing, for real-time order.
// Violations found by the cluster (a broken promise, a node sending to a node that does not exist, a queue that
// never drains, a reply whose result does not match its digest) are thrown as sim::Violation.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/crypto.h"
#include "common/prng.h"
#include "protocol/effects.h"
#include "protocol/replica.h"
#include "protocol/service.h"
#include "services/null_service.h"  // MemorySnapshotStore
#include "sim/byzantine.h"
#include "sim/network.h"

namespace bftfs::sim {

// A violation found while stepping: thrown out of the step that found it (the seeded run reports it with its
// seed and trace; in a unit test it fails the test).
struct Violation {
  std::string what;
};

// A replica's services for one incarnation, built by the cluster's factory over the replica's snapshot store.
// The cluster destroys it when the replica crashes, after the core that refers to it. Subclasses own the
// services and keep typed pointers to them for their owners (Cluster::stack<T>).
class ServiceStack {
 public:
  virtual ~ServiceStack() = default;
  // The service the Replica core executes on (the top of the stack); lives as long as the stack.
  virtual Service& top() = 0;
};

// Builds replica `replica`'s services over `store` (empty at the first start; at a restart, what the previous
// incarnations left in it, which the services recover from).
using ServiceFactory = std::function<std::unique_ptr<ServiceStack>(NodeId replica, MemorySnapshotStore& store)>;

// What a replica promised must be backed by its durable records ("durable before sent", effects.h): the index
// of those records.
struct PromiseIndex {
  std::set<std::tuple<std::uint64_t, std::uint64_t, Digest>> pre_prepared;  // (view, seq, batch digest)
  std::set<std::tuple<std::uint64_t, std::uint64_t, Digest>> prepared;
  std::set<std::pair<std::uint64_t, Digest>> checkpoints;
  std::set<std::uint64_t> view_changes;  // views for which a ViewRecord{in_view_change} was persisted

  // Indexes one record appended to the log.
  void add(const PersistRecord& rec);
  // "" if `send` from replica `self` is backed, else which record is missing.
  std::string missing_for(NodeId self, const Send& send) const;
};

// One replica process: the durable part survives crashes, the incarnation's objects do not.
struct ReplicaHost {
  NodeId id = 0;
  std::unique_ptr<Crypto> crypto;
  // Durable: the snapshot store and the records appended, in order. log[0, synced) is durable; a crash may
  // lose any suffix of the rest.
  MemorySnapshotStore store;
  std::vector<PersistRecord> log;
  std::size_t synced = 0;
  PromiseIndex promises;  // of `log`
  // The incarnation.
  std::unique_ptr<ServiceStack> stack;
  std::unique_ptr<Replica> replica;
  std::unique_ptr<Byzantine> byz;  // set for a Byzantine replica (kNetwork only); null for a correct one
  std::uint64_t incarnation = 0;   // starts so far
  bool up = false;
  bool armed = false;  // crash at the next persist, before its sends go out
  std::uint64_t armed_deadline = 0;
  std::uint64_t clock_skew_ns = 0;  // ClusterOptions::wall_clock_from_ticks: added to the tick's wall clock
  // Asynchronous sync (ClusterOptions::async_sync, as the runtime's sync thread): the log positions (sizes after
  // the record) of the latest must-sync record and ViewRecord appended, and the sends that wait for them to be
  // durable (send_waits_for_log) until complete_sync().
  std::size_t must_pos = 0;
  std::size_t view_pos = 0;
  std::vector<std::pair<std::size_t, Send>> held;
  ReplicaStats past;  // the stats of earlier incarnations

  bool correct() const { return byz == nullptr; }
};

// One client endpoint: its keys and where messages to it go.
struct ClientHost {
  NodeId id = 0;
  std::unique_ptr<Crypto> crypto;
  // A client core: gets every message to this client, authenticated (kNetwork) or as sent (kFifo).
  std::function<void(NodeId from, const Message& message)> receive;
  // Without `receive`: the replies received, (sender, reply) in arrival order.
  std::vector<std::pair<NodeId, Reply>> inbox;
};

// One message in the kFifo queue.
struct Envelope {
  NodeId from = 0;
  NodeId to = 0;
  Message message;
};

template <typename T>
bool is(const Envelope& e) {
  return std::holds_alternative<T>(e.message);
}

enum class Delivery { kFifo, kNetwork };

struct ClusterOptions {
  ReplicaOptions replica;      // n and f among them
  std::uint32_t clients = 0;   // client endpoints, ids n .. n + clients - 1
  std::uint64_t key_seed = 1;  // every node's keys: generate_keys_from_seed(key_seed, id)
  ServiceFactory factory;      // required
  // The PRNG seed of replica `id`'s core in its `incarnation` (1 at the first start). Default: key_seed + id.
  std::function<std::uint64_t(NodeId id, std::uint64_t incarnation)> replica_seed;
  Delivery delivery = Delivery::kFifo;
  NetworkOptions network;        // kNetwork
  Prng* network_prng = nullptr;  // kNetwork, required: the network's own choices; must outlive the cluster
  // The crash variants' choices (which unsynced records a crash loses, torn writes of an armed crash); must
  // outlive the cluster. Null: a crash loses no record (and arm_crash is not available).
  Prng* fault_prng = nullptr;
  // Sends that need the log wait until complete_sync() (the runtime's sync thread); else each drain syncs.
  bool async_sync = false;
  // A first start persists ViewRecord{0}, durable at once, as the runtime's recover() on an empty log does, so
  // that a restart can tell "every record was lost" from "never ran" (Replica::Impl::recover).
  bool first_start_record = false;
  std::optional<std::uint64_t> start_wall_clock_ns;  // set on every core when it starts
  bool wall_clock_from_ticks = false;  // tick_replica sets now * 1 ms + the replica's clock skew first
};

inline constexpr std::size_t kRejectReasons = 32;

// Totals of the cluster's own events (the cores keep their own stats).
struct ClusterStats {
  std::uint64_t crashes = 0;
  std::uint64_t crashes_between_persist_and_send = 0;
  std::uint64_t torn_persists = 0;          // armed crashes that also lost the tail of the last persist
  std::uint64_t unsynced_records_lost = 0;  // crashes that lost appended but never synced records
  std::uint64_t sends_held_for_sync = 0;    // async_sync: sends that waited for the log
  std::uint64_t held_sends_lost = 0;        // ... and were never sent: their replica crashed first
  std::uint64_t frames_rejected = 0;        // kNetwork: frames the wire decoder rejected
  std::array<std::uint64_t, kRejectReasons> rejected_by_reason{};  // index = bftfs::Reject
};

// What the owner of a cluster learns as it runs (every member has a default that does nothing).
class ClusterObserver {
 public:
  virtual ~ClusterObserver() = default;
  // Whether event() is wanted: the cluster formats its events only then.
  virtual bool traces() const { return false; }
  // One event of the run (a delivery, a rejected frame, a restart, ...), as one line.
  virtual void event(const std::string& line) { (void)line; }
  // Replica `r` appended `rec` to its durable records.
  virtual void on_record(const ReplicaHost& r, const PersistRecord& rec) {
    (void)r;
    (void)rec;
  }
  // Replica `r` is about to crash: its core and services still exist.
  virtual void on_crashing(ReplicaHost& r) { (void)r; }
  // Replica `r` crashed (`how` says which way); its durable records are what survived.
  virtual void on_crashed(ReplicaHost& r, const std::string& how) {
    (void)r;
    (void)how;
  }
  // A step of replica `r` ended: its effects are drained and its invariants hold. Not called when the step
  // crashed it (an armed crash).
  virtual void after_replica_step(ReplicaHost& r) { (void)r; }
};

class Cluster {
 public:
  // Builds the nodes and their keys; no replica runs until start()/start_all(). `observer` may be null and must
  // outlive the cluster.
  explicit Cluster(ClusterOptions options, ClusterObserver* observer = nullptr);
  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  const ClusterOptions& options() const { return options_; }
  std::uint32_t n() const { return n_; }  // replicas, ids 0 .. n-1
  std::uint32_t f() const { return options_.replica.f; }
  std::uint32_t nodes() const { return n_ + options_.clients; }  // replicas and client endpoints
  std::vector<NodeId> client_ids() const;                         // n .. nodes-1

  // ---- nodes (ids out of range are a bug: std::out_of_range) ----
  ReplicaHost& host(NodeId replica) { return *replicas_.at(replica); }
  const ReplicaHost& host(NodeId replica) const { return *replicas_.at(replica); }
  // The core of a replica that is up.
  Replica& replica(NodeId id);
  // The service stack of a replica that is up, as the type its factory built.
  template <typename T>
  T& stack(NodeId id) {
    return dynamic_cast<T&>(*host(id).stack);
  }
  // Replica `replica`'s durable records, in the order it emitted them (all of them in the scripted mode).
  std::vector<PersistRecord>& records(NodeId replica) { return host(replica).log; }
  ClientHost& client(NodeId id) { return *clients_.at(id - n_); }
  // A node's keys (replica or client), for signing or MACing what a test forges in its name.
  const Crypto& crypto(NodeId node) const;
  // Makes replica `id` Byzantine (kNetwork only), before its first start.
  void set_byzantine(NodeId id, std::unique_ptr<Byzantine> byz);

  // ---- lifecycle ----
  // Starts replica `id`'s next incarnation: a service stack from the factory, a core. With `recovering`, the core
  // recovers from the durable records and that is a step.
  void start(NodeId id, bool recovering);
  void start_all();
  void restart(NodeId id) { start(id, true); }
  // Replica `id` crashes now, between steps (`how` for the observer). With a fault Prng, records appended since
  // the last sync may be lost, any suffix of them.
  // With `lose_all_unsynced` it loses every record appended since the last sync (a power loss before any of
  // them reached the disk) instead of a random suffix of them.
  void crash(NodeId id, const std::string& how = "between steps", bool lose_all_unsynced = false);
  // Replica `id` crashes at its next persist, after (some of) the records and before its sends (needs a fault
  // Prng); the owner crashes it itself if that has not happened by `deadline`.
  void arm_crash(NodeId id, std::uint64_t deadline);

  // ---- steps ----
  // Routes a node's send: encoded into the network (kNetwork) or queued (kFifo); kAllReplicas reaches every
  // other replica. A correct node addressing itself or a node that does not exist is a violation.
  void route(NodeId from, const Send& send);
  // Replica `id` ticks (with the tick's wall clock when wall_clock_from_ticks).
  void tick_replica(NodeId id);
  // Ends replica `id`'s batch hold (Replica::end_batch_hold) as a step of its own.
  void end_batch_hold(NodeId id);
  // async_sync: every record replica `id` appended so far is durable; the sends held for it leave.
  void complete_sync(NodeId id);
  // kNetwork: the frames every Byzantine replica that is up injects at this tick.
  void byzantine_tick();
  // kNetwork: delivers every frame due at now().
  void deliver_due();
  // The next tick begins.
  void advance() { ++now_; }
  std::uint64_t now() const { return now_; }
  std::uint64_t step() const { return step_; }
  // Counts one step of the owner's (a client's submission or tick); returns it.
  std::uint64_t next_step() { return ++step_; }

  // ---- kFifo: scripted runs ----
  // Queues a message as if `from` had sent it.
  void inject(Envelope e) { queue_.push_back(std::move(e)); }
  // Delivers queued messages in order until none is left (a violation after `max_steps` deliveries).
  void run(std::size_t max_steps = 1'000'000);
  // Every replica that is up ticks, then run(); then the next tick begins.
  void tick(std::uint64_t ticks = 1);
  // Ticks until `done` holds (checked before every tick); false if it still does not after `max_ticks`.
  bool tick_until(const std::function<bool()>& done, std::uint64_t max_ticks);
  std::function<bool(const Envelope&)> drop;  // true: the packet is lost
  // Every packet delivered to a replica that was up, in delivery order (the owner may clear it).
  std::vector<Envelope>& delivered() { return delivered_; }
  std::size_t count_delivered(const std::function<bool(const Envelope&)>& pred) const;

  // ---- scripted clients ----
  // A request of `client`, authenticated for every replica.
  Request make_request(NodeId client, std::uint64_t id, Bytes op, bool read_only = false,
                       NodeId replier = kReplierAll) const;
  void send(const Request& req, NodeId to) { route(req.client, Send{to, req}); }
  void send_all(const Request& req);
  // The replies `client` received (clients without a `receive` handler).
  std::vector<std::pair<NodeId, Reply>>& inbox(NodeId id) { return client(id).inbox; }
  // The clients' acceptance rule (protocol/client.h) over the inbox: f+1 matching replies that are not tentative
  // (nor read-only), or 2f+1 matching ones, one of them with the full result; a speculative reply gives the
  // result but is no vote. nullopt while no result meets it.
  std::optional<Bytes> accepted(NodeId client, std::uint64_t request_id);
  // Sends request `request_id` of `client` to every replica and ticks until it is accepted (kFifo); nullopt
  // if it is not within `max_ticks`.
  std::optional<Bytes> order(NodeId client, std::uint64_t request_id, Bytes op, std::uint64_t max_ticks);

  // ---- kNetwork ----
  Network& network() { return *net_; }
  // Hash of every frame delivered, in order, with its tick and ends: equal for equal runs.
  std::uint64_t fingerprint() const { return fingerprint_; }

  const ClusterStats& stats() const { return stats_; }
  // Replica `id`'s stats over all its incarnations.
  ReplicaStats replica_stats(NodeId id) const;

  // Throws Violation{what}.
  [[noreturn]] void fail(const std::string& what) const;

 private:
  bool traces() const { return observer_ != nullptr && observer_->traces(); }
  void event(const std::string& line) const { observer_->event(line); }
  void append_record(ReplicaHost& r, const PersistRecord& rec);
  void drain(ReplicaHost& r);
  void drain_armed(ReplicaHost& r, Effects& e);
  void send_checked(ReplicaHost& r, const Send& send);
  void after_step(ReplicaHost& r);
  void deliver_frame(Packet& p);
  void deliver_to_replica(ReplicaHost& r, NodeId from, const Message& m);
  void deliver_to_client(ClientHost& c, NodeId from, const Message& m);
  void fifo_step();

  ClusterOptions options_;
  ClusterObserver* observer_;
  std::uint32_t n_;
  std::vector<std::unique_ptr<ReplicaHost>> replicas_;
  std::vector<std::unique_ptr<ClientHost>> clients_;
  std::unique_ptr<Network> net_;
  std::deque<Envelope> queue_;
  std::vector<Envelope> delivered_;
  std::uint64_t now_ = 0;
  std::uint64_t step_ = 0;
  std::uint64_t fingerprint_ = 0xCBF29CE484222325ull;
  ClusterStats stats_;
};

// Adds every counter of `s` into `into`.
void add_stats(ReplicaStats& into, const ReplicaStats& s);

}  // namespace bftfs::sim
