// The simulator's checker: safety properties over the correct replicas and the clients, fed after every step.
//
// It knows nothing about replicas or the network: the simulator feeds it facts, so that it can be tested on
// its own (tests/unit/test_sim.cc feeds it broken histories and expects it to object).
//
// Properties (the first breach is kept as the violation; the simulator stops at once and prints the trace):
//   1. Agreement (TOCS §2.2 safety): every correct replica that committed seq s committed the same batch
//      digest at s.
//   2. Agreed results: every final execution (sim/recording_service.h) of a request (client, request id) at a
//      correct replica has the same seq and the same result digest as at every other correct replica; a
//      request is executed at most once in the agreed history (that is the same check: a second execution is
//      at another seq or, for the counter, gives another result).
//   3. Accepted results are agreed results: every ordered result a client accepted equals the final result of
//      that request at the correct replicas. Checked when both are known; at finish() an accepted result with
//      no final execution anywhere is a violation (a client accepted something the correct replicas never
//      committed). A read a plain client sent read-only that fell back to ordering counts as the ordered request
//      it became (Completion::wire_request_id).
//   4. Counter integrity (counter service only): every successful increment in the agreed history returns a
//      distinct value, values grow with the sequence number, and at finish() the values are exactly 1..M with
//      M the value every converged correct replica holds.
//   5. Real-time order of counter operations (linearizability): an increment that completed before another
//      operation was submitted is ordered before it, so
//        - an increment's value exceeds the value of every increment that completed before it was submitted;
//        - a read returns a value v with lo <= v < hi, where lo is the largest value of an increment completed
//          before the read was submitted and hi the smallest value of an increment submitted after the read
//          completed; and v <= M.
//      This is sound for any linearizable counter: the counter's value at the read's linearization point is
//      the number of increments linearized before it, which includes every increment completed before the
//      read began and excludes every increment that began after it ended. It is checked with the clients'
//      accepted values, which property 3 ties to the agreed history. It checks read-only reads (TOCS §5.1.3)
//      that never enter the agreed history, and their ordered fallback.
//   6. Checkpoint agreement: correct replicas that take or install a checkpoint at seq s hold the same digest
//      (it covers the whole service state: with the shim, also every client's log of result digests, so equal
//      digests mean the shim decided alike everywhere).
//   7. Counter integrity as the clients saw it: at finish() (every submitted request has completed), the
//      successful increments the clients accepted are exactly the successful increments of the agreed history.
// PBFT-CS seeds (`shim`: ops and results are shim envelopes, NSDI'09 §3.2, §5):
//   8. Predicates: a request the agreed history executed (shim status "executed") had every predicate true in
//      the agreed history: each dependency was executed before it (at a seq not above its own, and reported
//      first) with exactly the predicted result digest. So an operation built on a lie or a misprediction never
//      reaches the service. A no-op for a failed predicate has a dependency whose agreed result differs; a
//      no-op for an unknown dependency has dependencies; a malformed envelope never appears (correct clients
//      send valid ones, and requests are authenticated by their clients). Different shim decisions at two
//      correct replicas break property 2 (the status is part of the result) and are reported as such.
//      Counter properties 4, 5 and 7 read the counter result inside the envelope; a no-op changes nothing.
//   9. Speculation: a speculating client's final event (relay/spec_client.h) is an accepted result (property 3:
//      its committed view never holds a rolled-back result); a kCommit after a delivered first reply has that
//      first reply equal to the final result, a kRollback has a delivered first reply that differs, and a plain
//      client never delivers first replies.
//  10. Per-client order (TOCS §5.1.4 pipelining, with each client's order kept): in the agreed history (seq, then
//      place in the batch) every client's executed requests appear in the order the client issued them, which for
//      the simulator's clients (one incarnation each) is increasing request id. Pipelining clients (window > 1:
//      the null variant's pipelining client, speculating clients) make it bite; view changes, crashes of every
//      replica and the reorder-client Byzantine primary try to break it.
// File-service seeds add the serial-order oracle's checks (sim/fs_check.h, sim/fs_oracle.h): every agreed result
// is the serial execution's, every read-only result a serial state's within its window, every checkpoint of a
// correct replica the serial execution's; properties 1-3, 6 and 8-10 apply as they stand. Seeds with an epoch client
// (sim/fs_epoch_client.h) add docs/SPECULATION.md §14's properties 11-13, checked by sim/spec_audit.h:
//  11. Predicates hold where applied: an EPOCH that applied gave each of its entries the result it expects, by an
//      independent replay of the entries at the EPOCH's place in the agreed history (EpochReplay).
//  12. All or nothing: at every replica, an EPOCH that did not apply changed no object, and no STAGE or EPOCH
//      changed an object outside the stream kinds unless it applied (StreamOpAudit, digests around each).
//  13. Chain: per stream, applied EPOCHs name the epoch applied before them as prev, with increasing numbers, and
//      no prev twice (EpochReplay).
//  14. Serial equivalence of what was externalized: at the end, each epoch client's committed epochs are the
//      stream's applied epochs, each applied once at its EPOCH's seq, and the output lines its program
//      externalized are, line for line, what the serial replay of those epochs' entries prints, with the input
//      consumed exactly once, in order; no line of a failed epoch, none before its epoch's verdict came
//      (sim/spec_output.h).
//  15. Liveness under quiescence: in the liveness phase (faults stopped) every epoch client's program answers
//      every request of its length and its last epoch commits (Simulation::epoch_unfinished).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "protocol/client.h"
#include "services/counter_service.h"
#include "shim/envelope.h"
#include "sim/recording_service.h"

namespace bftfs::sim {

// What a client submitted: counter increments, reads (of the counter, or file-service requests sent on the
// read-only path), null ops, and ordered file-service requests (kFs).
enum class OpKind : std::uint8_t { kIncrement, kRead, kNull, kFs };

// How a client reported a final result: a plain PBFT client's completion, or a speculating client's final
// event (relay/spec_client.h).
enum class FinalKind : std::uint8_t { kPlain, kCommit, kRollback };

class Checker {
 public:
  // `counter`: the service is the counter (properties 4, 5 and 7 apply). `shim`: PBFT-CS, ops and results are
  // shim envelopes (properties 8 and 9 apply).
  explicit Checker(bool counter, bool shim = false);

  // Replica `replica` (correct) committed `digest` at `seq` (from Replica::committed_history()).
  void on_committed(NodeId replica, std::uint64_t seq, const Digest& digest);
  // Correct replica `replica` took or installed the checkpoint `digest` at `seq` (its CheckpointRecord).
  void on_checkpoint(NodeId replica, std::uint64_t seq, const Digest& digest);
  // An execution at correct replica `replica` became final.
  void on_final(NodeId replica, const ExecRecord& rec);
  // Client `client` submitted request `request_id`. `step` orders events in real time (strictly increasing
  // across the whole run).
  void on_submit(NodeId client, std::uint64_t request_id, OpKind kind, std::uint64_t step);
  // Speculating client `client` delivered a first reply (kFirst) for `request_id`; `result` is the whole result
  // envelope it carried.
  void on_first(NodeId client, std::uint64_t request_id, const Bytes& result);
  // Client `client` accepted `completion` at `step` (for a speculating client, its final event of `kind`, with
  // the whole result envelope).
  void on_completion(NodeId client, const Completion& completion, std::uint64_t step,
                     FinalKind kind = FinalKind::kPlain);
  // End of the run, after the liveness phase: properties that need the whole history. `counter_values` are
  // the counter values held by the correct replicas once they converged (counter service only).
  void finish(const std::vector<std::pair<NodeId, std::uint64_t>>& counter_values);

  bool failed() const { return !violation_.empty(); }
  const std::string& violation() const { return violation_; }

  std::uint64_t max_committed_seq() const { return committed_.empty() ? 0 : committed_.rbegin()->first; }
  std::uint64_t committed_seqs() const { return committed_.size(); }
  std::uint64_t final_requests() const { return finals_.size(); }
  std::uint64_t successful_increments() const { return ok_values_.size(); }
  std::uint64_t completions() const { return completions_; }
  std::uint64_t read_completions() const { return read_completions_; }
  std::uint64_t pending_completions() const { return pending_.size(); }
  std::uint64_t shim_retries() const { return shim_retries_; }  // agreed requests the shim made no-ops
  std::uint64_t checkpoints() const { return checkpoints_.size(); }
  // The seq at which request (client, request_id) executed in the agreed history, if a correct replica has
  // reported that execution final.
  std::optional<std::uint64_t> agreed_seq(NodeId client, std::uint64_t request_id) const;
  // The step at which client `client` accepted the final result of `request_id` (on_completion), if it has.
  std::optional<std::uint64_t> completion_step(NodeId client, std::uint64_t request_id) const;

 private:
  using Key = std::pair<NodeId, std::uint64_t>;  // (client, request id)
  struct Final {
    NodeId replica = 0;
    std::uint64_t seq = 0;
    Digest result_digest;
    shim::ShimStatus shim_status = shim::ShimStatus::kExecuted;
  };
  struct Op {
    OpKind kind = OpKind::kNull;
    std::uint64_t submit_step = 0;
    bool completed = false;
    std::uint64_t complete_step = 0;
    bool has_value = false;  // a counter result with status ok
    std::uint64_t value = 0;
    bool has_first = false;  // a speculating client delivered a first reply
    Digest first_digest;
  };
  struct Pending {
    Digest result_digest;
    std::uint64_t step = 0;
  };
  // A completed operation with a counter value, for the real-time checks.
  struct Obs {
    const Key* key;
    const Op* op;
  };
  void fail(std::string what);
  void check_real_time();
  bool check_lower_bounds(const std::vector<Obs>& incs, const std::vector<Obs>& reads);
  void check_upper_bounds(const std::vector<Obs>& incs, std::vector<Obs> reads, std::uint64_t max_value);
  bool check_counter_integrity(NodeId replica, const ExecRecord& rec);
  void check_final_kind(NodeId client, std::uint64_t request_id, const Op& op, FinalKind kind, const Digest& digest);
  void record_counter_value(NodeId client, const Completion& c, Op& op);
  void check_client_order(NodeId replica, const ExecRecord& rec);
  void check_predicates(NodeId replica, const ExecRecord& rec);
  // The counter result a (possibly enveloped) result carries; false when it carries none (a no-op, or bytes
  // that do not parse: `status` tells which).
  bool counter_result(std::span<const std::uint8_t> result, shim::ShimStatus& status, CounterResult& out) const;

  bool counter_;
  bool shim_;
  std::string violation_;
  std::map<std::uint64_t, std::pair<Digest, NodeId>> committed_;  // seq -> (digest, first replica seen)
  std::map<Key, Final> finals_;
  std::map<std::uint64_t, std::pair<std::uint64_t, Key>> ok_values_;  // value -> (seq, request)
  std::map<Key, Op> ops_;
  std::map<Key, Pending> pending_;  // accepted ordered results with no final execution yet
  // Per client: request id -> (seq, place in the batch) of its agreed execution (property 10).
  std::map<NodeId, std::map<std::uint64_t, std::pair<std::uint64_t, std::uint32_t>>> client_order_;
  std::map<std::uint64_t, std::pair<Digest, NodeId>> checkpoints_;  // seq -> (digest, first replica seen)
  std::uint64_t completions_ = 0;
  std::uint64_t read_completions_ = 0;
  std::uint64_t accepted_increments_ = 0;  // completed increments with a successful counter result
  std::uint64_t shim_retries_ = 0;
};

std::string to_string(OpKind k);

}  // namespace bftfs::sim
