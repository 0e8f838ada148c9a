// The PBFT-CS client library (Wester et al., NSDI'09 §3.2, §3.4, §5): a speculation layer over the PBFT client
// core (protocol/client.h) for replicas that run the shim (shim/shim.h). Pure: no I/O, clocks or threads; the
// driver (relay/spec_client_runtime.h, later the relay daemon) feeds it messages and ticks and drains effects.
//
// Event-driven API (§5: "user programs pass requests to libbyz and later receive two callbacks: one delivers the
// first reply and another delivers the consensus reply"): submit() an operation with the earlier operations it
// relies on; take_events() then yields, per operation,
//   - at most one kFirst: the first reply (normally the primary's early reply), which the caller may speculate
//     on; never delivered when speculation is off, when the replying replica is distrusted (below), or when the
//     operation is already doomed because something it relies on was mispredicted;
//   - exactly one final event: kCommit when the consensus reply equals the delivered first reply (or when no
//     first reply was delivered: the caller simply gets the result), kRollback when a first reply was delivered
//     and the consensus differs (the event carries the correct result; the caller discards what it computed from
//     the first reply, and everything that relied on it).
// Many operations may be in flight (the paper's library allowed one and needed 100 logical clients per process).
//
// Predicates (§3.2): an operation submitted with dependencies executes only if each dependency returned what
// the caller predicts for it: the result it gives in SpecDependency::predicted_inner (0-reply speculation), else
// the first reply delivered for it, else (no first reply delivered, final event produced) its consensus result,
// the only one the caller can know. Each dependency is honoured whatever its state at submit():
//   - final event not produced yet: the prediction goes to the replicas as the predicate "that request returned
//     this result". The shim executes the operation only if every predicate holds, otherwise a no-op with a
//     retry result; so an operation that relied on a wrong prediction never changes the replicated state.
//   - final event produced (taken by the caller or not): the library compares the prediction with the
//     consensus itself. Equal: the dependency holds and no predicate is sent -- it is a settled fact, and the
//     shim keeps only a client's most recent results (shim.h, log truncation), so a predicate on an old request
//     could fail although it holds. Different: the operation can never execute; it is sent with the failing
//     predicate, so every correct replica makes it a no-op (kRetryPredicateFailed, or kRetryDependencyUnknown
//     if its log no longer holds the dependency), and its first reply is never delivered.
// Either way the final event of an operation that relied on a wrong prediction has a retry status (kRollback
// if its own first reply was delivered, else kCommit). The library remembers the consensus of the last
// `finals_remembered` operations whose final event was taken; a dependency on an older one is a precondition
// violation (the caller has long held that final result and must not list it). Dependencies are direct only:
// a request turned into a no-op logs its retry result, so anything that predicted its success fails in turn.
//
// Faulty primaries (§3.4): for each replica the library remembers whether each of its last `failure_window`
// first replies matched the consensus; while more than failure_permille_max/1000 of them failed, it does not
// deliver that replica's first replies (it keeps tracking them, and speculates again when the rate falls).
//
// Reads (§3.3): a read-only operation goes through the read-only optimization unless this client has an ordered
// operation whose final event it has not produced yet: then the read might not see the client's own writes at
// 2f+1 replicas, so it goes through agreement (the paper's simpler policy: "disable the read-only optimization
// while it has any uncommitted writes"). The shim never logs an optimized read's digest, so no operation may
// depend on a read that was optimized (asserted): a caller that wants to write after reading submits the read
// as an ordinary operation.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "protocol/client.h"
#include "shim/envelope.h"

namespace bftfs {

struct SpecClientOptions {
  ClientOptions client;
  bool speculate = true;                   // deliver first replies at all (false: a plain PBFT client over the shim)
  std::uint32_t failure_window = 100;      // n of §3.4: the last n first replies of each replica (0: always
                                           // trust, as the paper's fault experiment did, §6.2)
  std::uint32_t failure_permille_max = 10; // 1%: above this failure rate a replica's first replies are not used
  // Operations whose final event was taken that a later dependency may still name (about 100 bytes each):
  // the library compares such a dependency's prediction with the consensus it remembers (see Predicates).
  std::uint32_t finals_remembered = 1024;
};

// An operation this one relies on: its id (from submit) and, for 0-reply speculation, the inner result the
// caller predicts for it (otherwise the first reply delivered for it is the prediction).
struct SpecDependency {
  std::uint64_t id = 0;
  std::optional<Bytes> predicted_inner;
};

enum class SpecEventKind : std::uint8_t { kFirst, kCommit, kRollback };

struct SpecEvent {
  SpecEventKind kind = SpecEventKind::kFirst;
  std::uint64_t id = 0;
  shim::ShimStatus status = shim::ShimStatus::kExecuted;  // of `result`; a retry status means "not executed"
  Bytes result;  // the inner service's result (empty unless status is kExecuted)
  NodeId from = 0;  // kFirst: the replica whose reply it is
};

struct SpecClientStats {
  std::uint64_t submitted = 0;
  std::uint64_t first_delivered = 0;
  std::uint64_t first_withheld_distrusted = 0;  // a first reply from a replica above the failure threshold
  std::uint64_t first_withheld_doomed = 0;      // a first reply of an operation that relied on a misprediction
  std::uint64_t commits = 0;
  std::uint64_t rollbacks = 0;
  std::uint64_t retries = 0;                    // final results with a retry status
  std::uint64_t predicates_sent = 0;
  std::uint64_t first_mismatches = 0;           // first replies (delivered or not) that differed from consensus
  std::uint64_t reads_ordered = 0;              // read-only operations sent through agreement (§3.3)
};

class SpecClient {
 public:
  SpecClient(const SpecClientOptions& options, NodeId self, const Crypto& crypto, std::uint64_t prng_seed);
  ~SpecClient();
  SpecClient(const SpecClient&) = delete;
  SpecClient& operator=(const SpecClient&) = delete;

  // Submits `op` for the shim's inner service. Preconditions (asserted: a caller that breaks them has a bug):
  // each dependency is an id this client returned, not read-only, either has a prediction of its own, had its
  // kFirst delivered, or had its final event produced, and is in flight or among the last finals_remembered
  // whose final event was taken. At most shim::kDependenciesMax dependencies. Always sends the operation (a
  // doomed one too: every submit gets its final event from the replicas).
  std::uint64_t submit(Bytes op, std::span<const SpecDependency> depends_on, bool read_only = false);
  void on_message(NodeId from, const Message& message);
  void on_tick();

  Effects take_effects();  // sends only
  std::vector<SpecEvent> take_events();

  bool trusts(NodeId replica) const;  // would a first reply from `replica` be delivered now (§3.4)?
  // First replies from `replica` (delivered or not) compared with their consensus so far, and how many of them
  // differed: what the 1% rule judges, for STATUS. 0 for a replica outside the configuration.
  std::uint64_t first_compared(NodeId replica) const;
  std::uint64_t first_mismatched(NodeId replica) const;
  std::size_t in_flight() const;      // submitted, final event not yet produced
  const SpecClientStats& stats() const;
  const ClientStats& client_stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bftfs
