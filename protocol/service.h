// The interface between the replication engine and the replicated service (the null service, the counter, and
// later the file system behind the shim).
//
// Contract, in the words of PBFT (TOCS §2 "the service is a deterministic state machine"):
// - execute() is deterministic: the same state and the same (context, op) give the same result and the same
//   next state on every correct replica. Non-determinism (time) comes only from ExecContext::timestamp_ns,
//   which the primary chose and the replicas agreed on.
// - The engine may execute requests before they commit (tentative execution, TOCS §5.1.2; PBFT-CS early
//   execution, NSDI'09 §3.1). It later calls commit_through(s) when everything up to s committed, or
//   rollback_to(s) to undo every execution after s. rollback_to never goes below the last commit_through.
// - The state is exposed as numbered partitions with digests (TOCS §5.3.1) so that checkpoints have a digest
//   and state transfer fetches only partitions that differ. The tree over the leaves is protocol/partition_tree.h.
// - Durability of the service's state is the service's job: checkpoint(s) returns only when the state after s
//   is on stable storage (the engine then sends its CHECKPOINT message, "durable before sent"), and after a
//   restart recovered_checkpoint() names the last such state; the engine replays its log from there.
// - The engine's own part of a checkpoint (its client table, TOCS §2.1: the replies it must be able to send
//   again) is handed to checkpoint() and finish_install() as opaque `engine_state` bytes, and the service makes
//   them durable in the same atomic write as its own state; recovered_engine_state() returns them. The engine
//   cannot write its part first and the service's after (its log is synced by the driver after the handler
//   returns), and either separate order leaves a crash window in which one half is durable without the other:
//   with the service's half alone, a replica can only wait for a state transfer, and if 2f+1 replicas crashed
//   there at once no peer holds a stable checkpoint to fetch (docs/ARCHITECTURE.md, "Durability").

#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/types.h"
#include "protocol/partition_tree.h"

namespace bftfs {

struct ExecContext {
  std::uint64_t seq = 0;           // sequence number of the batch
  NodeId client = 0;               // authenticated client id
  std::uint64_t request_id = 0;    // the client's request id
  std::uint64_t timestamp_ns = 0;  // agreed non-deterministic time of the batch
};

struct CheckpointId {
  std::uint64_t seq = 0;
  Digest digest;  // root of the service's partition tree at seq
};

class Service {
 public:
  virtual ~Service() = default;

  // Executes one ordered request and returns its result (at most kResultBytesMax bytes). Must not fail on any
  // op bytes: malformed ops return an error result, deterministically.
  virtual Bytes execute(const ExecContext& ctx, std::span<const std::uint8_t> op) = 0;

  // Executes a read-only request against the current state without changing it (TOCS §5.1.3). Returns false
  // if the op is not read-only for this service (the engine then answers nothing and the client falls back to
  // an ordered request).
  virtual bool execute_read_only(NodeId client, std::span<const std::uint8_t> op, Bytes& result) = 0;

  // Everything executed at or below seq is final: undo information for it may be dropped.
  virtual void commit_through(std::uint64_t seq) = 0;
  // Undo every execution of a batch with sequence number > seq. Precondition: seq >= last commit_through.
  virtual void rollback_to(std::uint64_t seq) = 0;

  // Takes a checkpoint of the current state, which is the state after executing seq (the engine calls this
  // only when seq is committed and nothing past seq is executed), together with `engine_state` (the engine's
  // bytes for seq, stored as they are, not part of the digest). Both are durable on return, atomically: after a
  // crash at any point the service recovers either the previous checkpoint with its engine state or this one
  // with this engine state. The checkpoint stays readable (partition_* below) until
  // discard_checkpoints_below(s) with s > seq. Exception: if the service finds its stored state damaged while
  // taking it (damaged_partitions() non-empty after the call), nothing is taken and the returned digest is zero.
  // (The default empty engine state is for callers without an engine: tests and the single-server backends.)
  virtual CheckpointId checkpoint(std::uint64_t seq, std::span<const std::uint8_t> engine_state = {}) = 0;
  virtual void discard_checkpoints_below(std::uint64_t seq) = 0;

  // The last durable checkpoint after a restart (seq 0 and the digest of the initial state if none). Like every
  // newest checkpoint it is retained (readable) until a newer one is taken or installed and discarded below.
  virtual CheckpointId recovered_checkpoint() const = 0;
  // The engine state made durable with recovered_checkpoint() (by checkpoint() or finish_install()). Empty for
  // the initial state, and for a checkpoint written in a format older than engine states (the engine then
  // looks for its CheckpointRecord in its log, as it did before: replica_recovery.cc).
  virtual Bytes recovered_engine_state() const = 0;

  // ---- partitions (fixed count for the life of the service) ----
  virtual std::uint64_t partition_count() const = 0;
  // The partition tree of retained checkpoint `seq` (leaf digests are PartitionTree::leaf_digest of the
  // partition's bytes). Precondition: the checkpoint is retained.
  virtual const PartitionTree& checkpoint_tree(std::uint64_t seq) const = 0;
  // The bytes of partition `index` in retained checkpoint `seq`. Precondition: retained, index < count.
  virtual Bytes read_partition(std::uint64_t seq, std::uint64_t index) const = 0;

  // ---- state transfer (installs a checkpoint fetched from peers) ----
  // Replaces the current state's partition `index` with `data` (already verified against its digest by the
  // engine). Between begin_install and finish_install the service is not executed.
  virtual void begin_install(std::uint64_t target_seq) = 0;
  virtual void install_partition(std::uint64_t index, std::span<const std::uint8_t> data) = 0;
  // Makes the installed state the checkpoint at target_seq, durably and atomically with `engine_state` (as
  // checkpoint() does), and returns its id (the engine checks the digest against the one it fetched for). A
  // rejected install (zero digest) changes nothing durable. target_seq is at least the newest checkpoint's seq,
  // and may be equal: a replica whose service checkpoint cannot be paired with a client table (a store written
  // before engine states were stored with it, whose log lost the record) fetches the checkpoint at that same
  // seq (Replica::Impl::pair_service_state), which then replaces the service's.
  virtual CheckpointId finish_install(std::uint64_t target_seq, std::span<const std::uint8_t> engine_state = {}) = 0;

  // ---- damage (services whose storage verifies what it reads: the file service's checksums) ----
  // Partitions whose stored bytes failed verification. Non-empty means every result computed since is
  // untrustworthy: the engine sends none of them, stops executing and taking checkpoints, and fetches the next
  // stable checkpoint from its peers with these partitions treated as differing (a replica with a damaged disk
  // is one of the f faults until then). A finish_install that replaces them clears them.
  virtual std::vector<std::uint64_t> damaged_partitions() const { return {}; }
};

// Durable key-value storage for small services (null, counter) so they need no file code of their own. The
// runtime implements it with files written to a temporary name, fsynced and renamed; the simulator keeps it in
// memory across simulated crashes.
class SnapshotStore {
 public:
  virtual ~SnapshotStore() = default;
  // Durable on return (the operating-error case aborts the replica: a replica that cannot persist must stop).
  virtual void put(const std::string& name, std::span<const std::uint8_t> data) = 0;
  virtual bool get(const std::string& name, Bytes& out) const = 0;
};

}  // namespace bftfs
