// The serial-order oracle of the file service, for the simulator's checker: a shadow replica that executes the
// agreed history one execution at a time and objects (with text, never an assertion) when what the correct
// replicas produced is not what one serial execution produces.
//
// The shadow is the replicas' own stack without replication: shim::Shim over fs::FsService, both in memory (no
// SnapshotStore), built with the replicas' FsOptions and ShimOptions. It never rolls back: it only ever sees
// final executions, in order.
//
// What it checks:
//   1. Agreed results. Every agreed execution's result digest (digest_of the whole shim result envelope, i.e.
//      Reply::result_digest) equals the digest of the shadow's result for the same ExecContext and op bytes,
//      executed after every earlier agreed execution. So every agreed result is the result of one serial
//      execution: the agreed history's.
//   2. Checkpoints. At every multiple of the checkpoint interval the shadow takes its own checkpoint; a digest a
//      correct replica's service reported for that seq (on_replica_checkpoint) must equal the shadow's. The
//      digest covers every partition of the shim (the file tree and the shim's per-client logs), so equal
//      digests mean the replica's file tree is the serial execution's, byte for byte.
//   3. Read-only results (TOCS §5.1.3: reads that never enter the agreed history). A read submitted with lower
//      bound lo and accepted with upper bound hi (see begin_read, end_read) must have the result digest of
//      Shim::execute_read_only(client, op) on the serial state after some seq s in [lo, hi], where "the state
//      after s" is the state after every agreed execution at a seq <= s.
//   4. Determinism. A second shadow (the read shadow, below) executes the same history; its results must equal
//      the first's.
//
// How read-only results are checked incrementally. A read's window [lo, hi] may begin below the agreed history
// the oracle has already executed (lo is typically the seq of a write some client saw complete before the read
// was submitted), so past states must stay reachable. The oracle keeps a second shadow, the read shadow, that
// trails the agreed history by `read_lag_seqs`: it applies a batch only once every execution up to that batch's
// seq plus read_lag_seqs is known. Each state the read shadow holds is the state after every seq in a segment
// [a, b] (a: the seq of the batch it applied last; b: the seq before the next batch). When it leaves a segment
// (to apply the next batch, or at finish) it executes every registered read whose window meets the segment on
// its state and records the digest (open reads), or compares it with the accepted digest (ended reads). A read
// is decided as soon as a recorded digest in its window matches (pass), or once the read shadow has left every
// segment that meets [lo, hi] without a match (violation).
//
// Soundness of check 3 (it never objects to a correct run): if the accepted result equals the read on the state
// after some s in [lo, hi], then the read shadow holds exactly that state (it executes the agreed history in
// order, and the state after s is the state after the last agreed execution at or below s), and it leaves that
// segment only after the read was registered, provided lo is at or above the read shadow's state when
// begin_read is called; it then records or compares the same digest. When lo is below that state (the read
// began more than about read_lag_seqs behind the agreed history) the states in [lo, a) are gone: such a read
// passes if a later state in its window matches and is otherwise counted as unverifiable (reads_unverifiable),
// never reported. Completeness: a violation names a read whose result differs from the read on every agreed
// state in its window, so no serial execution in the window explains it.
//
// What the caller must choose soundly (the simulator, which knows the replicas):
//   - lo: a seq whose state the read is obliged to reflect; 0 is always sound. Linearizability gives a tighter
//     one where TOCS §5.1.3 proves it, for clients that obtain 2f+1 matching replies for writes as for reads:
//     the largest agreed seq of an ordered request some client accepted on 2f+1 matching replies before the
//     read was submitted (f+1 correct replicas executed it; the read's 2f+1 repliers include one of them, and a
//     correct replica answers a read only from a committed state, protocol/replica.cc process_read_only). A
//     write accepted on f+1 committed replies bounds nothing this way (one correct replica may have it so far).
//     Nor does "the highest seq committed anywhere at submission": 2f+1 replicas that have not committed it yet
//     may answer the read from an older state, correctly.
//   - hi: a seq no correct replica had executed past when the client accepted the read (the largest last
//     executed seq of any correct replica up to that moment).
//
// Contract breaches by the caller (history out of order, unknown read ids, calls after finish) are assertions:
// they are the simulator's bugs, not the system's.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "common/types.h"
#include "protocol/service.h"
#include "services/fs/fs_service.h"
#include "shim/shim.h"

namespace bftfs::sim {

struct FsOracleOptions {
  fs::FsOptions fs;          // the replicas' (the checkpoint digests cover the whole state)
  shim::ShimOptions shim;    // the replicas'
  // The replicas' checkpoint interval K: the shadow checkpoints at every multiple of K it passes. 0: none (then
  // on_replica_checkpoint must not be called).
  std::uint64_t checkpoint_interval = 0;
  // How far the read shadow trails the agreed history, in seqs (see the top of this file). Reads whose window
  // begins further back than this when they are registered may be unverifiable.
  std::uint64_t read_lag_seqs = 64;
};

// Counts of what the oracle did (plain data).
struct FsOracleStats {
  std::uint64_t executions = 0;          // agreed executions checked (check 1)
  std::uint64_t checkpoints = 0;         // checkpoints the shadow took (not counting seq 0, the initial state)
  std::uint64_t checkpoints_compared = 0;  // replica digests compared with the shadow's (check 2)
  std::uint64_t reads_begun = 0;
  std::uint64_t reads_passed = 0;        // ended reads whose result matched a state in their window
  std::uint64_t reads_unverifiable = 0;  // ended reads with no match whose window began before the read shadow
  std::uint64_t reads_forgotten = 0;     // forget_read, or never ended by finish
  std::uint64_t read_executions = 0;     // read-only executions on the read shadow
};

class FsOracle {
 public:
  using ReadId = std::uint64_t;

  // Precondition (asserted): valid FsOptions and ShimOptions (as the services require).
  explicit FsOracle(FsOracleOptions options);
  ~FsOracle();
  FsOracle(const FsOracle&) = delete;
  FsOracle& operator=(const FsOracle&) = delete;

  // ---- the agreed history ----
  // The next agreed execution: `ctx` as the replicas executed it (seq, client, request id, the batch's agreed
  // timestamp_ns), `op` the bytes the client sent (a shim envelope), `result_digest` the digest of the result
  // the correct replicas produced. Executions come in agreed order: seq, then place in the batch.
  // Preconditions (asserted): ctx.seq > complete_through(); ctx.seq >= the previous execution's seq; not finished.
  // Reports check 1 at once.
  void on_execution(const ExecContext& ctx, std::span<const std::uint8_t> op, const Digest& result_digest);
  // Every agreed execution at a seq <= `seq` has been given (a correct replica committed through `seq`, and the
  // executions of every batch up to it were reported). Lets the shadow close the last batch, checkpoint, and the
  // read shadow advance. A smaller seq than before is ignored.
  void on_complete_through(std::uint64_t seq);
  // The largest seq known complete (on_complete_through, or one below the latest execution's seq).
  std::uint64_t complete_through() const;
  // The seq of the last batch the read shadow applied: a read begun with lo below it is checked only on the
  // states from here on (and is unverifiable if none of them matches). At most complete_through() -
  // read_lag_seqs, or 0.
  std::uint64_t read_shadow_seq() const;

  // ---- read-only results (check 3) ----
  // A read-only request `op` (the bytes the client sent, a shim envelope) of `client` was submitted; its result
  // must reflect at least the state after `lo` (see the top of this file). Call it when the read is submitted,
  // before the agreed history moves on, so that the read shadow has not left lo yet. Returns its id.
  ReadId begin_read(NodeId client, std::span<const std::uint8_t> op, std::uint64_t lo);
  // The client accepted `result_digest` (digest_of the read-only result envelope) for read `id`; no correct
  // replica had executed past `hi` then. Decides the read now if it can, else once the read shadow has passed
  // hi (at the latest at finish). hi < lo is a violation (an empty window). Precondition: `id` begun, not ended.
  void end_read(ReadId id, const Digest& result_digest, std::uint64_t hi);
  // Read `id` will not be ended (it fell back to ordering, or was abandoned): forget it. Precondition: begun,
  // not ended.
  void forget_read(ReadId id);

  // ---- checkpoints (check 2) ----
  // The shadow's service checkpoint digest at `seq` (the root over the shim's partitions, as
  // Service::checkpoint returns it: compare with the CheckpointId a correct replica's service returned from
  // checkpoint or finish_install, not with the CHECKPOINT message's digest, which also covers the client table),
  // if the shadow took one there. Seq 0 is the initial state.
  std::optional<Digest> checkpoint_digest(std::uint64_t seq) const;
  // A correct replica's service reported `digest` for its checkpoint at `seq`: compared now if the shadow has
  // passed seq, else when it does (at the latest at finish: a correct replica checkpoints only committed seqs,
  // and after the complete history the last state stands for every later seq). May be called after finish.
  // Precondition (asserted): seq is 0 or a multiple of a nonzero checkpoint_interval.
  void on_replica_checkpoint(std::uint64_t seq, const Digest& digest);

  // ---- end of run ----
  // The history is complete: closes the last batch (as on_complete_through of the last execution's seq), lets the
  // read shadow catch up and decides every ended read (the last state stands for every seq after it), and
  // compares every replica checkpoint still waiting. Reads never ended are forgotten. After finish only
  // on_replica_checkpoint and the observers below may be called.
  void finish();

  // ---- observers ----
  // FsService::check_invariants of both shadows: "" if consistent, else the first inconsistency. Walks the whole
  // state: call it at checkpoints or at the end, not after every execution.
  std::string check_invariants() const;
  bool failed() const;
  // The first violation ("" if none): what was expected, what the shadow computed, and where.
  const std::string& violation() const;
  const FsOracleStats& stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bftfs::sim
