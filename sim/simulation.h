// The seeded run of one seed (simulator.h: run_simulation): a Scenario (sim/scenario.h) on a Cluster in network
// mode (sim/cluster.h), with faults, clients, the checker (sim/checker.h) and a liveness phase. Private to the
// simulator's files:
//   simulation.cc  setup, the ticks, the observer of the cluster (checker feeding), the run and its liveness phase
//   faults.cc      crashes and restarts, every replica crashing at once, partitions, slow links
//   clients.cc     the clients: plain and pipelining ones, speculating counter clients, their completions
//   fs_clients.cc  the file-service clients: plain ones over the shim, speculating ones, their reads' windows
//   fs_epoch_clients.cc  the epoch clients: their program, batches, verdicts, rollbacks, output (properties 14, 15)
//   stats.cc       the run's totals (SimStats) and its failure report
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/log.h"
#include "common/prng.h"
#include "protocol/client.h"
#include "relay/spec_client.h"
#include "sim/checker.h"
#include "sim/cluster.h"
#include "sim/fs_check.h"
#include "sim/fs_epoch_client.h"
#include "sim/fs_workload.h"
#include "sim/scenario.h"
#include "sim/service_stack.h"
#include "sim/simulator.h"

namespace bftfs::sim {

inline constexpr std::uint64_t kLivenessOps = 3;          // requests each client must complete after healing
inline constexpr std::uint64_t kArmedCrashTicksMax = 40;  // a crash "between persist and send" waits this long
inline constexpr std::uint64_t kConvergeGraceTicks = 3000;  // liveness: for the replicas to converge after clients
inline constexpr std::uint64_t kSettleTicks = 1000;  // liveness: for the others to execute the further request
// File-service seeds: FsService::check_invariants runs at every stable checkpoint of a correct replica while its
// tree has at most this many objects, and at every fourth one after.
inline constexpr std::uint64_t kFsInvariantObjectsMax = 512;

// One simulated client: a protocol client core over its endpoint in the cluster, and its workload's state.
struct ClientNode {
  NodeId id = 0;
  std::unique_ptr<Client> client;    // a plain PBFT client (seeds without the shim)
  std::unique_ptr<SpecClient> spec;  // the PBFT-CS client library (shim seeds), speculating or not
  bool pipelining = false;
  std::size_t window = 1;   // a plain client's requests in flight (pipelining: kPipelineWindow; overload seeds)
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
  // A file-service client (fs seeds): its workload, drawn from a stream of its own, and each request in flight.
  // A speculating one chains requests as the counter's do (spec_window, chain, dead, waiting_first, recovering);
  // it sends a read on the read-only path only with nothing else in flight, and nothing else until it ends.
  struct FsInFlight {
    fs::Request request;
    bool read_only = false;      // sent on the read-only path
    FsOracle::ReadId read = 0;   // read_only: its window in the oracle
    std::uint64_t fallbacks_before = 0;  // read_only, speculating client: ClientStats::read_only_fallbacks then
    bool learned = false;        // the workload learned from its first reply
  };
  std::unique_ptr<FsWorkload> fs;
  // An epoch client (sim/fs_epoch_client.h) instead of the above: its program's requests go to its local model,
  // and only FETCH, RESERVE, STAGE and EPOCH requests to the replicas.
  std::unique_ptr<EpochClient> epochs;
  Prng fs_prng{0};
  std::map<std::uint64_t, FsInFlight> fs_ops;
  std::uint64_t fs_read_id = 0;  // speculating client: the read-only read in flight (0: none)
  // The client's ordered requests whose agreed seq is not known yet, and the largest agreed seq of those that
  // are: a read it sends is answered only after its last ordered request executed (Request::prev_request_id), so
  // that seq bounds the read's window from below.
  std::vector<std::uint64_t> fs_ordered;
  std::uint64_t fs_lo = 0;

  std::size_t in_flight() const { return spec ? spec->in_flight() : client->in_flight(); }
  const ClientStats& core_stats() const { return spec ? spec->client_stats() : client->stats(); }
};

// What the run keeps per replica besides the cluster's host.
struct ReplicaFate {
  std::uint64_t restart_tick = 0;            // when a crashed replica comes back (fault phase)
  std::uint64_t past_service_rollbacks = 0;  // RecordingService::rollbacks of earlier incarnations
};

class Simulation final : private ClusterObserver {
 public:
  explicit Simulation(const SimConfig& config);
  ~Simulation() override;

  SimResult run();
  // Called from the SIGABRT handler: the header and the trace, on stderr.
  void dump_on_abort() const;

 private:
  enum class Phase { kSetup, kFault, kLiveness, kFinish };

  // ---- setup and ticks (simulation.cc) ----
  void setup();
  void make_clients();
  std::unique_ptr<ServiceStack> make_stack(NodeId id, MemorySnapshotStore& store);
  void tick_once();
  void tick_replicas();
  SimStack& stack(const ReplicaHost& r) { return static_cast<SimStack&>(*r.stack); }

  // ---- ClusterObserver (simulation.cc) ----
  bool traces() const override { return true; }
  void event(const std::string& line) override;
  void on_record(const ReplicaHost& r, const PersistRecord& rec) override;
  void on_crashing(ReplicaHost& r) override;
  void on_crashed(ReplicaHost& r, const std::string& how) override;
  void after_replica_step(ReplicaHost& r) override;

  // ---- the liveness phase (simulation.cc) ----
  void fault_phase();
  void liveness_phase();
  void start_liveness();
  void probe();  // one further request that must complete (liveness stage 3)
  [[noreturn]] void fail_liveness(const char* stage);
  bool clients_done() const;
  std::uint64_t target_seq() const;
  bool at_target(const ReplicaHost& r, std::uint64_t target) const;
  bool converged(std::string* why) const;
  void count_lagging();
  void finish();

  // ---- faults (faults.cc) ----
  void faults();
  void restart_due();
  void maybe_crash();
  bool all_crash_due();
  void partitions();
  void slow_links();
  std::uint32_t faulty_now() const;

  // ---- clients (clients.cc) ----
  void workload(ClientNode& c);
  // Submits the client's next operation (a read with the scenario's odds when allow_read).
  void submit_one(ClientNode& c, bool allow_read);
  void receive(ClientNode& c, NodeId from, const Message& m);
  void drain_client(ClientNode& c);
  void on_completion(ClientNode& c, const Completion& comp, FinalKind kind);
  std::string describe_result(ClientNode& c, const Completion& comp, OpKind kind);
  // The speculating counter client (ClientNode::spec_window > 0).
  void on_spec_event(ClientNode& c, SpecEvent& ev);
  void on_first(ClientNode& c, const SpecEvent& ev, const Bytes& envelope);
  void spec_pump(ClientNode& c);    // submits while the chain may grow
  void spec_submit(ClientNode& c);  // the next increment, predicated on the newest live one
  void spec_on_final(ClientNode& c, const SpecEvent& ev);
  void spec_resume(ClientNode& c);  // after a failure: continue once nothing is in flight

  // ---- file-service clients (fs_clients.cc) ----
  void make_fs_client(ClientNode& c);
  void fs_submit(ClientNode& c, bool allow_read);  // a plain client's next request
  void fs_register(ClientNode& c, std::uint64_t rid, ClientNode::FsInFlight f, std::uint64_t step,
                   const FsWorkRequest& w, const std::string& how);
  std::uint64_t fs_read_lo(ClientNode& c);
  std::string fs_completed(ClientNode& c, const Completion& comp, FinalKind kind);
  void fs_end_read(ClientNode& c, const Completion& comp, const ClientNode::FsInFlight& f);
  void fs_on_first(ClientNode& c, const SpecEvent& ev);
  void fs_spec_pump(ClientNode& c);
  void fs_spec_submit(ClientNode& c, bool allow_read);
  void fs_spec_on_final(ClientNode& c, const SpecEvent& ev);
  void fs_spec_resume(ClientNode& c);
  // ---- epoch clients (fs_epoch_clients.cc) ----
  void make_epoch_client(ClientNode& c);
  std::uint32_t epoch_length(ClientNode& c);  // entries of the next epoch, drawn
  std::uint64_t epoch_submit(ClientNode& c, fs::Request request, const char* what);
  void epoch_pump(ClientNode& c);    // runs the program while the model answers; FETCH, RESERVE, seals
  bool epoch_answer(ClientNode& c);  // the pending request answered (true), or a FETCH sent
  void epoch_seal(ClientNode& c);
  void epoch_on_first(ClientNode& c, const SpecEvent& ev);
  void epoch_on_final(ClientNode& c, const SpecEvent& ev);
  void epoch_verdicts(ClientNode& c);
  void epoch_rollback(ClientNode& c, const EpochClient::Sealed& failed);
  bool may_seal() const;  // false only under SimConfig::sabotage_last_epoch, in the liveness phase
  void epoch_print(ClientNode& c, const fs::Result& result);  // the program's line for its answered request
  void epoch_externalize(ClientNode& c, std::uint64_t epoch);
  void epoch_stop(ClientNode& c);  // fixes the program's length
  std::string epoch_unfinished(const ClientNode& c) const;  // property 15: "" or what the client waits on
  void check_epoch_output();  // property 14, at the end
  // ---- the file service's replica side (simulation.cc) ----
  void fs_after_step(ReplicaHost& r, const std::vector<ExecRecord>& finals);
  void fs_check_replica(ReplicaHost& r, const char* when);
  void fs_finish();

  // ---- stats and reports (stats.cc) ----
  void collect_stats();
  void collect_replica_stats();
  void collect_client_stats();
  void collect_fs_stats();
  void collect_epoch_stats();
  std::string failure_report(const std::string& what) const;
  std::string trace_text() const;
  const char* phase_name() const;
  void on_log(LogLevel level, std::string_view line);

  [[noreturn]] void fail(const std::string& what) const { throw Violation{what}; }
  void check_checker() const {
    if (checker_->failed()) fail(checker_->violation());
  }
  std::uint64_t now() const { return cluster_ ? cluster_->now() : 0; }
  std::uint64_t steps() const { return cluster_ ? cluster_->step() : 0; }

  SimConfig config_;
  Scenario sc_;
  Prng prng_;      // faults and workload
  Prng net_prng_;  // the network's own choices
  // Half of the seeds sync like the runtime's sync thread: the sends that do not wait for the log
  // (send_waits_for_log) leave at once, the others when the sync completes, a random number of ticks later; a
  // crash in between loses the unsynced records. Its own PRNG, so the other seeds replay exactly as before.
  Prng async_prng_;
  bool async_sync_ = false;
  bool all_crash_done_ = false;  // Scenario::all_crash_at_checkpoint: it happened
  // Ends a primary's batch hold early, as the runtime's timer does (its own stream: older seeds keep their
  // scenarios). Without it a hold lasts until the core's tick bound.
  Prng hold_prng_;
  std::unique_ptr<Checker> checker_;
  std::unique_ptr<FsCheck> fs_check_;  // file-service seeds: the agreed history for the serial-order oracle
  std::uint64_t max_executed_ = 0;     // the largest last_executed any correct replica reached so far
  std::vector<std::uint64_t> fs_stable_;  // per replica: the stable checkpoint its invariants were checked at
  std::uint64_t fs_invariant_checks_ = 0;
  std::uint64_t fs_reads_read_only_ = 0;  // read-only results accepted and handed to the oracle
  std::unique_ptr<Cluster> cluster_;
  std::vector<ReplicaFate> fates_;                // index = replica id
  std::vector<std::unique_ptr<ClientNode>> clients_;  // after the cluster: their cores use its keys
  std::uint32_t nodes_ = 0;
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
};

}  // namespace bftfs::sim
