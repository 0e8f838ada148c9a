// The seeded whole-cluster simulator ("one seed drives the whole cluster"; TigerBeetle's VOPR and
// FoundationDB's simulation are the models).
//
// One run builds n = 3f+1 real Replica cores (each over a CounterService, a NullService or the file service,
// fs::FsService, wrapped in a RecordingService, with an in-memory SnapshotStore and a durable record list that
// survive crashes) and m real Client cores on the cluster driver (sim/cluster.h), and drives them with logical
// ticks. PBFT-CS seeds (Wester et al., NSDI'09 §3) run the counter behind shim::Shim on every replica, with
// primaries that execute early (ReplicaOptions::early_replies) and clients built on the speculation library
// (relay/spec_client.h): speculating counter clients that chain increments on first replies, and plain clients
// over the shim; a Byzantine primary may lie in its early replies (sim/byzantine.h). File-service seeds run the
// file service behind the shim always, as in production, with clients that draw file operations (create, write,
// rename over files and directories, link, remove, compound requests with predicates, reads on the read-only
// path: sim/fs_workload.h), plain or speculating. Every message goes through the real wire codec
// (encode with the sender's keys, decode and authenticate with the receiver's), a simulated network (delay,
// loss, duplication, reordering, partitions, slow links), crashes and restarts (including a crash between
// persisting and sending, and a crash of every replica at once), and up to f Byzantine replicas
// (sim/byzantine.h). After every step the checker (sim/checker.h) checks agreement, agreed results, accepted
// results and counter integrity over the correct replicas, and for the file service a serial-order oracle
// replays the agreed history (sim/fs_check.h); "durable before sent" is checked on every send of a correct
// replica. A fault phase of random faults is followed by a liveness phase: the network heals, crashed replicas
// restart, and every client must finish its requests and the correct replicas must converge within a bound of
// ticks.
//
// Everything random comes from Prngs seeded by SimConfig::seed: the same seed gives the same run, event for
// event (SimStats::fingerprint). On a violation the result carries the seed, the step, the violation and the
// last events.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace bftfs::sim {

struct SimConfig {
  std::uint64_t seed = 1;
  std::uint64_t fault_ticks = 2000;         // length of the fault phase
  std::uint64_t liveness_ticks_max = 30000;  // bound for the liveness phase
  std::uint32_t f = 0;                       // 0: chosen by the seed (1, sometimes 2)
  bool byzantine = true;                     // false: never choose Byzantine replicas
  // "" or "random": chosen by the seed. Otherwise one of scenario_names(), or a Byzantine strategy name
  // (sim/byzantine.h) to force that strategy.
  std::string scenario;
  // "" : chosen by the seed (the counter mostly; the file service in a quarter of the seeds, from a stream of its
  // own; the null service with a pipelining client sometimes); "counter", "null" or "fs" to force one.
  std::string service;
  // PBFT-CS: -1 chosen by the seed; 1 forces early replies, the shim and speculating clients (counter or file
  // service); 0 forbids speculating clients, and the shim but for the file service, which always runs behind it
  // (early replies still as the seed chooses).
  int speculation = -1;
  // File-service seeds: -1 chosen by the seed (half of them), 1 always, 0 never: the last client is an epoch client
  // (sim/fs_epoch_client.h) that sends FETCH, RESERVE, STAGE and EPOCH requests built by spec/'s epoch engine.
  int epochs = -1;
  bool verbose = false;  // print every event and debug logs to stdout as the run goes
  // Tests of the simulator only: replica 1's final executions reach the checker with an altered result digest,
  // so a run must fail with "agreed results" or "accepted result" (proves the checker is wired to the cluster).
  bool sabotage_results = false;
  // Tests of the simulator only (PBFT-CS seeds): every correct replica strips the predicates off each request
  // before its shim sees it, so requests built on lies execute everywhere alike; the run must fail with
  // "shim decision" or "predicate" (proves the PBFT-CS checks are wired to the cluster).
  bool sabotage_predicates = false;
  // Tests of the simulator only (file-service seeds): every correct replica alters the data of every WRITE before
  // its shim sees it, all alike, so the correct replicas agree with each other but not with a serial execution
  // of what the clients sent; the run must fail with one of the oracle's violations (proves the oracle is wired).
  bool sabotage_fs = false;
  // Tests of the simulator only (seeds with an epoch client): every correct replica executes each EPOCH without its
  // inline entries, so batches whose entries do not hold apply anyway; the run must fail with "predicates hold
  // where applied" (proves the epoch replay is wired).
  bool sabotage_epochs = false;
  // Tests of the simulator only (seeds with an epoch client): the program's output lines are externalized as it
  // prints them, not held until their epoch commits, and a rollback drops none; the run must fail with "serial
  // equivalence (property 14)" (proves the output check is wired).
  bool sabotage_output = false;
  // Tests of the simulator only (seeds with an epoch client): the epoch client seals no epoch in the liveness
  // phase, so its last epoch never commits; the run must fail with "liveness under quiescence (property 15)".
  bool sabotage_last_epoch = false;
  // Tests of the simulator only (seeds with an epoch client): a rollback restores the program's Prng and input
  // but keeps what it knew, so the surviving execution is no serial one; the run must fail with "the serial run
  // of its program issues another request" (property 14: proves the program replay is wired).
  bool sabotage_checkpoint = false;
  std::uint32_t trace_events = 48;  // events kept for the failure report
};

// Scenario names accepted by SimConfig::scenario besides the strategy names.
const std::vector<std::string>& scenario_names();

inline constexpr std::size_t kRejectSlots = 32;

// Totals of one run (plain data: sent whole from a worker process). Coverage marks are the counters that
// prove a rare path ran (view changes, state transfers, rollbacks, crashes).
struct SimStats {
  std::uint64_t ticks = 0;
  std::uint64_t steps = 0;
  std::uint64_t submitted = 0;
  std::uint64_t completed = 0;
  std::uint64_t read_completions = 0;
  std::uint64_t committed_seqs = 0;
  std::uint64_t requests_executed = 0;
  std::uint64_t view_changes_started = 0;
  std::uint64_t view_changes_deferred_lagging = 0;  // timer expired while the replica was a checkpoint behind
  std::uint64_t new_views_installed = 0;
  std::uint64_t state_transfers = 0;
  std::uint64_t recovered_checkpoints_adopted = 0;  // restarts whose service checkpoint was ahead of the log
  std::uint64_t replica_rollbacks = 0;
  std::uint64_t batch_holds = 0;  // ticks at which a primary held a batch back for returning clients
  std::uint64_t quiet_batches = 0;   // batches a primary prepared without its own promises (quiet primary)
  std::uint64_t quiet_releases = 0;  // ... whose promises it made later (release timer, retransmission)
  std::uint64_t service_rollbacks = 0;  // rollbacks that undid at least one execution (RecordingService)
  std::uint64_t crashes = 0;
  std::uint64_t crashes_between_persist_and_send = 0;
  std::uint64_t torn_persists = 0;  // crashes that also lost the tail of the last persist
  std::uint64_t unsynced_records_lost = 0;  // crashes that lost appended but never synced records
  std::uint64_t sends_held_for_sync = 0;    // asynchronous-sync seeds: sends that waited for the log
  std::uint64_t held_sends_lost = 0;        // ... and were never sent: their replica crashed first
  std::uint64_t restarts = 0;
  std::uint64_t all_crashes = 0;
  std::uint64_t partitions = 0;
  std::uint64_t slow_links = 0;
  std::uint64_t frames_sent = 0;
  std::uint64_t frames_delivered = 0;
  std::uint64_t frames_lost = 0;
  std::uint64_t frames_duplicated = 0;
  std::uint64_t frames_partitioned = 0;
  std::uint64_t frames_to_dead_nodes = 0;
  std::uint64_t frames_rejected = 0;
  std::uint64_t rejected_by_reason[kRejectSlots] = {};  // index = bftfs::Reject
  std::uint64_t replica_rejected = 0;  // sum of the ReplicaStats rejected_* counters of every replica
  std::uint64_t byzantine_replicas = 0;
  std::uint64_t byzantine_lies = 0;
  std::uint64_t client_retransmissions = 0;
  std::uint64_t read_only_fallbacks = 0;
  std::uint64_t replies_rejected = 0;
  std::uint64_t log_warnings = 0;
  std::uint64_t log_errors = 0;
  std::uint64_t liveness_ticks = 0;  // how long the liveness phase took
  std::uint64_t probes = 0;            // runs that needed a further request because replicas did not converge
  std::uint64_t lagging_replicas = 0;  // correct replicas behind the agreed history at the end
  // PBFT-CS. The first four are what the scenario chose (0 or 1, the clients a count), the rest what ran.
  std::uint64_t cs_early_replies = 0;        // the replicas execute early and send speculative replies
  std::uint64_t cs_shim = 0;                 // the replicas run the shim; the clients the speculation library
  std::uint64_t cs_speculating_clients = 0;  // clients that chain increments on first replies
  std::uint64_t cs_lying_primary = 0;        // a Byzantine replica lies in its early replies when primary
  std::uint64_t early_replies_sent = 0;      // speculative replies sent by primaries (ReplicaStats)
  std::uint64_t early_replies_received = 0;  // speculative replies with a result delivered to clients
  std::uint64_t open_batches_discarded = 0;  // early-executed requests undone before their batch went out
  std::uint64_t first_delivered = 0;         // kFirst events (relay/spec_client.h)
  std::uint64_t speculative_firsts = 0;      // ... of them carrying a primary's early (speculative) reply
  std::uint64_t first_withheld_distrusted = 0;  // first replies not delivered by the 1% rule (§3.4)
  std::uint64_t first_withheld_doomed = 0;   // first replies of operations that relied on a misprediction
  std::uint64_t spec_commits = 0;
  std::uint64_t spec_rollbacks = 0;          // kRollback events at clients
  std::uint64_t spec_dead_finals = 0;        // final events of increments that relied on a failed prediction
  std::uint64_t shim_retries = 0;            // agreed requests the shim turned into no-ops
  std::uint64_t early_lies = 0;              // early replies a Byzantine primary corrupted
  std::uint64_t fake_early_replies = 0;      // early replies for requests it then never ordered
  // Per-client order (checker property 10): clients with more than one request in flight (the pipelining
  // client, speculating clients with a window above 1), whether a Byzantine primary reorders them
  // (reorder-client), and ordered requests the correct replicas skipped because their predecessor had not
  // executed (ReplicaStats::requests_deferred_order).
  std::uint64_t pipelined_clients = 0;
  std::uint64_t reorder_primary = 0;
  std::uint64_t requests_deferred_order = 0;
  // File-service seeds (fs::FsService behind the shim, sim/fs_check.h). fs_seed is 1 for one; then what the
  // clients drew (FsWorkloadStats), what the agreed history did (FsHistoryStats) and what was checked.
  std::uint64_t fs_seed = 0;
  std::uint64_t fs_requests = 0;           // drawn by the clients
  std::uint64_t fs_compounds = 0;          // ... of two or more ops
  std::uint64_t fs_expects = 0;            // ops with an fs Expect predicate (errno or digest)
  std::uint64_t fs_renames = 0;            // RENAME ops drawn
  std::uint64_t fs_renames_of_dirs = 0;    // ... of a directory the client knew
  std::uint64_t fs_renames_across = 0;     // ... into another directory
  std::uint64_t fs_renames_replacing = 0;  // ... onto a name the client knew existed
  std::uint64_t fs_renames_into_subtree = 0;  // ... of a directory into its own subtree
  std::uint64_t fs_links = 0;              // LINK ops drawn
  std::uint64_t fs_removes = 0;            // REMOVE and RMDIR ops drawn
  std::uint64_t fs_dependencies = 0;       // shim dependencies the speculating clients sent (SpecClientStats)
  std::uint64_t fs_executions = 0;         // agreed executions (each checked against the oracle's)
  std::uint64_t fs_with_dependencies = 0;  // ... carrying shim dependencies
  std::uint64_t fs_shim_noops = 0;         // ... that the shim turned into no-ops
  std::uint64_t fs_done = 0;               // ... executed with every op passing
  std::uint64_t fs_op_failed = 0;          // ... stopped by an errno (all undone)
  std::uint64_t fs_predicate_failed = 0;   // ... stopped by an fs Expect that did not hold
  std::uint64_t fs_compounds_done = 0;
  std::uint64_t fs_expects_held = 0;
  std::uint64_t fs_renames_done = 0;
  std::uint64_t fs_renames_across_done = 0;
  std::uint64_t fs_links_done = 0;
  std::uint64_t fs_removes_done = 0;
  std::uint64_t fs_read_only_reads = 0;    // results accepted on the read-only path
  std::uint64_t fs_reads_checked = 0;      // ... matched by the oracle to a serial state in their window
  std::uint64_t fs_reads_unverifiable = 0;  // ... whose window began before the oracle's oldest state
  std::uint64_t fs_checkpoints_compared = 0;  // correct replicas' checkpoint digests compared with the oracle's
  std::uint64_t fs_invariant_checks = 0;      // FsService::check_invariants runs on correct replicas
  // File-service seeds with an epoch client (sim/fs_epoch_client.h; checker properties 11-15, sim/spec_audit.h,
  // sim/spec_output.h).
  // What the client did:
  std::uint64_t epoch_clients = 0;
  std::uint64_t epoch_program_steps = 0;   // program requests answered by the local model (entries)
  std::uint64_t epoch_fetches = 0;         // FETCH requests sent
  std::uint64_t epoch_firsts_used = 0;     // ... whose first reply fed the model (1-reply predictions)
  std::uint64_t epoch_firsts_wrong = 0;    // ... whose final reply then differed
  std::uint64_t epoch_inconsistent = 0;    // model runs on contradicting facts (clean facts dropped)
  std::uint64_t epoch_reserves = 0;        // RESERVE requests sent
  std::uint64_t epoch_stages = 0;          // STAGE requests sent
  std::uint64_t epoch_sealed = 0;          // EPOCH requests sent
  std::uint64_t epoch_committed = 0;       // epochs whose batch applied
  std::uint64_t epoch_failed = 0;          // epochs discarded (verdict not APPLIED, or chained on such an epoch)
  std::uint64_t epoch_rollbacks = 0;       // program restored from a checkpoint
  std::uint64_t epoch_discarded_entries = 0;
  std::uint64_t epoch_lines_externalized = 0;  // program output lines externalized (all checked: property 14)
  std::uint64_t epoch_lines_dropped = 0;       // ... held and dropped by a rollback
  std::uint64_t epoch_input_replayed = 0;      // input bytes the restored program consumed again
  std::uint64_t epoch_rollbacks_stopped = 0;   // rollbacks after the client stopped (its program runs again)
  // What the agreed history did with them (EpochReplay), and the STAGE and EPOCH executions whose objects the
  // replicas' audits digested (property 12; the replicas' last incarnations only).
  std::uint64_t epoch_hist_stages = 0;
  std::uint64_t epoch_hist_epochs = 0;
  std::uint64_t epoch_hist_applied = 0;    // every entry replayed and checked (property 11), chain checked (13)
  std::uint64_t epoch_hist_chain = 0;
  std::uint64_t epoch_hist_staging = 0;
  std::uint64_t epoch_hist_entry = 0;      // an entry's predicate was false where the batch executed
  std::uint64_t epoch_entries_replayed = 0;
  std::uint64_t epoch_entries_staged = 0;  // ... from staged parts
  std::uint64_t epoch_replica_audits = 0;
  // Overload seeds (scenario "overload"): 1 for one; deliveries the replicas' machine put off to a later tick
  // (a frame once per tick it waited), and the most frames waiting for it at the end of a tick.
  std::uint64_t overload = 0;
  std::uint64_t machine_frames_waited = 0;
  std::uint64_t machine_backlog_max = 0;
  std::uint64_t overload_in_flight_max = 0;  // the most requests the clients had in flight at once
  std::uint64_t fingerprint = 0;     // hash of the delivered frames in order: equal for equal runs
};

struct SimResult {
  std::uint64_t seed = 0;
  bool passed = false;
  std::string failure;   // seed, step, violation and the last events; empty when passed
  std::string scenario;  // one-line description of what the seed chose
  SimStats stats;
};

// "" if the configuration names a known scenario and service and a valid f, else why not.
std::string check_config(const SimConfig& config);

// Runs one seed in this process. A violation is reported in the result; an assertion inside a core aborts the
// process (use run_isolated to survive it).
SimResult run_simulation(const SimConfig& config);

// Runs one seed in a forked child so that an aborting assertion is reported as a failure of that seed (with
// the trace printed to stderr by the child) instead of ending the caller.
SimResult run_isolated(const SimConfig& config);

// Runs many seeds in up to `jobs` forked children at once; `done` is called in the parent as each finishes
// (in completion order). Results are returned in the order of `configs`.
std::vector<SimResult> run_many(const std::vector<SimConfig>& configs, unsigned jobs,
                                const std::function<void(const SimResult&)>& done);

// sim/regression-seeds.txt: one run per line, "SEED [key=value ...]" with keys f, ticks, scenario, service,
// byzantine (0/1), cs (0/1: SimConfig::speculation), epochs (0/1: SimConfig::epochs); '#' starts a comment. Returns false with `error` set on a malformed line.
bool parse_regression_line(const std::string& line, SimConfig& out, bool& empty, std::string& error);
// Path of sim/regression-seeds.txt in the source tree this library was built from.
std::string regression_seeds_path();
// Reads every run of a regression-seeds file (parse_regression_line, then check_config) into `out`. Returns ""
// or "path:line: reason" for the first bad line (or an unreadable file).
std::string read_regression_seeds(const std::string& path, std::vector<SimConfig>& out);

}  // namespace bftfs::sim
