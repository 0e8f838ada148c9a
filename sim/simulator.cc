// The whole-cluster simulator (simulator.h). One Simulation object is one run of one seed.
#include "sim/simulator.h"

#include <algorithm>
#include <cinttypes>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <tuple>

#include "common/assert.h"
#include "common/crypto.h"
#include "common/log.h"
#include "common/prng.h"
#include "protocol/client.h"
#include "protocol/replica.h"
#include "protocol/wire.h"
#include "relay/spec_client.h"
#include "services/counter_service.h"
#include "services/null_service.h"
#include "shim/envelope.h"
#include "shim/shim.h"
#include "sim/byzantine.h"
#include "sim/describe.h"
#include "sim/mix.h"
#include "sim/scenario.h"
#include "sim/checker.h"
#include "sim/network.h"
#include "sim/recording_service.h"
#include "sim/strfmt.h"

namespace bftfs::sim {

namespace {

constexpr std::uint64_t kLivenessOps = 3;       // requests each client must complete after the network heals
constexpr std::uint64_t kArmedCrashTicksMax = 40;  // a crash "between persist and send" waits this long at most
constexpr std::uint64_t kConvergeGraceTicks = 3000;  // liveness: time for the replicas to converge after clients
constexpr std::uint64_t kSettleTicks = 1000;         // liveness: time for the others to execute the further request

// A violation found while stepping: unwinds the run to Simulation::run.
struct Violation {
  std::string what;
};

// SimConfig::sabotage_predicates: a Service decorator that drops the dependencies of every predicated request
// before the shim below it decides, as a replica that ignored predicates would.
class PredicateStripper final : public Service {
 public:
  explicit PredicateStripper(Service& inner) : inner_(inner) {}
  Bytes execute(const ExecContext& ctx, std::span<const std::uint8_t> op) override {
    std::vector<shim::Dependency> deps;
    std::span<const std::uint8_t> inner_op;
    if (shim::decode_envelope(op, deps, inner_op) != shim::EnvelopeError::kOk || deps.empty()) {
      return inner_.execute(ctx, op);
    }
    return inner_.execute(ctx, shim::encode_envelope({}, inner_op));
  }
  bool execute_read_only(NodeId client, std::span<const std::uint8_t> op, Bytes& result) override {
    return inner_.execute_read_only(client, op, result);
  }
  void commit_through(std::uint64_t seq) override { inner_.commit_through(seq); }
  void rollback_to(std::uint64_t seq) override { inner_.rollback_to(seq); }
  CheckpointId checkpoint(std::uint64_t seq) override { return inner_.checkpoint(seq); }
  void discard_checkpoints_below(std::uint64_t seq) override { inner_.discard_checkpoints_below(seq); }
  CheckpointId recovered_checkpoint() const override { return inner_.recovered_checkpoint(); }
  std::uint64_t partition_count() const override { return inner_.partition_count(); }
  const PartitionTree& checkpoint_tree(std::uint64_t seq) const override { return inner_.checkpoint_tree(seq); }
  Bytes read_partition(std::uint64_t seq, std::uint64_t index) const override {
    return inner_.read_partition(seq, index);
  }
  void begin_install(std::uint64_t target_seq) override { inner_.begin_install(target_seq); }
  void install_partition(std::uint64_t index, std::span<const std::uint8_t> data) override {
    inner_.install_partition(index, data);
  }
  CheckpointId finish_install(std::uint64_t target_seq) override { return inner_.finish_install(target_seq); }

 private:
  Service& inner_;
};

// What a correct replica promised must be backed by its durable records ("durable before sent", effects.h):
// the index of those records.
struct PromiseIndex {
  std::set<std::tuple<std::uint64_t, std::uint64_t, Digest>> pre_prepared;  // (view, seq, batch digest)
  std::set<std::tuple<std::uint64_t, std::uint64_t, Digest>> prepared;
  std::set<std::pair<std::uint64_t, Digest>> checkpoints;
  std::set<std::uint64_t> view_changes;  // views for which a ViewRecord{in_view_change} was persisted

  void add(const PersistRecord& rec) {
    if (const auto* r = std::get_if<PrePrepareRecord>(&rec)) pre_prepared.emplace(r->view, r->seq, r->batch.digest());
    if (const auto* r = std::get_if<PreparedRecord>(&rec)) prepared.emplace(r->view, r->seq, r->digest);
    if (const auto* r = std::get_if<CheckpointRecord>(&rec)) checkpoints.emplace(r->seq, r->digest);
    if (const auto* r = std::get_if<ViewRecord>(&rec)) {
      if (r->in_view_change) view_changes.insert(r->view);
    }
  }
};

struct ReplicaNode {
  NodeId id = 0;
  std::unique_ptr<Crypto> crypto;
  MemorySnapshotStore store;         // survives crashes
  std::vector<PersistRecord> log;    // survives crashes: the records appended, in order
  std::size_t synced = 0;            // log[0, synced) is durable; a crash may lose any suffix of the rest
  PromiseIndex promises;
  std::unique_ptr<Service> service;  // the incarnation's service (CounterService or NullService)
  CounterService* counter = nullptr;
  std::unique_ptr<ExecutionProbe> probe;  // PBFT-CS: between the shim and the counter
  std::unique_ptr<shim::Shim> shim;       // PBFT-CS: the shim over the probe
  std::unique_ptr<PredicateStripper> stripper;  // SimConfig::sabotage_predicates: over the shim
  std::unique_ptr<RecordingService> recording;
  std::unique_ptr<Replica> replica;
  std::unique_ptr<Byzantine> byz;
  std::uint64_t incarnation = 0;
  std::uint64_t clock_skew_ns = 0;
  bool up = false;
  std::uint64_t restart_tick = 0;
  bool armed = false;  // crash at the next persist, before its sends go out
  std::uint64_t armed_deadline = 0;
  // Asynchronous sync (seeds with Simulation::async_sync_, as the runtime's sync thread): the log positions
  // (sizes after the record) of the latest must-sync record and ViewRecord appended, and the sends that wait
  // for them to be durable (send_waits_for_log) until the sync completes at a later tick.
  std::size_t must_pos = 0;
  std::size_t view_pos = 0;
  std::vector<std::pair<std::size_t, Send>> held;
  ReplicaStats past;  // stats of earlier incarnations
  std::uint64_t past_service_rollbacks = 0;
};

struct ClientNode {
  NodeId id = 0;
  std::unique_ptr<Crypto> crypto;
  std::unique_ptr<Client> client;    // a plain PBFT client (seeds without the shim)
  std::unique_ptr<SpecClient> spec;  // the PBFT-CS client library (shim seeds), speculating or not
  bool pipelining = false;
  std::uint64_t token = 0;  // the token of the next increment
  // A speculating counter client (spec_window > 0; NSDI'09 §6.1 with §3.2): each increment presents the token
  // of the previous increment's first reply and is predicated on that reply, up to spec_window in flight. When
  // a final event shows a prediction failed, everything submitted after it relied on it (directly or through
  // the chain) and comes back as a no-op; the client waits for those, then continues from the newest result
  // that executed.
  std::uint32_t spec_window = 0;
  std::deque<std::uint64_t> chain;  // live increments in flight, in submission order
  std::set<std::uint64_t> dead;     // in flight, relying on a failed prediction
  bool waiting_first = false;       // the newest live increment has no usable reply yet: next token unknown
  bool recovering = false;          // a prediction failed: wait until nothing is in flight, then resume
  std::uint64_t committed_id = 0;   // the newest increment whose final result executed, and its next token
  std::uint64_t committed_token = 0;
  std::set<std::pair<std::uint64_t, NodeId>> speculative_seen;  // (request, replica): early replies received
  std::map<std::uint64_t, OpKind> outstanding;
  std::uint64_t next_submit_tick = 0;
  std::uint64_t completed = 0;
  std::uint64_t completed_after_heal = 0;
  std::uint64_t newest_completed = 0;  // highest request id completed
  bool stopped = false;
};

void add_stats(ReplicaStats& into, const ReplicaStats& s) {
  into.requests_executed += s.requests_executed;
  into.batches_committed += s.batches_committed;
  into.read_only_executed += s.read_only_executed;
  into.view_changes_started += s.view_changes_started;
  into.view_changes_deferred_lagging += s.view_changes_deferred_lagging;
  into.new_views_installed += s.new_views_installed;
  into.state_transfers += s.state_transfers;
  into.state_transfer_bytes += s.state_transfer_bytes;
  into.rollbacks += s.rollbacks;
  into.early_replies += s.early_replies;
  into.quiet_batches += s.quiet_batches;
  into.quiet_releases += s.quiet_releases;
  into.open_batches_discarded += s.open_batches_discarded;
  into.requests_deferred_order += s.requests_deferred_order;
  into.rejected_bad_authenticator += s.rejected_bad_authenticator;
  into.rejected_bad_signature += s.rejected_bad_signature;
  into.rejected_out_of_window += s.rejected_out_of_window;
  into.rejected_wrong_view += s.rejected_wrong_view;
  into.rejected_conflict += s.rejected_conflict;
  into.rejected_invalid += s.rejected_invalid;
}

class Simulation;
Simulation* g_running = nullptr;  // for the SIGABRT handler: the run whose trace to print

class Simulation {
 public:
  explicit Simulation(const SimConfig& config)
      : config_(config),
        prng_(mix(config.seed, 0xFA17)),
        net_prng_(mix(config.seed, 0x4E7)),
        async_prng_(mix(config.seed, 0xA5C5)),
        async_sync_(async_prng_.chance(1, 2)),
        hold_prng_(mix(config.seed, 0xB47D)) {}

  SimResult run();
  // Called from the SIGABRT handler: the header and the trace, on stderr.
  void dump_on_abort() const;

 private:
  enum class Phase { kSetup, kFault, kLiveness, kFinish };

  void setup();
  void start_replica(ReplicaNode& r, bool recovering);
  void crash_replica(ReplicaNode& r, const char* how);
  void append_record(ReplicaNode& r, const PersistRecord& rec);
  void drain_replica(ReplicaNode& r);
  void complete_sync(ReplicaNode& r);
  void drain_client(ClientNode& c);
  void check_promise(const ReplicaNode& r, const Send& send);
  void route(NodeId from, const Send& send, const Crypto& crypto, Byzantine* byz);
  void deliver(Packet& p);
  void after_replica_step(ReplicaNode& r);
  void tick_once();
  void faults();
  void workload(ClientNode& c);
  // Submits the client's next operation (a read with the scenario's odds when allow_read).
  void submit_one(ClientNode& c, bool allow_read);
  bool at_target(const ReplicaNode& r, std::uint64_t target) const;
  std::uint64_t target_seq() const;
  void on_completion(ClientNode& c, const Completion& comp, FinalKind kind);
  // The speculating counter client (ClientNode::spec_window > 0).
  void on_spec_event(ClientNode& c, SpecEvent& ev);
  void spec_pump(ClientNode& c);    // submits while the chain may grow
  void spec_submit(ClientNode& c);  // the next increment, predicated on the newest live one
  void spec_on_final(ClientNode& c, const SpecEvent& ev);
  void spec_resume(ClientNode& c);  // after a failure: continue once nothing is in flight
  static std::size_t in_flight(const ClientNode& c) { return c.spec ? c.spec->in_flight() : c.client->in_flight(); }
  static const ClientStats& core_stats(const ClientNode& c) {
    return c.spec ? c.spec->client_stats() : c.client->stats();
  }
  void start_liveness();
  bool clients_done() const;
  bool converged(std::string* why) const;
  void finish();
  void collect_stats();

  [[noreturn]] void fail(const std::string& what);
  void event(const std::string& line);
  void on_log(LogLevel level, std::string_view line);
  std::string trace_text() const;
  const char* phase_name() const;
  bool correct(const ReplicaNode& r) const { return r.byz == nullptr; }
  std::uint32_t faulty_now() const;

  SimConfig config_;
  Scenario sc_;
  Prng prng_;      // faults and workload
  Prng net_prng_;  // the network's own choices
  // Half of the seeds sync like the runtime's sync thread: the sends that do not wait for the log
  // (send_waits_for_log) leave at once, the others when the sync completes, a random number of ticks later; a
  // crash in between loses the unsynced records. Its own PRNG, so the other seeds replay exactly as before.
  Prng async_prng_;
  bool async_sync_ = false;
  // Ends a primary's batch hold early, as the runtime's timer does (its own stream: older seeds keep their
  // scenarios). Without it a hold lasts until the core's tick bound.
  Prng hold_prng_;
  std::unique_ptr<Network> net_;
  std::unique_ptr<Checker> checker_;
  std::vector<std::unique_ptr<ReplicaNode>> replicas_;
  std::vector<std::unique_ptr<ClientNode>> clients_;
  std::uint32_t nodes_ = 0;
  std::uint64_t now_ = 0;
  std::uint64_t step_ = 0;
  Phase phase_ = Phase::kSetup;
  std::uint64_t partition_end_ = 0;
  struct SlowLink {
    NodeId from, to;
    std::uint64_t until;
  };
  std::vector<SlowLink> slow_;
  std::uint64_t liveness_start_ = 0;
  std::vector<std::string> trace_;  // ring of the last events
  std::size_t trace_next_ = 0;
  std::string log_error_;
  SimStats stats_;
  std::uint64_t fingerprint_ = 0xCBF29CE484222325ull;
};

void Simulation::event(const std::string& line) {
  std::string full = fmt("t=%llu #%llu ", ull(now_), ull(step_)) + line;
  if (config_.verbose) std::printf("%s\n", full.c_str());
  if (config_.trace_events == 0) return;
  if (trace_.size() < config_.trace_events) {
    trace_.push_back(std::move(full));
  } else {
    trace_[trace_next_] = std::move(full);
    trace_next_ = (trace_next_ + 1) % trace_.size();
  }
}

std::string Simulation::trace_text() const {
  std::string out;
  for (std::size_t i = 0; i < trace_.size(); ++i) {
    out += "    ";
    out += trace_[(trace_next_ + i) % trace_.size()];
    out += '\n';
  }
  return out;
}

const char* Simulation::phase_name() const {
  switch (phase_) {
    case Phase::kSetup:
      return "setup";
    case Phase::kFault:
      return "fault";
    case Phase::kLiveness:
      return "liveness";
    case Phase::kFinish:
      return "finish";
  }
  return "?";
}

void Simulation::fail(const std::string& what) { throw Violation{what}; }

void Simulation::on_log(LogLevel level, std::string_view line) {
  if (level == LogLevel::kError) {
    ++stats_.log_errors;
    // House style: an ERROR line fails a test run unless the test expects it.
    if (log_error_.empty()) log_error_ = std::string(line);
  } else if (level == LogLevel::kWarn) {
    ++stats_.log_warnings;
  }
  event("log " + std::string(line));
}

void Simulation::dump_on_abort() const {
  std::fprintf(stderr, "ABORT seed=%llu step=%llu tick=%llu phase=%s\n  scenario: %s\n  last events:\n%s",
               ull(config_.seed), ull(step_), ull(now_), phase_name(), sc_.describe().c_str(),
               trace_text().c_str());
  std::fflush(stderr);
}

std::uint32_t Simulation::faulty_now() const {
  std::uint32_t faulty = 0;
  for (const auto& r : replicas_) faulty += (!r->up || r->armed || r->byz) ? 1 : 0;
  return faulty;
}

void Simulation::setup() {
  std::string error;
  if (!make_scenario(config_, sc_, error)) fail("bad configuration: " + error);
  nodes_ = sc_.n + sc_.clients;
  net_ = std::make_unique<Network>(nodes_, sc_.net, net_prng_);
  checker_ = std::make_unique<Checker>(sc_.counter, sc_.shim);

  std::map<NodeId, PublicKeys> pubs;
  std::vector<SecretKeys> secs(nodes_);
  for (NodeId id = 0; id < nodes_; ++id) generate_keys_from_seed(config_.seed, id, pubs[id], secs[id]);

  for (NodeId id = 0; id < sc_.n; ++id) {
    auto r = std::make_unique<ReplicaNode>();
    r->id = id;
    r->crypto = std::make_unique<Crypto>(id, secs[id], pubs);
    r->clock_skew_ns = prng_.below(5'000'000);
    replicas_.push_back(std::move(r));
  }
  for (const auto& [id, strategy] : sc_.byzantine) {
    ReplicaNode& r = *replicas_[id];
    r.byz = std::make_unique<Byzantine>(strategy, id, sc_.n, nodes_, *r.crypto, mix(config_.seed, 0xB12 + id),
                                        sc_.replica.log_window);
    if (sc_.lying) r.byz->set_early_lies(sc_.early_lie_ppm, sc_.fake_ppm, sc_.shim);
  }
  stats_.cs_lying_primary = sc_.lying && !sc_.byzantine.empty() ? 1 : 0;
  stats_.byzantine_replicas = sc_.byzantine.size();
  stats_.cs_early_replies = sc_.replica.early_replies ? 1 : 0;
  stats_.cs_shim = sc_.shim ? 1 : 0;
  for (const auto& [id, st] : sc_.byzantine) stats_.reorder_primary |= st == Strategy::kReorderClient ? 1 : 0;
  for (std::uint32_t j = 0; j < sc_.clients; ++j) {
    auto c = std::make_unique<ClientNode>();
    c->id = sc_.n + j;
    c->crypto = std::make_unique<Crypto>(c->id, secs[c->id], pubs);
    c->pipelining = sc_.pipelining_client && j + 1 == sc_.clients;
    ClientOptions co = sc_.client;
    if (c->pipelining) co.window = kPipelineWindow;
    if (sc_.shim) {
      c->spec_window = sc_.spec_windows[j];
      SpecClientOptions so;
      so.client = co;
      so.client.window = std::max<std::uint32_t>(c->spec_window, 1);
      so.speculate = c->spec_window > 0;
      so.failure_window = sc_.failure_window;
      so.failure_permille_max = sc_.failure_permille_max;
      c->spec = std::make_unique<SpecClient>(so, c->id, *c->crypto, mix(config_.seed, 0xC11 + c->id));
      stats_.cs_speculating_clients += c->spec_window > 0 ? 1 : 0;
    } else {
      c->client = std::make_unique<Client>(co, c->id, *c->crypto, mix(config_.seed, 0xC11 + c->id));
    }
    c->token = counter_initial_token(c->id);
    c->committed_token = c->token;
    stats_.pipelined_clients += c->pipelining || c->spec_window > 1 ? 1 : 0;
    clients_.push_back(std::move(c));
  }
  event("scenario " + sc_.describe());
  for (auto& r : replicas_) start_replica(*r, false);
}

void Simulation::start_replica(ReplicaNode& r, bool recovering) {
  BFT_ASSERT(!r.up);
  ++r.incarnation;
  net_->kill(r.id);  // nothing sent to it while it was down arrives at the new incarnation
  if (sc_.counter) {
    auto svc = std::make_unique<CounterService>(&r.store);
    r.counter = svc.get();
    r.service = std::move(svc);
  } else {
    r.counter = nullptr;
    r.service = std::make_unique<NullService>(&r.store);
  }
  Service* top = r.service.get();
  if (sc_.shim) {
    // Recovers the shim's logs of the counter's recovered checkpoint from the same store (shim.h).
    r.probe = std::make_unique<ExecutionProbe>(*r.service);
    r.shim = std::make_unique<shim::Shim>(*r.probe, &r.store, sc_.shim_options);
    top = r.shim.get();
    if (config_.sabotage_predicates && correct(r)) {
      r.stripper = std::make_unique<PredicateStripper>(*r.shim);
      top = r.stripper.get();
    }
  }
  r.recording = std::make_unique<RecordingService>(*top, r.shim.get(), r.probe.get());
  r.replica = std::make_unique<Replica>(sc_.replica, r.id, *r.recording, *r.crypto,
                                        mix(config_.seed, r.id * 1000 + r.incarnation));
  if (r.byz) {
    Byzantine* b = r.byz.get();
    r.replica->set_effects_filter([b](Effects& e) { b->filter(e); });
  }
  r.up = true;
  r.armed = false;
  if (!recovering) {
    // A first start: the runtime runs recover() on the empty log, which persists ViewRecord{0} and sends nothing
    // that needs the view until it is durable, so a later restart can tell "every record was lost" from "never
    // ran" (Replica::Impl::recover). Recorded as durable here without a step, which keeps every seed's schedule;
    // without it a primary that crashed before its first sync restarted as if new and reused its sequence
    // numbers in view 0 (seed 101759, mode=crash: an assertion in closed_in_flight).
    BFT_ASSERT(r.log.empty());
    append_record(r, ViewRecord{0, false});
    r.synced = r.log.size();
  }
  if (recovering) {
    event(fmt("restart r%u incarnation %llu log=%zu records", r.id, ull(r.incarnation), r.log.size()));
    ++step_;
    r.replica->recover(r.log);
    drain_replica(r);
    after_replica_step(r);
  }
}

void Simulation::crash_replica(ReplicaNode& r, const char* how) {
  BFT_ASSERT(r.up);
  add_stats(r.past, r.replica->stats());
  r.past_service_rollbacks += r.recording->rollbacks();
  // The core first (it refers to the service), then the service; the store and the log stay.
  r.replica.reset();
  r.recording.reset();
  r.stripper.reset();
  r.shim.reset();
  r.probe.reset();
  r.counter = nullptr;
  r.service.reset();
  r.up = false;
  r.armed = false;
  stats_.held_sends_lost += r.held.size();
  r.held.clear();  // never sent: the sync they waited for did not complete
  r.must_pos = 0;
  r.view_pos = 0;
  // Records never covered by a sync may be lost, any suffix of them (effects.h: pre-prepare and committed
  // records are appended without a sync, even though the messages they accompany may have left).
  if (r.log.size() > r.synced) {
    const std::size_t keep = r.synced + prng_.below(r.log.size() - r.synced + 1);
    if (keep < r.log.size()) {
      ++stats_.unsynced_records_lost;
      r.log.resize(keep);
    }
  }
  r.synced = r.log.size();
  r.promises = PromiseIndex{};
  for (const auto& rec : r.log) r.promises.add(rec);
  net_->kill(r.id);
  r.restart_tick = now_ + prng_.range(sc_.downtime_min, sc_.downtime_max);
  ++stats_.crashes;
  event(fmt("crash r%u (%s), restart at t=%llu", r.id, how, ull(r.restart_tick)));
}

void Simulation::append_record(ReplicaNode& r, const PersistRecord& rec) {
  r.log.push_back(rec);
  r.promises.add(rec);
  if (const auto* cr = std::get_if<CheckpointRecord>(&rec); cr != nullptr && correct(r)) {
    checker_->on_checkpoint(r.id, cr->seq, cr->digest);
  }
}

void Simulation::check_promise(const ReplicaNode& r, const Send& send) {
  const PromiseIndex& p = r.promises;
  const Message& m = send.message;
  std::string broken;
  if (const auto* x = std::get_if<PrePrepare>(&m)) {
    if (p.pre_prepared.count({x->view, x->seq, x->batch.digest()}) == 0) broken = "no PrePrepareRecord";
  } else if (const auto* x = std::get_if<Prepare>(&m)) {
    if (p.pre_prepared.count({x->view, x->seq, x->digest}) == 0) broken = "no PrePrepareRecord";
  } else if (const auto* x = std::get_if<Commit>(&m)) {
    if (p.prepared.count({x->view, x->seq, x->digest}) == 0) broken = "no PreparedRecord";
  } else if (const auto* x = std::get_if<Checkpoint>(&m)) {
    if (p.checkpoints.count({x->seq, x->state_digest}) == 0) broken = "no CheckpointRecord";
  } else if (const auto* x = std::get_if<ViewChange>(&m)) {
    if (x->replica == r.id && p.view_changes.count(x->new_view) == 0) broken = "no ViewRecord{in_view_change}";
  }
  if (!broken.empty()) {
    fail(fmt("durable before sent: replica %u sent %s to %u with %s behind it", r.id, describe(m).c_str(),
             send.to, broken.c_str()));
  }
}

void Simulation::drain_replica(ReplicaNode& r) {
  Effects e = r.replica->take_effects();
  if (e.empty()) return;
  if (r.armed && !e.persist.empty()) {
    // The crash comes after the records reached the disk and before any send left: the promises were never
    // made. Sometimes the tail of this write is lost too (a torn write), which is also before any send.
    std::size_t keep = e.persist.size();
    if (prng_.chance(1, 3)) keep = prng_.below(e.persist.size() + 1);
    for (std::size_t i = 0; i < keep; ++i) append_record(r, e.persist[i]);
    ++stats_.crashes_between_persist_and_send;
    if (keep < e.persist.size()) ++stats_.torn_persists;
    crash_replica(r, fmt("after persisting %zu of %zu records, before %zu sends", keep, e.persist.size(),
                         e.sends.size())
                         .c_str());
    return;
  }
  bool must_sync = false;
  for (const auto& rec : e.persist) {
    append_record(r, rec);
    must_sync = must_sync || record_must_sync(rec);
    if (record_must_sync(rec)) r.must_pos = r.log.size();
    if (std::holds_alternative<ViewRecord>(rec)) r.view_pos = r.log.size();
  }
  if (!async_sync_) {
    if (must_sync) r.synced = r.log.size();
    for (const auto& s : e.sends) {
      if (correct(r)) check_promise(r, s);
      route(r.id, s, *r.crypto, r.byz.get());
    }
    return;
  }
  for (auto& s : e.sends) {
    const std::size_t need = send_waits_for_log(s) ? r.must_pos : r.view_pos;
    if (need <= r.synced) {
      // A send that does not wait may overtake held ones, as in the runtime (a waiting one never does: must_pos
      // only grows, and an unsynced ViewRecord is itself a must-sync record).
      if (correct(r)) check_promise(r, s);
      route(r.id, s, *r.crypto, r.byz.get());
    } else {
      ++stats_.sends_held_for_sync;
      r.held.emplace_back(need, std::move(s));
    }
  }
}

// The asynchronous sync of `r` completes: every record appended so far is durable, the held sends leave.
void Simulation::complete_sync(ReplicaNode& r) {
  r.synced = r.log.size();
  std::vector<std::pair<std::size_t, Send>> held = std::move(r.held);
  r.held.clear();
  for (auto& [need, s] : held) {
    BFT_ASSERT(need <= r.synced);
    if (correct(r)) check_promise(r, s);
    route(r.id, s, *r.crypto, r.byz.get());
  }
}

void Simulation::drain_client(ClientNode& c) {
  // Events may submit further requests (a speculating client chains on first replies): drain until quiet.
  for (;;) {
    Effects e = c.spec ? c.spec->take_effects() : c.client->take_effects();
    if (!e.persist.empty()) fail(fmt("client %u asked to persist records", c.id));
    for (const auto& s : e.sends) route(c.id, s, *c.crypto, nullptr);
    if (!c.spec) {
      for (const auto& comp : c.client->take_completions()) on_completion(c, comp, FinalKind::kPlain);
      return;
    }
    std::vector<SpecEvent> events = c.spec->take_events();
    if (events.empty()) return;
    for (SpecEvent& ev : events) on_spec_event(c, ev);
  }
}

void Simulation::route(NodeId from, const Send& send, const Crypto& crypto, Byzantine* byz) {
  auto put = [&](NodeId to, Bytes frame) {
    if (byz != nullptr) byz->mangle(frame);
    net_->send(from, to, std::move(frame), now_);
  };
  if (send.to == kAllReplicas) {
    const Bytes unsealed = encode_unsealed(send.message, from);
    for (NodeId to = 0; to < sc_.n; ++to) {
      if (to != from) put(to, seal_for(unsealed, to, crypto));
    }
    return;
  }
  if (send.to == from || send.to >= nodes_) {
    if (byz == nullptr) fail(fmt("node %u sent %s to node %u", from, describe(send.message).c_str(), send.to));
    return;
  }
  put(send.to, encode_frame(send.message, from, send.to, crypto));
}

void Simulation::deliver(Packet& p) {
  ++step_;
  const bool to_replica = p.to < sc_.n;
  const Crypto& crypto = to_replica ? *replicas_[p.to]->crypto : *clients_[p.to - sc_.n]->crypto;
  Decoded d = decode_frame(p.frame, sc_.n, crypto);
  fingerprint_ = mix(fingerprint_, (now_ << 16) ^ (std::uint64_t{p.from} << 8) ^ p.to);
  if (p.frame.size() >= kMacBytes) {
    std::uint64_t tail = 0;
    for (std::size_t i = 0; i < 8; ++i) tail = (tail << 8) | p.frame[p.frame.size() - 1 - i];
    fingerprint_ = mix(fingerprint_, tail);
  }
  if (!d.ok()) {
    ++stats_.frames_rejected;
    const auto reason = static_cast<std::size_t>(d.reject);
    ++stats_.rejected_by_reason[reason < kRejectSlots ? reason : kRejectSlots - 1];
    event(fmt("reject %u->%u %zuB: %s", p.from, p.to, p.frame.size(), std::string(to_string(d.reject)).c_str()));
    return;
  }
  if (to_replica && !replicas_[p.to]->up) {
    // Sent while the replica was down (to its next incarnation): the process is not there to receive it.
    event(fmt("drop %u->%u %s: replica down", d.sender, p.to, describe(d.message).c_str()));
    return;
  }
  event(fmt("deliver %u->%u %s", d.sender, p.to, describe(d.message).c_str()));
  if (to_replica) {
    ReplicaNode& r = *replicas_[p.to];
    if (r.byz) {
      r.byz->observe(d.sender, d.message);
      std::vector<Byzantine::Injection> injected;
      const bool admitted = r.byz->admit(d.sender, d.message, r.replica->view(), r.replica->is_primary(), injected);
      for (auto& inj : injected) {
        event(fmt("r%u injects a fake early reply to %u", r.id, inj.to));
        net_->send(r.id, inj.to, std::move(inj.frame), now_);
      }
      if (!admitted) {
        event(fmt("r%u swallows %s", r.id, describe(d.message).c_str()));
        return;
      }
    }
    r.replica->on_message(d.sender, d.message);
    drain_replica(r);
    after_replica_step(r);
  } else {
    ClientNode& c = *clients_[p.to - sc_.n];
    if (!c.spec) {
      c.client->on_message(d.sender, d.message);
    } else {
      if (const auto* rep = std::get_if<Reply>(&d.message);
          rep != nullptr && (rep->flags & kReplySpeculative) != 0 && (rep->flags & kReplyHasResult) != 0) {
        ++stats_.early_replies_received;
        c.speculative_seen.emplace(rep->request_id, d.sender);
      }
      c.spec->on_message(d.sender, d.message);
    }
    drain_client(c);
  }
}

void Simulation::after_replica_step(ReplicaNode& r) {
  if (!r.up) return;  // crashed while draining: its pre-crash steps were checked already
  r.replica->check_invariants();
  if (!correct(r)) {
    r.replica->trim_history();
    (void)r.recording->take_final();
  } else {
    for (const auto& b : r.replica->committed_history()) checker_->on_committed(r.id, b.seq, b.digest);
    r.replica->trim_history();
    for (auto& rec : r.recording->take_final()) {
      if (config_.sabotage_results && r.id == 1) rec.result_digest.bytes[0] ^= 1;
      if (config_.verbose) {
        event(fmt("final r%u s%llu c%u r%llu %s", r.id, ull(rec.seq), rec.client, ull(rec.request_id),
                  rec.result_digest.short_hex().c_str()));
      }
      checker_->on_final(r.id, rec);
    }
    if (!r.recording->contract_error().empty()) {
      fail(fmt("service contract: replica %u: %s", r.id, r.recording->contract_error().c_str()));
    }
  }
  if (checker_->failed()) fail(checker_->violation());
  if (!log_error_.empty()) fail("ERROR logged: " + log_error_);
}

void Simulation::on_completion(ClientNode& c, const Completion& comp, FinalKind final_kind) {
  checker_->on_completion(c.id, comp, step_, final_kind);
  auto it = c.outstanding.find(comp.request_id);
  OpKind kind = OpKind::kNull;
  if (it != c.outstanding.end()) {
    kind = it->second;
    c.outstanding.erase(it);
  }
  std::string detail;
  if (sc_.counter) {
    std::span<const std::uint8_t> inner = comp.result;
    shim::ShimResult sr;
    if (sc_.shim && shim::decode_envelope_result(comp.result, sr)) {
      detail = fmt(" %s", std::string(shim::to_string(sr.status)).c_str());
      inner = sr.inner;
    }
    CounterResult res;
    if (parse_counter_result(inner, res)) {
      detail += fmt(" status=%u value=%llu", res.status, ull(res.value));
      // The next increment presents the token of this reply (a refused one tells the token to use). A
      // speculating client keeps its own chain of tokens (spec_on_final).
      if (kind == OpKind::kIncrement && c.spec_window == 0) c.token = res.next_token;
    }
  }
  const char* how = final_kind == FinalKind::kCommit ? " commit" : (final_kind == FinalKind::kRollback ? " ROLLBACK" : "");
  event(fmt("complete c%u r%llu %s v%llu%s%s%s", c.id, ull(comp.request_id), to_string(kind).c_str(), ull(comp.view),
            comp.read_only ? " read-only" : "", how, detail.c_str()));
  ++c.completed;
  c.newest_completed = std::max(c.newest_completed, comp.request_id);
  if (phase_ == Phase::kLiveness) ++c.completed_after_heal;
  c.next_submit_tick = now_ + prng_.below(std::uint64_t{sc_.think_ticks_max} + 1);
  if (checker_->failed()) fail(checker_->violation());
}

void Simulation::on_spec_event(ClientNode& c, SpecEvent& ev) {
  // The checker sees whole result envelopes, as the replicas returned them (decode_result is canonical).
  Bytes envelope = shim::encode_envelope_result(ev.status, ev.result);
  if (ev.kind == SpecEventKind::kFirst) {
    checker_->on_first(c.id, ev.id, envelope);
    const bool speculative = c.speculative_seen.count({ev.id, ev.from}) != 0;
    stats_.speculative_firsts += speculative ? 1 : 0;
    event(fmt("first c%u r%llu from r%u%s %s %s", c.id, ull(ev.id), ev.from, speculative ? " (early)" : "",
              std::string(shim::to_string(ev.status)).c_str(), digest_of(envelope).short_hex().c_str()));
    if (checker_->failed()) fail(checker_->violation());
    if (c.spec_window == 0 || c.dead.count(ev.id) != 0) return;
    // Speculate only on the newest live increment's reply, and only on a successful increment.
    CounterResult cr;
    if (c.waiting_first && !c.chain.empty() && c.chain.back() == ev.id && ev.status == shim::ShimStatus::kExecuted &&
        parse_counter_result(ev.result, cr) && cr.status == 0) {
      c.token = cr.next_token;
      c.waiting_first = false;
      spec_pump(c);
    }
    return;
  }
  c.speculative_seen.erase(c.speculative_seen.lower_bound({ev.id, 0}), c.speculative_seen.upper_bound({ev.id, ~NodeId{0}}));
  Completion comp;
  comp.request_id = ev.id;
  comp.wire_request_id = ev.id;
  comp.result = std::move(envelope);
  on_completion(c, comp, ev.kind == SpecEventKind::kRollback ? FinalKind::kRollback : FinalKind::kCommit);
  if (c.spec_window > 0) spec_on_final(c, ev);
}

void Simulation::spec_pump(ClientNode& c) {
  while (!c.stopped && !c.recovering && !c.waiting_first && c.chain.size() < c.spec_window &&
         now_ >= c.next_submit_tick) {
    spec_submit(c);
  }
}

void Simulation::spec_submit(ClientNode& c) {
  BFT_ASSERT(!c.waiting_first);
  BFT_ASSERT(!c.recovering);
  // The newest live increment had its first reply delivered (that is where the token comes from): the new one
  // is predicated on it. With nothing live, the token comes from a final result and needs no predicate.
  std::vector<SpecDependency> deps;
  if (!c.chain.empty()) deps.push_back(SpecDependency{c.chain.back(), std::nullopt});
  ++step_;
  const std::uint64_t rid = c.spec->submit(counter_increment_op(c.token), deps);
  checker_->on_submit(c.id, rid, OpKind::kIncrement, step_);
  c.outstanding[rid] = OpKind::kIncrement;
  c.chain.push_back(rid);
  c.waiting_first = true;
  ++stats_.submitted;
  event(deps.empty() ? fmt("submit c%u r%llu increment", c.id, ull(rid))
                     : fmt("submit c%u r%llu increment on r%llu", c.id, ull(rid), ull(deps[0].id)));
  if (checker_->failed()) fail(checker_->violation());
}

void Simulation::spec_on_final(ClientNode& c, const SpecEvent& ev) {
  CounterResult cr;
  const bool executed = ev.status == shim::ShimStatus::kExecuted && parse_counter_result(ev.result, cr);
  if (c.dead.erase(ev.id) != 0) {
    // It relied on a failed prediction: the replicas must have made it a no-op (NSDI'09 §3.2).
    ++stats_.spec_dead_finals;
    if (executed) {
      fail(fmt("speculation: client %u increment r%llu relied on a failed prediction but executed (value %llu)", c.id,
               ull(ev.id), ull(cr.value)));
    }
    spec_resume(c);
    return;
  }
  auto it = std::find(c.chain.begin(), c.chain.end(), ev.id);
  if (it == c.chain.end()) fail(fmt("speculation: client %u got a final event for r%llu, not in flight", c.id, ull(ev.id)));
  const bool newest = it + 1 == c.chain.end();
  if (executed) {
    // Every increment of a speculating client presents the token of the result it was predicated on, or of a
    // final one: a refused token means a prediction that failed was acted on anyway.
    if (cr.status != 0) {
      fail(fmt("speculation: client %u increment r%llu reached the counter with a stale token", c.id, ull(ev.id)));
    }
    if (ev.id > c.committed_id) {
      c.committed_id = ev.id;
      c.committed_token = cr.next_token;
    }
  }
  if (ev.kind == SpecEventKind::kCommit && executed) {
    c.chain.erase(it);
    if (newest && c.waiting_first) {  // no first reply was used (withheld, or none came first): now it is known
      c.token = cr.next_token;
      c.waiting_first = false;
    }
    spec_resume(c);
    return;
  }
  // A rollback or a no-op: everything after it in the chain relied on it.
  for (auto later = it + 1; later != c.chain.end(); ++later) c.dead.insert(*later);
  c.chain.erase(it, c.chain.end());
  c.recovering = true;
  c.waiting_first = false;
  spec_resume(c);
}

void Simulation::spec_resume(ClientNode& c) {
  // Finals may arrive in any order: an older increment may still be in flight when a newer one failed, so
  // recovery waits for the chain and the dead to drain, whichever way each of them ends.
  if (c.recovering && c.chain.empty() && c.dead.empty()) {
    c.recovering = false;
    c.token = c.committed_token;
    event(fmt("c%u resumes from r%llu", c.id, ull(c.committed_id)));
  }
  spec_pump(c);
}

void Simulation::workload(ClientNode& c) {
  if (c.stopped) return;
  if (phase_ == Phase::kLiveness && c.completed_after_heal >= kLivenessOps) {
    c.stopped = true;
    return;
  }
  if (c.spec_window > 0) {
    spec_pump(c);
    drain_client(c);
    return;
  }
  const std::size_t window = c.pipelining ? kPipelineWindow : 1;
  while (in_flight(c) < window && now_ >= c.next_submit_tick) submit_one(c, true);
}

void Simulation::submit_one(ClientNode& c, bool allow_read) {
  Bytes op;
  OpKind kind = OpKind::kNull;
  bool read_only = false;
  if (!sc_.counter) {
    op = null_op(static_cast<std::uint32_t>(prng_.below(64)), static_cast<std::uint32_t>(prng_.below(32)));
  } else if (allow_read && prng_.below(100) < sc_.read_percent) {
    op = counter_read_op();
    kind = OpKind::kRead;
    read_only = true;
  } else {
    op = counter_increment_op(c.token);
    kind = OpKind::kIncrement;
  }
  ++step_;
  const std::uint64_t rid =
      c.spec ? c.spec->submit(std::move(op), {}, read_only) : c.client->submit(std::move(op), read_only);
  checker_->on_submit(c.id, rid, kind, step_);
  c.outstanding[rid] = kind;
  ++stats_.submitted;
  event(fmt("submit c%u r%llu %s", c.id, ull(rid), to_string(kind).c_str()));
  drain_client(c);
  if (checker_->failed()) fail(checker_->violation());
}

void Simulation::faults() {
  // Restarts first, so that a slot in the fault budget frees up.
  for (auto& r : replicas_) {
    if (!r->up && now_ >= r->restart_tick) {
      ++stats_.restarts;
      start_replica(*r, true);
    }
  }
  for (auto& r : replicas_) {
    if (r->up && r->armed && now_ >= r->armed_deadline) crash_replica(*r, "armed crash deadline");
  }
  if (sc_.crash_ppm > 0 && prng_.chance(sc_.crash_ppm, kPpm) && faulty_now() < sc_.f) {
    std::vector<ReplicaNode*> candidates;
    for (auto& r : replicas_) {
      if (r->up && !r->armed && correct(*r)) candidates.push_back(r.get());
    }
    if (!candidates.empty()) {
      ReplicaNode& r = *candidates[prng_.below(candidates.size())];
      if (prng_.chance(1, 2)) {
        r.armed = true;
        r.armed_deadline = now_ + kArmedCrashTicksMax;
        event(fmt("arm crash r%u (between its next persist and send)", r.id));
      } else {
        crash_replica(r, "between steps");
      }
    }
  }
  if (sc_.mode == Mode::kAllCrash && now_ == sc_.all_crash_tick) {
    ++stats_.all_crashes;
    event("crash every replica at once");
    for (auto& r : replicas_) {
      if (r->up) crash_replica(*r, "all at once");
    }
  }
  // Partitions: every node on a random side, for a while.
  if (net_->partitioned() && now_ >= partition_end_) {
    net_->set_partition(std::vector<std::uint8_t>(nodes_, 0));
    event("partition healed");
  } else if (!net_->partitioned() && sc_.partition_ppm > 0 && prng_.chance(sc_.partition_ppm, kPpm)) {
    std::vector<std::uint8_t> side(nodes_);
    std::string desc;
    for (NodeId i = 0; i < nodes_; ++i) {
      side[i] = static_cast<std::uint8_t>(prng_.below(2));
      desc += side[i] != 0 ? '1' : '0';
    }
    net_->set_partition(side);
    partition_end_ = now_ + prng_.range(50, 400);
    ++stats_.partitions;
    event(fmt("partition %s until t=%llu", desc.c_str(), ull(partition_end_)));
  }
  // Slow links: a slow node (all its links) or one slow direction.
  for (std::size_t i = 0; i < slow_.size();) {
    if (now_ >= slow_[i].until) {
      net_->set_slow(slow_[i].from, slow_[i].to, 0);
      slow_[i] = slow_.back();
      slow_.pop_back();
    } else {
      ++i;
    }
  }
  if (sc_.slow_ppm > 0 && slow_.empty() && prng_.chance(sc_.slow_ppm, kPpm)) {
    const auto extra = static_cast<std::uint32_t>(prng_.range(10, 80));
    const std::uint64_t until = now_ + prng_.range(100, 600);
    const auto x = static_cast<NodeId>(prng_.below(nodes_));
    if (prng_.chance(1, 2)) {
      for (NodeId y = 0; y < nodes_; ++y) {
        if (y == x) continue;
        net_->set_slow(x, y, extra);
        net_->set_slow(y, x, extra);
        slow_.push_back(SlowLink{x, y, until});
        slow_.push_back(SlowLink{y, x, until});
      }
      event(fmt("slow node %u +%u ticks until t=%llu", x, extra, ull(until)));
    } else {
      const auto y = static_cast<NodeId>((x + 1 + prng_.below(nodes_ - 1)) % nodes_);
      net_->set_slow(x, y, extra);
      slow_.push_back(SlowLink{x, y, until});
      event(fmt("slow link %u->%u +%u ticks until t=%llu", x, y, extra, ull(until)));
    }
    ++stats_.slow_links;
  }
}

void Simulation::tick_once() {
  if (phase_ == Phase::kFault) faults();
  for (auto& r : replicas_) {
    if (!r->up || !r->byz) continue;
    for (auto& inj : r->byz->on_tick(r->replica->view(), r->replica->stable_checkpoint())) {
      if (inj.to == r->id || inj.to >= nodes_) continue;
      net_->send(r->id, inj.to, std::move(inj.frame), now_);
    }
  }
  for (auto& c : clients_) workload(*c);
  Packet p;
  while (net_->pop_due(now_, p)) deliver(p);
  for (auto& r : replicas_) {
    if (!r->up) continue;
    if (async_sync_ && async_prng_.chance(1, 2)) complete_sync(*r);
    if (r->replica->batch_held()) {
      ++stats_.batch_holds;
      if (hold_prng_.chance(1, 2)) {
        ++step_;
        r->replica->end_batch_hold();
        drain_replica(*r);
        after_replica_step(*r);
        if (!r->up) continue;  // crashed between persist and send
      }
    }
    ++step_;
    r->replica->set_wall_clock_ns(now_ * 1'000'000 + r->clock_skew_ns);
    r->replica->on_tick();
    drain_replica(*r);
    after_replica_step(*r);
  }
  for (auto& c : clients_) {
    ++step_;
    if (c->spec) {
      c->spec->on_tick();
    } else {
      c->client->on_tick();
    }
    drain_client(*c);
  }
  ++now_;
}

void Simulation::start_liveness() {
  phase_ = Phase::kLiveness;
  liveness_start_ = now_;
  net_->heal();
  slow_.clear();
  NetworkOptions o = net_->options();
  o.loss_ppm = 0;
  net_->set_options(o);
  event("liveness phase: network healed, crashed replicas restart");
  for (auto& r : replicas_) {
    r->armed = false;
    if (!r->up) {
      ++stats_.restarts;
      start_replica(*r, true);
    }
  }
}

bool Simulation::clients_done() const {
  for (const auto& c : clients_) {
    if (!c->stopped || in_flight(*c) != 0) return false;
  }
  return true;
}

std::uint64_t Simulation::target_seq() const {
  std::uint64_t target = checker_->max_committed_seq();
  for (const auto& r : replicas_) {
    if (correct(*r) && r->up) target = std::max(target, r->replica->last_committed());
  }
  return target;
}

bool Simulation::at_target(const ReplicaNode& r, std::uint64_t target) const {
  return r.up && r.replica->last_committed() == target && r.replica->last_executed() == target;
}

bool Simulation::converged(std::string* why) const {
  const std::uint64_t target = target_seq();
  for (const auto& r : replicas_) {
    if (!correct(*r)) continue;
    const Replica& x = *r->replica;
    if (!at_target(*r, target)) {
      if (why != nullptr) {
        *why = fmt("replica %u: view %llu%s last_committed %llu last_executed %llu stable %llu, target %llu", r->id,
                   ull(x.view()), x.in_view_change() ? " (changing)" : "", ull(x.last_committed()),
                   ull(x.last_executed()), ull(x.stable_checkpoint()), ull(target));
      }
      return false;
    }
  }
  return true;
}

void Simulation::finish() {
  phase_ = Phase::kFinish;
  // The counter value of every correct replica that executed the whole agreed history (a lagging replica's
  // value is checked when it has caught up, in a later run of the same seed it may never be).
  std::vector<std::pair<NodeId, std::uint64_t>> values;
  const std::uint64_t target = target_seq();
  for (const auto& r : replicas_) {
    if (correct(*r) && r->counter != nullptr && at_target(*r, target)) values.emplace_back(r->id, r->counter->value());
  }
  checker_->finish(values);
  if (checker_->failed()) fail(checker_->violation());
}

void Simulation::collect_stats() {
  stats_.ticks = now_;
  stats_.steps = step_;
  ReplicaStats total;
  for (const auto& r : replicas_) {
    add_stats(total, r->past);
    stats_.service_rollbacks += r->past_service_rollbacks;
    if (r->up) {
      add_stats(total, r->replica->stats());
      stats_.service_rollbacks += r->recording->rollbacks();
    }
    if (r->byz) {
      stats_.byzantine_lies += r->byz->lies();
      stats_.early_lies += r->byz->early_lies();
      stats_.fake_early_replies += r->byz->fake_early_replies();
    }
  }
  stats_.requests_executed = total.requests_executed;
  stats_.view_changes_started = total.view_changes_started;
  stats_.view_changes_deferred_lagging = total.view_changes_deferred_lagging;
  stats_.new_views_installed = total.new_views_installed;
  stats_.state_transfers = total.state_transfers;
  stats_.replica_rollbacks = total.rollbacks;
  stats_.early_replies_sent = total.early_replies;
  stats_.quiet_batches = total.quiet_batches;
  stats_.quiet_releases = total.quiet_releases;
  stats_.open_batches_discarded = total.open_batches_discarded;
  stats_.requests_deferred_order = total.requests_deferred_order;
  stats_.replica_rejected = total.rejected_bad_authenticator + total.rejected_bad_signature +
                            total.rejected_out_of_window + total.rejected_wrong_view + total.rejected_conflict +
                            total.rejected_invalid;
  if (checker_) {
    stats_.completed = checker_->completions();
    stats_.read_completions = checker_->read_completions();
    stats_.committed_seqs = checker_->max_committed_seq();
  }
  for (const auto& c : clients_) {
    const ClientStats& cs = core_stats(*c);
    stats_.client_retransmissions += cs.retransmissions;
    stats_.read_only_fallbacks += cs.read_only_fallbacks;
    stats_.replies_rejected += cs.replies_rejected;
    if (c->spec) {
      const SpecClientStats& ss = c->spec->stats();
      stats_.first_delivered += ss.first_delivered;
      stats_.first_withheld_distrusted += ss.first_withheld_distrusted;
      stats_.first_withheld_doomed += ss.first_withheld_doomed;
      stats_.spec_commits += ss.commits;
      stats_.spec_rollbacks += ss.rollbacks;
    }
  }
  if (checker_) stats_.shim_retries = checker_->shim_retries();
  if (net_) {
    const NetworkStats& n = net_->stats();
    stats_.frames_sent = n.sent;
    stats_.frames_delivered = n.delivered;
    stats_.frames_lost = n.lost;
    stats_.frames_duplicated = n.duplicated;
    stats_.frames_partitioned = n.partitioned;
    stats_.frames_to_dead_nodes = n.to_dead_node;
  }
  stats_.fingerprint = fingerprint_;
}

SimResult Simulation::run() {
  SimResult result;
  result.seed = config_.seed;
  const LogLevel old_level = log_level();
  log_set_level(config_.verbose ? LogLevel::kDebug : LogLevel::kWarn);
  log_set_sink([this](LogLevel level, std::string_view line) { on_log(level, line); });
  g_running = this;
  try {
    setup();
    result.scenario = sc_.describe();
    phase_ = Phase::kFault;
    while (now_ < config_.fault_ticks) tick_once();
    start_liveness();
    // Stage 1: every client finishes kLivenessOps more requests. Stage 2: the correct replicas converge on the
    // agreed history. A correct replica that entered a view change alone cannot rejoin while the others stay
    // in their view (sim/FINDINGS.md), so if stage 2 does not finish within a grace period the run instead
    // requires that one further request completes (stage 3), and counts the replicas left behind.
    enum class Stage { kClients, kConverge, kProbe, kSettle } stage = Stage::kClients;
    std::uint64_t converge_start = 0;
    std::uint64_t settle_start = 0;
    std::string why;
    for (;;) {
      if (now_ - liveness_start_ >= config_.liveness_ticks_max) {
        std::string outstanding;
        for (const auto& c : clients_) {
          if (in_flight(*c) != 0 || !c->stopped) {
            outstanding += fmt(" client %u: %zu in flight (oldest r%llu, newest completed r%llu), %llu of %llu "
                               "done, %llu completed in all;",
                               c->id, in_flight(*c),
                               ull(c->outstanding.empty() ? 0 : c->outstanding.begin()->first),
                               ull(c->newest_completed), ull(c->completed_after_heal), ull(kLivenessOps),
                               ull(core_stats(*c).completed));
          }
        }
        (void)converged(&why);
        const char* stage_name = stage == Stage::kClients   ? "clients finishing"
                                 : stage == Stage::kConverge ? "replicas converging"
                                 : stage == Stage::kProbe    ? "a further request completing"
                                                             : "settling";
        fail(fmt("liveness: stuck at %s %llu ticks after the network healed:%s %s", stage_name,
                 ull(config_.liveness_ticks_max), outstanding.empty() ? " clients done;" : outstanding.c_str(),
                 why.empty() ? "replicas converged" : why.c_str()));
      }
      tick_once();
      if (stage == Stage::kClients && clients_done()) {
        stage = Stage::kConverge;
        converge_start = now_;
      }
      if (stage == Stage::kConverge) {
        if (converged(nullptr)) break;
        if (now_ - converge_start >= kConvergeGraceTicks) {
          (void)converged(&why);
          event("not converged (" + why + "): a further request must complete");
          why.clear();
          stage = Stage::kProbe;
          ++stats_.probes;
          ClientNode& c = *clients_.front();
          c.next_submit_tick = now_;
          if (c.spec_window > 0) {
            spec_submit(c);  // nothing is in flight: an increment on the committed token, without predicates
            drain_client(c);
          } else {
            submit_one(c, false);  // ordered: it must go through agreement
          }
        }
      } else if (stage == Stage::kProbe && clients_done() && checker_->pending_completions() == 0) {
        // (An accepted result may rest on 2f+1 tentative replies: wait until it is final somewhere.) Then give
        // the others a moment to execute it too, and count who is still behind.
        stage = Stage::kSettle;
        settle_start = now_;
      } else if (stage == Stage::kSettle && (converged(nullptr) || now_ - settle_start >= kSettleTicks)) {
        const std::uint64_t target = target_seq();
        for (const auto& r : replicas_) {
          if (correct(*r) && !at_target(*r, target)) {
            ++stats_.lagging_replicas;
            event(fmt("lagging r%u: view %llu%s last_committed %llu, target %llu", r->id, ull(r->replica->view()),
                      r->replica->in_view_change() ? " (changing)" : "", ull(r->replica->last_committed()),
                      ull(target)));
          }
        }
        break;
      }
    }
    stats_.liveness_ticks = now_ - liveness_start_;
    finish();
    result.passed = true;
  } catch (const Violation& v) {
    result.passed = false;
    std::string repro = fmt("bftfs-sim --seed %llu --ticks %llu", ull(config_.seed), ull(config_.fault_ticks));
    if (config_.f != 0) repro += fmt(" --f %u", config_.f);
    if (!config_.scenario.empty()) repro += " --scenario " + config_.scenario;
    if (!config_.service.empty()) repro += " --service " + config_.service;
    if (!config_.byzantine) repro += " --no-byzantine";
    if (config_.speculation >= 0) repro += fmt(" --cs %d", config_.speculation);
    result.failure = fmt("FAIL seed=%llu step=%llu tick=%llu phase=%s: ", ull(config_.seed), ull(step_), ull(now_),
                         phase_name()) +
                     v.what + "\n  scenario: " + sc_.describe() + "\n  reproduce: " + repro + " -v\n  last " +
                     std::to_string(trace_.size()) + " events:\n" + trace_text();
  }
  if (result.scenario.empty()) result.scenario = sc_.describe();
  collect_stats();
  result.stats = stats_;
  g_running = nullptr;
  log_set_sink(nullptr);
  log_set_level(old_level);
  // Cores go before the services and crypto they refer to (members are destroyed in reverse order, and
  // ReplicaNode declares the replica after its service; clients hold only their crypto).
  return result;
}

struct sigaction g_old_abort;

void on_abort(int sig) {
  // Not async-signal-safe (stdio), deliberately: the process is dying of an assertion and the trace is the
  // only way to learn which step broke it.
  if (g_running != nullptr) g_running->dump_on_abort();
  sigaction(SIGABRT, &g_old_abort, nullptr);
  raise(sig);
}

}  // namespace

SimResult run_simulation(const SimConfig& config) {
  struct sigaction sa {};
  sa.sa_handler = on_abort;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGABRT, &sa, &g_old_abort);
  SimResult result;
  {
    Simulation sim(config);
    result = sim.run();
  }
  sigaction(SIGABRT, &g_old_abort, nullptr);
  return result;
}

std::string read_regression_seeds(const std::string& path, std::vector<SimConfig>& out) {
  std::ifstream in(path);
  if (!in) return path + ": cannot read";
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    SimConfig c;
    bool empty = false;
    std::string error;
    if (!parse_regression_line(line, c, empty, error)) return path + ":" + std::to_string(lineno) + ": " + error;
    if (empty) continue;
    if (std::string bad = check_config(c); !bad.empty()) return path + ":" + std::to_string(lineno) + ": " + bad;
    out.push_back(c);
  }
  return "";
}

}  // namespace bftfs::sim
