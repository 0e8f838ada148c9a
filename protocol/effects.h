// What the pure protocol core asks its driver (the libevent runtime or the simulator) to do.
//
// Rule "durable before sent" (TOCS §4.3, and the reason for group commit): the driver makes every record in
// `persist` durable (append + fdatasync) BEFORE it sends any message in `sends` of the same Effects. The core
// relies on it: a PREPARE, COMMIT, CHECKPOINT, VIEW-CHANGE or REPLY is a promise backed by a persisted record.
// The driver may merge the Effects of several handler calls (group commit) as long as no send overtakes a
// persist that was emitted before it.
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

// Encoding of records for the write-ahead log (validated like network input: a torn or corrupt tail is
// detected by the log's own checksums, and a record that does not decode stops replay with an error).
Bytes encode_record(const PersistRecord& r);
bool decode_record(std::span<const std::uint8_t> data, PersistRecord& out);

// ---- messages to send ----
struct Send {
  NodeId to = 0;  // a node id, or kAllReplicas (every replica but the sender)
  Message message;
};

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
