// The PBFT-CS shim (Wester et al., NSDI'09 §3.2 "predicated writes", §3.3 reads, §5 "shim layer"): a Service
// that sits between the replication engine and the real service (the counter today, the file service later)
// and enforces the predicates of speculating clients, so that neither the engine nor the inner service knows
// about speculation.
//
// Every ordered request is a predicated envelope (shim/envelope.h): "if response(t_i) = d_i for every
// dependency, then do op". The shim keeps, per client, a log of the digests of the results it returned
// (digest_of of the encoded result, which is exactly Reply::result_digest, so a predicate compares what the
// client saw). A request whose predicates all hold runs the inner op; otherwise it is a no-op whose retry
// result is logged in turn, so whatever predicted the success of a no-op fails too (transitive abort without
// transitive dependency lists). Reads optimized past ordering are never logged (§3.3): a write cannot
// depend on them.
//
// The log is replicated state, with everything that implies:
// - Deterministic truncation (§3.2 "truncated at fixed deterministic intervals"). The rule: a client's log
//   holds the results of its `log_entries_per_client` (N) highest executed request ids; logging an id when
//   the log already holds N drops the lowest id (possibly the new one itself, if it is lower than all N).
//   The decision depends only on the sequence of executions, so every correct replica executing the same
//   sequence keeps the same entries. N >= 64 keeps every request id that the replicas' client table still
//   treats as executed or fresh (ReplicaOptions::client_window <= 64: an id at or below hi - window is stale),
//   so a correct client never depends on a truncated entry while its dependency is still in its window.
// - Bounded memory. At most `clients_max` clients are logged, and at most clients_per_partition_max(options)
//   per shim partition (so an encoded partition never exceeds kPartitionBytesMax). A client that appears
//   when either limit is reached is not logged, deterministically (the decision depends only on the log's
//   state): its requests still execute, but any request of it that has dependencies gets
//   kRetryDependencyUnknown, so it can only issue a dependent request after its dependencies committed (the
//   client then resubmits without them). Encoded, the logs take at most
//   clients_max * (8 + N * 40) bytes: about 40 MiB with the defaults, plus copy-on-write copies of changed
//   partitions per retained checkpoint. The engine only executes authenticated clients of the cluster
//   configuration, so clients_max is set from the number of configured clients.
// - Tentative execution (TOCS §5.1.2): each log change above the last commit_through keeps an undo record,
//   and rollback_to(s) restores the log byte for byte.
// - Checkpoints and state transfer (TOCS §5.3.1): the shim's service has inner.partition_count() + 64
//   partitions. Indices below inner.partition_count() are the inner service's own; the 64 after them hold the
//   logs of the clients c with c % 64 == index - inner.partition_count(), canonically encoded (see shim.cc).
//   The partition tree (and so every checkpoint digest) covers both. All replicas must run with the same
//   ShimOptions, as they must with the same ReplicaOptions::client_window.
// - Durability: the logs go through the SnapshotStore (when not null) before the inner service's checkpoint,
//   and the stored blob keeps the previous checkpoint's logs too, so a crash between the two writes still
//   recovers logs that match the inner service's recovered checkpoint.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include "protocol/messages.h"
#include "protocol/service.h"
#include "shim/envelope.h"

namespace bftfs::shim {

// Shim partitions after the inner service's (a client's log lives in partition inner count + client % 64).
inline constexpr std::uint64_t kShimPartitions = 64;
// N is at least the largest client window of the replicas (ReplicaOptions::client_window <= 64).
inline constexpr std::uint32_t kLogEntriesPerClientMin = 64;
// At N = 65536 one client's encoded log still fits in a partition (8 + 65536 * 40 < kPartitionBytesMax).
inline constexpr std::uint32_t kLogEntriesPerClientMax = 65536;
// The largest result an inner service may return: the shim adds its one-byte status in front. A precondition
// on the inner service (asserted after every inner call): it must bound its results by this, not by
// kResultBytesMax, whatever the op asks for.
inline constexpr std::size_t kInnerResultBytesMax = kResultBytesMax - kResultHeaderBytes;

struct ShimOptions {
  // N of the truncation rule above. kLogEntriesPerClientMin <= N <= kLogEntriesPerClientMax.
  std::uint32_t log_entries_per_client = 1024;
  // Clients whose results are logged at all (>= 1). Set it to at least the number of configured clients.
  std::uint32_t clients_max = 1024;
};

// How many clients one shim partition holds at most under `options`: the most whose logs, full, still
// encode into kPartitionBytesMax. Precondition: options are valid (as for the Shim constructor).
std::uint32_t clients_per_partition_max(const ShimOptions& options);

class Shim final : public Service {
 public:
  // Wraps `inner`, which must outlive the shim and is used only through it from now on (the shim's
  // checkpoints are taken in lockstep with the inner's). `store` may be null (no durability: tests and
  // NO-REP); otherwise it is the store the inner service persists to (or one as durable), and the shim
  // writes one blob, "shim.ckpt", to it. Recovers the logs that belong to inner.recovered_checkpoint();
  // stops the process (an operating error at start-up, like a corrupt counter snapshot) if the store holds
  // no such logs or holds bytes that do not decode. Precondition (asserted): valid options.
  Shim(Service& inner, SnapshotStore* store, ShimOptions options = {});
  ~Shim() override;
  Shim(const Shim&) = delete;
  Shim& operator=(const Shim&) = delete;

  // Service interface: see protocol/service.h; what the shim adds is in the comment at the top of this file.
  //
  // execute: malformed envelope -> kMalformed; else the first dependency (in list order) that is not in the
  // client's log -> kRetryDependencyUnknown, or whose logged digest differs -> kRetryPredicateFailed; else the
  // inner service executes the inner op -> kExecuted with its result (asserted <= kInnerResultBytesMax). The
  // inner service is called only in the last case. Every case logs digest_of(the returned bytes) under
  // (ctx.client, ctx.request_id).
  Bytes execute(const ExecContext& ctx, std::span<const std::uint8_t> op) override;
  // False for a malformed envelope or one with dependencies (§3.3: never optimized); otherwise whatever the
  // inner service answers for the inner op, wrapped as kExecuted. Never logged.
  bool execute_read_only(NodeId client, std::span<const std::uint8_t> op, Bytes& result) override;
  void commit_through(std::uint64_t seq) override;
  void rollback_to(std::uint64_t seq) override;
  CheckpointId checkpoint(std::uint64_t seq, std::span<const std::uint8_t> engine_state = {}) override;
  void discard_checkpoints_below(std::uint64_t seq) override;
  CheckpointId recovered_checkpoint() const override;
  Bytes recovered_engine_state() const override;
  std::uint64_t partition_count() const override;
  const PartitionTree& checkpoint_tree(std::uint64_t seq) const override;
  Bytes read_partition(std::uint64_t seq, std::uint64_t index) const override;
  // Inner partitions are held back until finish_install, which hands them to the inner service only after
  // the shim's own partitions decoded: the Service interface has no way to abort an install, and a rejected
  // install must leave both services as they were (the engine keeps its state then: protocol/replica_state_transfer.cc).
  // The inner service must reject an install with a zero digest (as CounterService does).
  void begin_install(std::uint64_t target_seq) override;
  void install_partition(std::uint64_t index, std::span<const std::uint8_t> data) override;
  CheckpointId finish_install(std::uint64_t target_seq, std::span<const std::uint8_t> engine_state = {}) override;
  // The inner service's (the shim's own partitions live in memory and are never damaged); the inner partition
  // indices are the same in the shim's tree.
  std::vector<std::uint64_t> damaged_partitions() const override;

  // ---- inspection (tests, simulator) ----
  // The digest logged for (client, request_id) in the current (possibly tentative) state, if any.
  std::optional<Digest> logged_digest(NodeId client, std::uint64_t request_id) const;
  // Number of request ids logged for `client` (0 if the client is not logged).
  std::uint64_t logged_entries(NodeId client) const;
  // Number of clients with a log.
  std::uint64_t logged_clients() const;
  const ShimOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bftfs::shim
