// The PBFT replica as a pure state machine (no I/O, no clocks, no threads; time is ticks, randomness comes from
// a seeded PRNG). The driver feeds it authenticated messages and ticks and drains Effects after every call.
//
// Implements (section numbers of Castro & Liskov, TOCS 2002):
//   §2.3-2.4 normal case: pre-prepare, prepare, commit; batching (§5.1.4, sliding window of batches)
//   §5.1.1 reply digests, §5.1.2 tentative execution, §5.1.3 read-only optimization
//   §2.5 checkpoints every K, stable at 2f+1, log window L, garbage collection
//   §4.5 view change with the P/Q decision rule; view-change and new-view messages are signed
//   §5.3 state transfer over the partition tree; catch-up from peers' logs via STATUS retransmission
//   durable state and recovery after restart (the records of effects.h)
// and PBFT-CS early execution (Wester et al., NSDI'09 §3.1, option early_replies): the primary executes each
// request as soon as it receives it, into an "open batch" at the next sequence number, and sends the client a
// speculative reply (kReplySpeculative) at once; the open batch becomes the next PRE-PREPARE when the batch
// window lets it go, with its requests in the order they were executed. The speculative reply is not a vote:
// when the batch prepares (or commits) the primary sends its ordinary tentative (or committed) reply too. A view
// change, a state transfer or a conflicting certificate undoes the open batch and any early execution the new
// view does not re-propose identically (the service's rollback_to), which is what §3.4 requires: "it is safe
// for the old primary to restore its state to the most recent committed operation".
//
// The implementation is Replica::Impl: its state and the map of its files (one per concern) are in
// replica_impl.h, which only the replica's own .cc files include.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/crypto.h"
#include "protocol/effects.h"
#include "protocol/messages.h"
#include "protocol/service.h"

namespace bftfs {

struct ReplicaOptions {
  std::uint32_t n = 4;  // replicas, n = 3f+1
  std::uint32_t f = 1;
  std::uint64_t checkpoint_interval = 128;  // K
  std::uint64_t log_window = 256;           // L (a multiple of K)
  std::uint32_t batch_requests_max = 64;    // requests per pre-prepare
  std::uint32_t batch_window = 1;           // batches in flight before the primary starts batching; 0 = no
                                            // batching at all (one request per pre-prepare, unbounded window)
  bool tentative_execution = true;
  // Our COMMIT for a prepared batch waits for the next PRE-PREPARE or PREPARE we broadcast and leaves in the same
  // write, or for the next tick (see Replica::Impl::defer_commit). Only with tentative execution, where the
  // client waits for PREPARED replies and the commit round is off its critical path.
  bool piggyback_commits = true;
  // Batch hold: when the batch window opens while clients the primary has just answered (executed, with nothing
  // else queued or ordered) have not sent their next request yet, the next PRE-PREPARE waits for them, until
  // end_batch_hold() or the second tick (see Replica::Impl::hold_for_returning). Closed-loop clients then share one
  // batch per round instead of splitting into cohorts that alternate batches. Only with batching (batch_window >
  // 0) and without early replies; a lone client never waits (its own next request ends the wait).
  bool batch_hold = true;
  // PBFT-CS (NSDI'09 §3.1): the primary executes requests on receipt and sends early, speculative replies.
  bool early_replies = false;
  // Quiet primary: while its backups answer, the primary withholds its own promises for a prepared batch (the
  // synced PreparedRecord, its COMMIT and its tentative votes) and sends no vote (its result only when asked for
  // it, flagged as no vote); the 2f+1 backups' COMMITs and votes make both certificates. A batch not committed
  // within quiet_release_ticks of preparing here is released (record, COMMIT, votes) and the primary stops being
  // quiet for a while. Saves one durable write per batch (see Replica::Impl::may_go_quiet).
  bool quiet_primary = true;
  // 50: a round under load can take 10+ ms here (p99 7 ms at 32 clients), and each timer release stops the
  // quiet primary for 128 seqs; a client's retransmission releases a batch sooner when a backup is down.
  std::uint32_t quiet_release_ticks = 50;
  std::uint32_t client_window = 64;         // requests a client may have in flight (its reply cache size)

  // Timeouts in ticks (the runtime ticks every 1 ms).
  std::uint32_t view_change_timeout_ticks = 200;      // a known request not executed by then: suspect primary
  std::uint32_t view_change_timeout_ticks_max = 10000; // doubling backoff cap
  std::uint32_t timer_bytes_per_tick = 2048;           // view-change timer allowance: 2 MiB/s (1 ms ticks) of queued/uncommitted bytes
  // The view-change timer also allows for how long batches have recently taken from pre-prepare to commit
  // here (twice the smoothed latency plus four deviations, Replica::Impl::latency_allowance_ticks), at most
  // this much: on a machine so loaded that a batch takes longer than the fixed timeout, slowness is not taken
  // for a faulty primary, while a primary that makes its batches slow on purpose gains at most this per batch.
  // 2000: twice the longest pre-prepare-to-commit time measured under `make bench-stress` on 2 cores.
  std::uint32_t latency_allowance_ticks_max = 2000;
  std::uint32_t status_interval_ticks = 50;            // periodic STATUS for retransmission and catch-up
  std::uint32_t fetch_retry_ticks = 40;                // FETCH-BATCH / FETCH-STATE retry, with jitter
};

// Counters for status output, tests and benchmarks. Every rejected input increments one of them.
struct ReplicaStats {
  std::uint64_t requests_executed = 0;
  std::uint64_t batches_committed = 0;
  std::uint64_t read_only_executed = 0;
  std::uint64_t view_changes_started = 0;
  std::uint64_t view_changes_deferred_lagging = 0;  // our view-change timer expired while we were catching up
  std::uint64_t new_views_installed = 0;
  std::uint64_t state_transfers = 0;
  std::uint64_t state_transfer_bytes = 0;
  std::uint64_t recovered_checkpoints_adopted = 0;  // a restart's service checkpoint ahead of the log became stable
  std::uint64_t service_damaged = 0;      // times the service reported damaged state (then repaired by transfer)
  std::uint64_t rollbacks = 0;
  std::uint64_t early_replies = 0;        // speculative replies sent by this replica as primary (PBFT-CS)
  std::uint64_t open_batches_discarded = 0;  // early-executed requests undone before their batch went out
  std::uint64_t quiet_batches = 0;   // batches this replica, as primary, prepared without its own promises
  std::uint64_t quiet_releases = 0;  // of those, batches whose promises it made later (timer, retransmission)
  // Ordered requests skipped at execution because their client's previous request had not executed (the
  // per-client order rule, ClientTable::predecessor_done); the client retransmits them.
  std::uint64_t requests_deferred_order = 0;
  std::uint64_t rejected_bad_authenticator = 0;
  std::uint64_t rejected_bad_signature = 0;
  std::uint64_t rejected_out_of_window = 0;
  std::uint64_t rejected_wrong_view = 0;
  std::uint64_t rejected_conflict = 0;     // equivocation: a second pre-prepare for a (view, seq) with another digest
  std::uint64_t rejected_invalid = 0;      // anything else that a correct peer would not send
  std::uint64_t fetches_refused_repeat = 0;  // FETCH-BATCH for the body just sent to that peer (on_fetch_batch)
};

// What the simulator's checker reads after every step: the committed history of this replica.
struct ExecutedBatch {
  std::uint64_t seq = 0;
  Digest digest;
};

class Replica {
 public:
  // `service` and `crypto` must outlive the replica. `prng_seed` drives timer jitter only.
  Replica(const ReplicaOptions& options, NodeId self, Service& service, const Crypto& crypto,
          std::uint64_t prng_seed);
  ~Replica();
  Replica(const Replica&) = delete;
  Replica& operator=(const Replica&) = delete;

  // Rebuilds the state from the write-ahead log after a restart, before any other call. Re-executes committed
  // batches above the service's recovered checkpoint; emits a STATUS so peers retransmit what it missed.
  void recover(const std::vector<PersistRecord>& log);

  // An authenticated message from `from` (the frame's MAC was checked by the wire layer). Never asserts on
  // message content: invalid messages are counted and dropped.
  void on_message(NodeId from, const Message& message);
  void on_tick();
  // Batch hold (ReplicaOptions::batch_hold): true while the primary keeps queued requests back for clients it has
  // just answered. The driver should call end_batch_hold() soon after (the runtime: after kBatchHoldUs); the next
  // tick ends the wait in any case, so a driver that never calls it only waits longer.
  bool batch_held() const;
  void end_batch_hold();
  // The driver's wall clock, used only by the primary to choose Batch::timestamp_ns (kept increasing).
  void set_wall_clock_ns(std::uint64_t now_ns);

  // Moves out everything the driver must do; see effects.h for the ordering rule.
  Effects take_effects();

  // Asserts every invariant of the replica state (called by tests and the simulator after every step).
  void check_invariants() const;

  // ---- introspection ----
  NodeId id() const;
  std::uint64_t view() const;
  bool in_view_change() const;
  bool is_primary() const;  // primary of the current view, and not changing views
  std::uint64_t last_executed() const;
  std::uint64_t last_committed() const;
  std::uint64_t stable_checkpoint() const;
  // True when no timer but the periodic STATUS runs and nothing waits: no request queued, nothing ordered,
  // executed or fetched that is not committed, no view change. Until the next message, on_tick does nothing
  // but count towards the next STATUS, so a driver may deliver its ticks late, in one catch-up (the runtime
  // slows its tick timer to the status interval then).
  bool idle() const;
  const ReplicaStats& stats() const;
  // Committed batches in order since construction or recovery, for the simulator's agreement check; the
  // history is trimmed by the caller with trim_history().
  const std::vector<ExecutedBatch>& committed_history() const;
  void trim_history();

  // ---- fault injection (compiled in, armed only by the simulator and fault benchmarks) ----
  // A hook that may rewrite or drop this replica's outgoing effects before the driver sees them.
  using EffectsFilter = std::function<void(Effects&)>;
  void set_effects_filter(EffectsFilter filter);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bftfs
