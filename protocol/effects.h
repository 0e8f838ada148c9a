// What the pure protocol core asks its driver (the libevent runtime or the simulator) to do.
//
// Rule "durable before sent" (TOCS §4.3, and the reason for group commit): a record for which
// record_must_sync() is true backs a promise that leaves in the same Effects (PREPARED backs COMMIT and the
// tentative REPLY; CHECKPOINT backs the CHECKPOINT message and holds the client table; VIEW backs VIEW-CHANGE;
// STABLE lets the log below be discarded). The driver makes such records durable (append + fdatasync) BEFORE it
// sends any message of that Effects, or of any Effects merged with it (group commit).
//
// PrePrepareRecord and CommittedRecord need only be appended in order: a later sync covers them, and a crash
// may lose any suffix of the records not yet synced, even when the messages they accompany were sent. Why that
// is safe (and saves two of the three fdatasyncs on a request's critical path):
// - A lost PrePrepareRecord can hide a PREPARE (or, at the primary, a PRE-PREPARE) this replica sent. Such a
//   vote is never contradicted, because a replica that recovers from its log never votes again in the view it
//   recovered in: Replica::recover() moves it to a view change to the next view (the ViewRecord of that view
//   change is synced before its VIEW-CHANGE goes out). So quorum intersection on prepares in any one view still
//   rests on replicas that vote once, and a restarted primary cannot reuse a sequence number in its old view.
// - A view change only needs what prepared replicas synced: COMMIT and tentative replies wait for the synced
//   PreparedRecord (whose PrePrepareRecord precedes it in the log), so a committed batch has 2f+1 replicas with
//   durable P and Q entries, as the new-view decision (TOCS §4.5) requires.
// - A lost CommittedRecord is re-learned from peers: the commit certificate rests on synced PreparedRecords.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "protocol/messages.h"

namespace bftfs {

// ---- durable records (the replica's write-ahead log) ----
struct ViewRecord {  // the replica entered `view` (or started changing to it)
  std::uint64_t view = 0;
  bool in_view_change = false;
  friend bool operator==(const ViewRecord&, const ViewRecord&) = default;
};
struct PrePrepareRecord {  // accepted (backup) or sent (primary) pre-prepare; Q in a later view change
  std::uint64_t view = 0;
  std::uint64_t seq = 0;
  Batch batch;
  friend bool operator==(const PrePrepareRecord&, const PrePrepareRecord&) = default;
};
struct PreparedRecord {  // this replica reached prepared(view, seq, digest); P in a later view change
  std::uint64_t view = 0;
  std::uint64_t seq = 0;
  Digest digest;
  friend bool operator==(const PreparedRecord&, const PreparedRecord&) = default;
};
struct CommittedRecord {  // committed-local: the batch at seq is final (persisted before its replies go out)
  std::uint64_t seq = 0;
  Digest digest;
  friend bool operator==(const CommittedRecord&, const CommittedRecord&) = default;
};
struct CheckpointRecord {  // this replica took a checkpoint at seq; client_table is the replica's own state
  std::uint64_t seq = 0;
  Digest digest;  // the checkpoint digest sent in CHECKPOINT (service root combined with the client table)
  Bytes client_table;  // serialized client table at seq (see Replica)
  friend bool operator==(const CheckpointRecord&, const CheckpointRecord&) = default;
};
struct StableRecord {  // the checkpoint at seq became stable; the log below may be discarded
  std::uint64_t seq = 0;
  Digest digest;
  friend bool operator==(const StableRecord&, const StableRecord&) = default;
};

using PersistRecord =
    std::variant<ViewRecord, PrePrepareRecord, PreparedRecord, CommittedRecord, CheckpointRecord, StableRecord>;

// True when `r` backs a promise and must be durable before the sends of its Effects (see the rule above).
inline bool record_must_sync(const PersistRecord& r) {
  return !std::holds_alternative<PrePrepareRecord>(r) && !std::holds_alternative<CommittedRecord>(r);
}

// Encoding of records for the write-ahead log (validated like network input: a torn or corrupt tail is
// detected by the log's own checksums, and a record that does not decode stops replay with an error).
Bytes encode_record(const PersistRecord& r);
bool decode_record(std::span<const std::uint8_t> data, PersistRecord& out);

// ---- messages to send ----
struct Send {
  NodeId to = 0;  // a node id, or kAllReplicas (every replica but the sender)
  Message message;
};

// Whether `s` may leave only once every must-sync record appended before it (in this or any earlier Effects)
// is durable. The rule above is written per Effects; a driver that syncs asynchronously (the runtime's sync
// thread) keeps the loop going while a group is written, and needs to know which sends the pending sync
// actually holds back:
// - COMMIT, CHECKPOINT, VIEW-CHANGE, NEW-VIEW and every REPLY that is not a PBFT-CS early reply make a promise
//   backed by a must-sync record (a committed or read-only reply counts this replica's own COMMIT, so it
//   waits like the COMMIT): they wait, in order.
// - PRE-PREPARE, PREPARE, STATUS, FETCH-BATCH, BATCH-DATA, FETCH-STATE, STATE-NODE, STATE-LEAF, forwarded
//   REQUESTs and early replies promise nothing that a lost PreparedRecord, CheckpointRecord or StableRecord
//   could break: PRE-PREPARE and PREPARE are already sent without their own record being durable (the
//   argument above: a replica that recovers never votes again in the view it recovered in), and the rest are
//   hints or self-certifying data. They need only the replica's current view to be durable, since that
//   argument rests on the recovered view being at least the view they were sent in. So they wait only while
//   a ViewRecord is not durable, and otherwise may overtake waiting sends (the protocol tolerates reordering;
//   the simulator's network reorders).
// This is what lets batch n+1 be pre-prepared and prepared while batch n's PreparedRecord is on its way to
// the disk (TOCS §5.1.4's pipelining of batches, with the log write of §4.3 off the critical path). With
// piggybacked commits (ReplicaOptions::piggyback_commits) the runtime chooses to keep a PRE-PREPARE or PREPARE
// behind a held send to the replicas, so that the deferred COMMIT the core put before it leaves in the same
// write; that only delays it, which is always allowed.
inline bool send_waits_for_log(const Send& s) {
  if (const auto* r = std::get_if<Reply>(&s.message)) return (r->flags & kReplySpeculative) == 0;
  return std::holds_alternative<Commit>(s.message) || std::holds_alternative<Checkpoint>(s.message) ||
         std::holds_alternative<ViewChange>(s.message) || std::holds_alternative<NewView>(s.message);
}

struct Effects {
  std::vector<PersistRecord> persist;
  std::vector<Send> sends;

  bool empty() const { return persist.empty() && sends.empty(); }
  void clear() {
    persist.clear();
    sends.clear();
  }
};

}  // namespace bftfs
