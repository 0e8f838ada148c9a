// The seeded run (simulation.h): setup, the ticks, what the run learns from the cluster, and the two phases.
#include "sim/simulation.h"

#include <csignal>
#include <cstdio>

#include "common/assert.h"
#include "sim/mix.h"
#include "sim/strfmt.h"

namespace bftfs::sim {

namespace {

Simulation* g_running = nullptr;  // for the SIGABRT handler: the run whose trace to print
struct sigaction g_old_abort;

void on_abort(int sig) {
  // Not async-signal-safe (stdio), deliberately: the process is dying of an assertion and the trace is the
  // only way to learn which step broke it.
  if (g_running != nullptr) g_running->dump_on_abort();
  sigaction(SIGABRT, &g_old_abort, nullptr);
  raise(sig);
}

}  // namespace

Simulation::Simulation(const SimConfig& config)
    : config_(config),
      prng_(mix(config.seed, 0xFA17)),
      net_prng_(mix(config.seed, 0x4E7)),
      async_prng_(mix(config.seed, 0xA5C5)),
      async_sync_(async_prng_.chance(1, 2)),
      hold_prng_(mix(config.seed, 0xB47D)) {}

Simulation::~Simulation() = default;

// ---- setup ----

std::unique_ptr<ServiceStack> Simulation::make_stack(NodeId id, MemorySnapshotStore& store) {
  SimStackOptions o;
  o.service = sc_.service;
  o.shim = sc_.shim;
  o.shim_options = sc_.shim_options;
  o.strip_predicates = sc_.shim && config_.sabotage_predicates && cluster_->host(id).correct();
  o.corrupt_fs_writes = sc_.fs() && config_.sabotage_fs && cluster_->host(id).correct();
  o.strip_epoch_entries = sc_.fs() && config_.sabotage_epochs && cluster_->host(id).correct();
  o.fs_options = sc_.fs_options;
  return std::make_unique<SimStack>(o, store);
}

void Simulation::setup() {
  std::string error;
  if (!make_scenario(config_, sc_, error)) fail("bad configuration: " + error);
  nodes_ = sc_.n + sc_.clients;
  checker_ = std::make_unique<Checker>(sc_.counter(), sc_.shim);
  if (sc_.fs()) {
    FsOracleOptions oo;
    oo.fs = sc_.fs_options;
    oo.shim = sc_.shim_options;
    oo.checkpoint_interval = sc_.replica.checkpoint_interval;
    fs_check_ = std::make_unique<FsCheck>(oo, sc_.epoch_client != 0);
    fs_stable_.assign(sc_.n, 0);
    stats_.fs_seed = 1;
  }
  ClusterOptions co;
  co.replica = sc_.replica;
  co.clients = sc_.clients;
  co.key_seed = config_.seed;
  co.factory = [this](NodeId id, MemorySnapshotStore& store) { return make_stack(id, store); };
  const std::uint64_t seed = config_.seed;
  co.replica_seed = [seed](NodeId id, std::uint64_t incarnation) { return mix(seed, id * 1000 + incarnation); };
  co.delivery = Delivery::kNetwork;
  co.network = sc_.net;
  co.network_prng = &net_prng_;
  co.fault_prng = &prng_;
  if (sc_.all_crash_at_checkpoint) async_sync_ = true;  // else every record is durable by the end of its step
  co.async_sync = async_sync_;
  co.first_start_record = true;
  co.wall_clock_from_ticks = true;
  cluster_ = std::make_unique<Cluster>(std::move(co), static_cast<ClusterObserver*>(this));
  cluster_->network().limit_receivers(sc_.n, sc_.machine_bytes_per_tick);
  stats_.overload = sc_.overload ? 1 : 0;
  fates_.resize(sc_.n);
  for (NodeId id = 0; id < sc_.n; ++id) cluster_->host(id).clock_skew_ns = prng_.below(5'000'000);
  for (const auto& [id, strategy] : sc_.byzantine) {
    auto byz = std::make_unique<Byzantine>(strategy, id, sc_.n, nodes_, cluster_->crypto(id),
                                           mix(config_.seed, 0xB12 + id), sc_.replica.log_window);
    if (sc_.lying) byz->set_early_lies(sc_.early_lie_ppm, sc_.fake_ppm, sc_.shim, sc_.fs());
    cluster_->set_byzantine(id, std::move(byz));
  }
  stats_.cs_lying_primary = sc_.lying && !sc_.byzantine.empty() ? 1 : 0;
  stats_.byzantine_replicas = sc_.byzantine.size();
  stats_.cs_early_replies = sc_.replica.early_replies ? 1 : 0;
  stats_.cs_shim = sc_.shim ? 1 : 0;
  for (const auto& [id, st] : sc_.byzantine) stats_.reorder_primary |= st == Strategy::kReorderClient ? 1 : 0;
  make_clients();
  event("scenario " + sc_.describe());
  cluster_->start_all();
}

void Simulation::make_clients() {
  for (std::uint32_t j = 0; j < sc_.clients; ++j) {
    auto c = std::make_unique<ClientNode>();
    c->id = sc_.n + j;
    const Crypto& crypto = cluster_->crypto(c->id);
    c->pipelining = sc_.pipelining_client && j + 1 == sc_.clients;
    c->window = c->pipelining ? kPipelineWindow : sc_.client_window;
    // Overload seeds: the clients join one after another, so that the backlog builds up as load does.
    c->next_submit_tick = j * sc_.join_interval_ticks;
    ClientOptions co = sc_.client;
    co.window = static_cast<std::uint32_t>(c->window);
    // File-service clients that do not speculate are plain PBFT clients sending shim envelopes: their
    // completions say whether a read was answered read-only or fell back to ordering, and under which id.
    // An epoch client uses first replies (of its FETCHes) and keeps several requests in flight.
    const bool epochs = sc_.fs() && sc_.epoch_client == j + 1;
    if (sc_.shim && !(sc_.fs() && sc_.spec_windows[j] == 0 && !epochs)) {
      c->spec_window = sc_.spec_windows[j];
      SpecClientOptions so;
      so.client = co;
      so.client.window = epochs ? kEpochClientWindow : std::max<std::uint32_t>(c->spec_window, 1);
      so.speculate = c->spec_window > 0 || epochs;
      so.failure_window = sc_.failure_window;
      so.failure_permille_max = sc_.failure_permille_max;
      c->spec = std::make_unique<SpecClient>(so, c->id, crypto, mix(config_.seed, 0xC11 + c->id));
      stats_.cs_speculating_clients += c->spec_window > 0 ? 1 : 0;
    } else {
      c->client = std::make_unique<Client>(co, c->id, crypto, mix(config_.seed, 0xC11 + c->id));
    }
    if (sc_.fs()) make_fs_client(*c);
    if (epochs) make_epoch_client(*c);
    c->token = counter_initial_token(c->id);
    c->committed_token = c->token;
    stats_.pipelined_clients += c->window > 1 || c->spec_window > 1 ? 1 : 0;
    ClientNode* node = c.get();
    cluster_->client(c->id).receive = [this, node](NodeId from, const Message& m) { receive(*node, from, m); };
    clients_.push_back(std::move(c));
  }
}

// ---- what the run learns from the cluster ----

void Simulation::event(const std::string& line) {
  std::string full = fmt("t=%llu #%llu ", ull(now()), ull(steps())) + line;
  if (config_.verbose) std::printf("%s\n", full.c_str());
  if (config_.trace_events == 0) return;
  if (trace_.size() < config_.trace_events) {
    trace_.push_back(std::move(full));
  } else {
    trace_[trace_next_] = std::move(full);
    trace_next_ = (trace_next_ + 1) % trace_.size();
  }
}

void Simulation::on_record(const ReplicaHost& r, const PersistRecord& rec) {
  if (const auto* cr = std::get_if<CheckpointRecord>(&rec); cr != nullptr && r.correct()) {
    checker_->on_checkpoint(r.id, cr->seq, cr->digest);
  }
}

void Simulation::on_crashing(ReplicaHost& r) { fates_[r.id].past_service_rollbacks += stack(r).recording->rollbacks(); }

void Simulation::on_crashed(ReplicaHost& r, const std::string& how) {
  fates_[r.id].restart_tick = now() + prng_.range(sc_.downtime_min, sc_.downtime_max);
  event(fmt("crash r%u (%s), restart at t=%llu", r.id, how.c_str(), ull(fates_[r.id].restart_tick)));
}

void Simulation::after_replica_step(ReplicaHost& r) {
  RecordingService& recording = *stack(r).recording;
  if (!r.correct()) {
    r.replica->trim_history();
    (void)recording.take_final();
    (void)recording.take_checkpoints();
  } else {
    for (const auto& b : r.replica->committed_history()) checker_->on_committed(r.id, b.seq, b.digest);
    r.replica->trim_history();
    std::vector<ExecRecord> finals = recording.take_final();
    for (auto& rec : finals) {
      if (config_.sabotage_results && r.id == 1) rec.result_digest.bytes[0] ^= 1;
      if (config_.verbose) {
        event(fmt("final r%u s%llu c%u r%llu %s", r.id, ull(rec.seq), rec.client, ull(rec.request_id),
                  rec.result_digest.short_hex().c_str()));
      }
      checker_->on_final(r.id, rec);
    }
    if (!recording.contract_error().empty()) {
      fail(fmt("service contract: replica %u: %s", r.id, recording.contract_error().c_str()));
    }
    if (stack(r).audit && !stack(r).audit->violation().empty()) {
      fail(fmt("replica %u: %s", r.id, stack(r).audit->violation().c_str()));
    }
    check_checker();
    if (fs_check_) fs_after_step(r, finals);
  }
  check_checker();
  if (!log_error_.empty()) fail("ERROR logged: " + log_error_);
  if (sc_.overload && r.correct() && r.replica->stats().view_changes_started > 0) {
    // Every replica is correct and nothing fails: the primary orders everything it receives, only slower than
    // the clients send. A view change would be queueing taken for a faulty primary.
    fail(fmt("overload: correct replica %u started a view change (view %llu) with a correct primary; the machine "
             "has %llu frames waiting",
             r.id, ull(r.replica->view()), ull(cluster_->network().backlog())));
  }
}

// ---- ticks ----

void Simulation::tick_once() {
  if (phase_ == Phase::kFault) faults();
  cluster_->byzantine_tick();
  for (auto& c : clients_) workload(*c);
  if (sc_.overload) {
    std::uint64_t in_flight = 0;
    for (const auto& c : clients_) in_flight += c->in_flight();
    stats_.overload_in_flight_max = std::max(stats_.overload_in_flight_max, in_flight);
  }
  cluster_->deliver_due();
  tick_replicas();
  for (auto& c : clients_) {
    cluster_->next_step();
    if (c->spec) {
      c->spec->on_tick();
    } else {
      c->client->on_tick();
    }
    drain_client(*c);
  }
  cluster_->advance();
}

void Simulation::tick_replicas() {
  for (NodeId id = 0; id < sc_.n; ++id) {
    ReplicaHost& r = cluster_->host(id);
    if (!r.up) continue;
    if (async_sync_ && async_prng_.chance(1, 2)) cluster_->complete_sync(id);
    if (r.replica->batch_held()) {
      ++stats_.batch_holds;
      if (hold_prng_.chance(1, 2)) {
        cluster_->end_batch_hold(id);
        if (!r.up) continue;  // crashed between persist and send
      }
    }
    cluster_->tick_replica(id);
  }
}

// ---- the phases ----

void Simulation::fault_phase() {
  phase_ = Phase::kFault;
  while (now() < config_.fault_ticks) tick_once();
}

void Simulation::start_liveness() {
  phase_ = Phase::kLiveness;
  liveness_start_ = now();
  Network& net = cluster_->network();
  net.heal();
  slow_.clear();
  NetworkOptions o = net.options();
  o.loss_ppm = 0;
  net.set_options(o);
  event("liveness phase: network healed, crashed replicas restart");
  for (NodeId id = 0; id < sc_.n; ++id) {
    ReplicaHost& r = cluster_->host(id);
    r.armed = false;
    if (!r.up) {
      ++stats_.restarts;
      cluster_->restart(id);
    }
  }
}

// Stage 1: every client finishes kLivenessOps more requests. Stage 2: the correct replicas converge on the
// agreed history. A correct replica that entered a view change alone cannot rejoin while the others stay in their
// view (sim/FINDINGS.md), so if stage 2 does not finish within a grace period the run instead requires that one
// further request completes (stage 3), and counts the replicas left behind (stage 4, settling).
void Simulation::liveness_phase() {
  start_liveness();
  enum class Stage { kClients, kConverge, kProbe, kSettle };
  static constexpr const char* kStageNames[] = {"clients finishing", "replicas converging",
                                                "a further request completing", "settling"};
  Stage stage = Stage::kClients;
  std::uint64_t since = 0;  // when stage 2 or 4 began
  for (;;) {
    if (now() - liveness_start_ >= config_.liveness_ticks_max) fail_liveness(kStageNames[static_cast<int>(stage)]);
    tick_once();
    if (stage == Stage::kClients && clients_done()) {
      stage = Stage::kConverge;
      since = now();
    }
    if (stage == Stage::kConverge) {
      if (converged(nullptr)) return;
      if (now() - since >= kConvergeGraceTicks) {
        stage = Stage::kProbe;
        probe();
      }
    } else if (stage == Stage::kProbe && clients_done() && checker_->pending_completions() == 0) {
      // (An accepted result may rest on 2f+1 tentative replies: wait until it is final somewhere.) Then give
      // the others a moment to execute it too, and count who is still behind.
      stage = Stage::kSettle;
      since = now();
    } else if (stage == Stage::kSettle && (converged(nullptr) || now() - since >= kSettleTicks)) {
      count_lagging();
      return;
    }
  }
}

void Simulation::probe() {
  std::string why;
  (void)converged(&why);
  event("not converged (" + why + "): a further request must complete");
  ++stats_.probes;
  ClientNode& c = *clients_.front();
  c.next_submit_tick = now();
  if (c.spec_window > 0) {
    // Nothing is in flight: a request without predicates (an increment on the committed token), ordered.
    if (sc_.fs()) {
      fs_spec_submit(c, false);
    } else {
      spec_submit(c);
    }
    drain_client(c);
  } else {
    submit_one(c, false);  // ordered: it must go through agreement
  }
}

void Simulation::fail_liveness(const char* stage) {
  std::string outstanding;
  for (const auto& c : clients_) {
    if (c->in_flight() != 0 || !c->stopped) {
      outstanding += fmt(" client %u: %zu in flight (oldest r%llu, newest completed r%llu), %llu of %llu "
                         "done, %llu completed in all;",
                         c->id, c->in_flight(), ull(c->outstanding.empty() ? 0 : c->outstanding.begin()->first),
                         ull(c->newest_completed), ull(c->completed_after_heal), ull(kLivenessOps),
                         ull(c->core_stats().completed));
    }
  }
  std::string why;
  (void)converged(&why);
  std::string epochs;
  for (const auto& c : clients_) {
    if (c->epochs && !c->epochs->finished()) epochs += " " + epoch_unfinished(*c) + ";";
  }
  fail(fmt("liveness: stuck at %s %llu ticks after the network healed:%s%s %s", stage,
           ull(config_.liveness_ticks_max), outstanding.empty() ? " clients done;" : outstanding.c_str(),
           epochs.c_str(), why.empty() ? "replicas converged" : why.c_str()));
}

bool Simulation::clients_done() const {
  for (const auto& c : clients_) {
    if (!c->stopped || c->in_flight() != 0 || (c->epochs && !c->epochs->finished())) return false;
  }
  return true;
}

std::uint64_t Simulation::target_seq() const {
  std::uint64_t target = checker_->max_committed_seq();
  for (NodeId id = 0; id < sc_.n; ++id) {
    const ReplicaHost& r = cluster_->host(id);
    if (r.correct() && r.up) target = std::max(target, r.replica->last_committed());
  }
  return target;
}

bool Simulation::at_target(const ReplicaHost& r, std::uint64_t target) const {
  return r.up && r.replica->last_committed() == target && r.replica->last_executed() == target;
}

bool Simulation::converged(std::string* why) const {
  const std::uint64_t target = target_seq();
  for (NodeId id = 0; id < sc_.n; ++id) {
    const ReplicaHost& r = cluster_->host(id);
    if (!r.correct()) continue;
    if (!at_target(r, target)) {
      if (why != nullptr) {
        const Replica& x = *r.replica;
        *why = fmt("replica %u: view %llu%s last_committed %llu last_executed %llu stable %llu, target %llu", r.id,
                   ull(x.view()), x.in_view_change() ? " (changing)" : "", ull(x.last_committed()),
                   ull(x.last_executed()), ull(x.stable_checkpoint()), ull(target));
      }
      return false;
    }
  }
  return true;
}

void Simulation::count_lagging() {
  const std::uint64_t target = target_seq();
  for (NodeId id = 0; id < sc_.n; ++id) {
    const ReplicaHost& r = cluster_->host(id);
    if (r.correct() && !at_target(r, target)) {
      ++stats_.lagging_replicas;
      event(fmt("lagging r%u: view %llu%s last_committed %llu, target %llu", r.id, ull(r.replica->view()),
                r.replica->in_view_change() ? " (changing)" : "", ull(r.replica->last_committed()), ull(target)));
    }
  }
}

void Simulation::finish() {
  phase_ = Phase::kFinish;
  // The counter value of every correct replica that executed the whole agreed history (a lagging replica's
  // value is checked when it has caught up, in a later run of the same seed it may never be).
  std::vector<std::pair<NodeId, std::uint64_t>> values;
  const std::uint64_t target = target_seq();
  for (NodeId id = 0; id < sc_.n; ++id) {
    ReplicaHost& r = cluster_->host(id);
    if (r.correct() && at_target(r, target) && stack(r).counter != nullptr) {
      values.emplace_back(r.id, stack(r).counter->value());
    }
  }
  checker_->finish(values);
  check_checker();
  for (const auto& c : clients_) {
    if (c->epochs && !c->epochs->finished()) fail(epoch_unfinished(*c));
  }
  if (fs_check_) fs_finish();
}

// ---- the file service's replica side ----

// What a correct replica's step tells the file service's checks: the agreed executions it covered, the
// checkpoints its service took or installed, and, at a new stable checkpoint, whether its file tree is consistent.
void Simulation::fs_after_step(ReplicaHost& r, const std::vector<ExecRecord>& finals) {
  RecordingService& recording = *stack(r).recording;
  max_executed_ = std::max(max_executed_, r.replica->last_executed());
  const std::uint64_t through = std::min(r.replica->last_executed(), recording.committed_through());
  fs_check_->on_progress(r.id, finals, recording.executed_from(), through);
  for (const auto& [seq, digest] : recording.take_checkpoints()) fs_check_->on_checkpoint(seq, digest);
  if (fs_check_->failed()) fail(fs_check_->violation());
  const std::uint64_t stable = r.replica->stable_checkpoint();
  if (stable == fs_stable_[r.id]) return;
  fs_stable_[r.id] = stable;
  // The walk visits every object: at every stable checkpoint while the tree is small, at every fourth after.
  if (stack(r).fs->object_count() <= kFsInvariantObjectsMax || (stable / sc_.replica.checkpoint_interval) % 4 == 0) {
    fs_check_replica(r, "at a new stable checkpoint");
  }
}

void Simulation::fs_check_replica(ReplicaHost& r, const char* when) {
  ++fs_invariant_checks_;
  const std::string why = stack(r).fs->check_invariants();
  if (why.empty()) return;
  fail(fmt("fs invariants: correct replica %u %s (last executed %llu, stable checkpoint %llu): %s", r.id, when,
           ull(r.replica->last_executed()), ull(r.replica->stable_checkpoint()), why.c_str()));
}

// The end of a file-service run: every correct replica's tree is consistent, the agreed history has no gap, the
// oracle's pending reads and checkpoints are decided, and its own trees are consistent.
void Simulation::fs_finish() {
  for (NodeId id = 0; id < sc_.n; ++id) {
    ReplicaHost& r = cluster_->host(id);
    if (r.correct() && r.up) fs_check_replica(r, "at the end");
  }
  fs_check_->finish();
  if (fs_check_->failed()) fail(fs_check_->violation());
  if (const std::string why = fs_check_->oracle().check_invariants(); !why.empty()) {
    fail("fs invariants: the oracle's " + why);
  }
  check_epoch_output();
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
    fault_phase();
    liveness_phase();
    stats_.liveness_ticks = now() - liveness_start_;
    finish();
    result.passed = true;
  } catch (const Violation& v) {
    result.passed = false;
    result.failure = failure_report(v.what);
  }
  if (result.scenario.empty()) result.scenario = sc_.describe();
  collect_stats();
  result.stats = stats_;
  g_running = nullptr;
  log_set_sink(nullptr);
  log_set_level(old_level);
  return result;
}

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

}  // namespace bftfs::sim
