// PBFT messages as values (Castro & Liskov, "Practical Byzantine Fault Tolerance and Proactive Recovery",
// TOCS 2002, §2-§4; the names follow the paper). The wire form is in protocol/wire.h; these structs are what
// the core consumes and produces after decoding and authentication.
//
// Every size here is bounded by a limit below; the decoder rejects anything larger, so the core may rely on
// the bounds (it asserts them when it builds messages itself).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <variant>
#include <vector>

#include "common/types.h"

namespace bftfs {

// ---- limits (enforced by the decoder; a frame over kFrameBytesMax is rejected before allocation) ----
inline constexpr std::uint32_t kReplicasMax = 64;             // n <= 64, so f <= 21
inline constexpr std::uint32_t kOpBytesMax = 1u << 20;        // one request's operation
inline constexpr std::uint32_t kResultBytesMax = (1u << 20) + 4096;
inline constexpr std::uint32_t kBatchRequestsMax = 1024;      // hard wire limit; the configured batch is smaller
// The log keeps the bodies of up to a log window (256) of batches in memory until a checkpoint is stable, and
// a checkpoint interval (128 batches) of writes is digested and made durable at once: 2 MiB batches bound the
// first at 512 MiB per replica and the second at 256 MiB, where 8 MiB batches let one large write grow every
// replica past 2 GiB. Throughput does not suffer: a 2 MiB batch outlasts one log sync (bench: 1 GiB written
// at 25 MB/s with 2 MiB batches, 17 MB/s with 8 MiB, four replicas sharing one disk).
inline constexpr std::uint32_t kBatchBytesMax = 2u << 20;     // primary stops adding requests past this
inline constexpr std::uint32_t kViewChangeEntriesMax = 4096;  // |C|, |P|, |Q| each (Q has <= 2 per seq, L <= 1024)
inline constexpr std::uint32_t kStateChildrenMax = 256;       // partition tree fanout
inline constexpr std::uint32_t kPartitionBytesMax = 4u << 20;
inline constexpr std::uint32_t kFrameBytesMax = 32u << 20;

enum class MsgType : std::uint8_t {
  kRequest = 1,
  kPrePrepare = 2,
  kPrepare = 3,
  kCommit = 4,
  kReply = 5,
  kCheckpoint = 6,
  kViewChange = 7,
  kNewView = 8,
  kStatus = 9,
  kFetchBatch = 10,
  kBatchData = 11,
  kFetchState = 12,
  kStateNode = 13,
  kStateLeaf = 14,
};
std::string_view to_string(MsgType t);

// ---- client request (§2.1 of the TOCS paper; §3.2 for the authenticator) ----
inline constexpr std::uint8_t kRequestReadOnly = 1u << 0;  // read-only optimization (TOCS §5.1.3)
inline constexpr std::uint8_t kRequestFlagsKnown = kRequestReadOnly;

inline constexpr NodeId kReplierAll = 0xFFFFFFFFu;  // every replica sends the full result

struct Request {
  NodeId client = 0;
  std::uint64_t request_id = 0;  // per-client, increasing; the paper's timestamp t
  // The id of the ordered request this client issued just before this one, or 0 for none (a client's first
  // request, or the first after a restart with a fresh id range). A client pipelines (TOCS §5.1.4) and its ids
  // have gaps (read-only requests, a restart), so the replicas cannot tell "the previous request" from the ids
  // alone: this field names it, and replicas execute this request only once that one executed or can never
  // execute (ClientTable::predecessor_done). Always < request_id (checked by the decoder). Covered by digest().
  std::uint64_t prev_request_id = 0;
  std::uint8_t flags = 0;
  NodeId replier = kReplierAll;  // which replica sends the full result (TOCS §5.1.1); others send digests
  Bytes op;
  // authenticator[i] = MAC(session key(client, replica i), digest()). One entry per replica, n entries.
  std::vector<Mac> authenticator;

  bool read_only() const { return (flags & kRequestReadOnly) != 0; }
  // H("req" || client || request_id || prev_request_id || flags || op). The replier and the authenticator are not covered: the
  // authenticator covers the digest, and the replier is advice that a retransmission may change.
  Digest digest() const;
  friend bool operator==(const Request&, const Request&) = default;
};

// ---- ordering (§2.3-§2.4) ----
// A batch is what one sequence number orders. The null request of a view change is the empty batch.
struct Batch {
  std::uint64_t timestamp_ns = 0;  // non-deterministic input chosen by the primary, agreed with the batch
  std::vector<Request> requests;
  // H("batch" || timestamp_ns || count || digest(request_0) || ...). Does not depend on the view, so a batch
  // re-proposed in a later view keeps its digest.
  Digest digest() const;
  bool is_null() const { return requests.empty(); }
  friend bool operator==(const Batch&, const Batch&) = default;
};
Digest null_batch_digest();  // Batch{}.digest()

struct PrePrepare {
  std::uint64_t view = 0;
  std::uint64_t seq = 0;
  Batch batch;
  friend bool operator==(const PrePrepare&, const PrePrepare&) = default;
};

struct Prepare {
  std::uint64_t view = 0;
  std::uint64_t seq = 0;
  Digest digest;
  friend bool operator==(const Prepare&, const Prepare&) = default;
};

struct Commit {
  std::uint64_t view = 0;
  std::uint64_t seq = 0;
  Digest digest;
  friend bool operator==(const Commit&, const Commit&) = default;
};

// ---- reply (§2.1, TOCS §5.1.1 reply digests, §5.1.2 tentative execution, §5.1.3 read-only) ----
inline constexpr std::uint8_t kReplyTentative = 1u << 0;  // executed before commit; client needs 2f+1 matching
inline constexpr std::uint8_t kReplyReadOnly = 1u << 1;   // answer to a read-only request; needs 2f+1 matching
inline constexpr std::uint8_t kReplyHasResult = 1u << 2;  // `result` holds the full result
inline constexpr std::uint8_t kReplySpeculative = 1u << 3;  // PBFT-CS early reply (issue 4)
inline constexpr std::uint8_t kReplyFlagsKnown = 0x0F;

struct Reply {
  std::uint64_t view = 0;
  NodeId client = 0;
  std::uint64_t request_id = 0;
  std::uint8_t flags = 0;
  Digest result_digest;  // digest_of(result), always present
  Bytes result;          // empty unless kReplyHasResult; then digest_of(result) == result_digest (checked)
  friend bool operator==(const Reply&, const Reply&) = default;
};

// ---- checkpoints and garbage collection (§2.5) ----
struct Checkpoint {
  std::uint64_t seq = 0;
  Digest state_digest;
  friend bool operator==(const Checkpoint&, const Checkpoint&) = default;
};

// ---- view change (TOCS §4.5, the P/Q rule that needs no signed prepares) ----
struct CheckpointClaim {
  std::uint64_t seq = 0;
  Digest digest;
  friend bool operator==(const CheckpointClaim&, const CheckpointClaim&) = default;
};
struct PreparedClaim {  // an entry of P (prepared) or Q (pre-prepared)
  std::uint64_t seq = 0;
  Digest digest;
  std::uint64_t view = 0;
  friend bool operator==(const PreparedClaim&, const PreparedClaim&) = default;
};

struct ViewChange {
  std::uint64_t new_view = 0;
  NodeId replica = 0;            // the signer; equals the frame sender when received directly
  std::uint64_t stable_seq = 0;  // h: the sender's last stable checkpoint
  std::vector<CheckpointClaim> checkpoints;  // C
  std::vector<PreparedClaim> prepared;       // P: at most one per seq, seq in (h, h+L]
  std::vector<PreparedClaim> pre_prepared;   // Q: at most two per seq, seq in (h, h+L]
  Signature signature;  // Ed25519 by `replica` over view_change_signing_bytes(*this)
  friend bool operator==(const ViewChange&, const ViewChange&) = default;
};
Bytes view_change_signing_bytes(const ViewChange& vc);  // canonical encoding of every field but the signature

struct NewView {
  std::uint64_t view = 0;
  std::vector<ViewChange> view_changes;  // S: 2f+1 (or more) signed view-change messages for `view`
  Signature signature;  // Ed25519 by the new primary over new_view_signing_bytes(*this)
  friend bool operator==(const NewView&, const NewView&) = default;
};
Bytes new_view_signing_bytes(const NewView& nv);

// ---- retransmission and catch-up ----
// Sent periodically, and by a replica that restarts. A peer that is ahead retransmits what the sender misses
// (pre-prepare bodies, its prepare and commit) or, when that is garbage collected, its checkpoint message.
struct Status {
  std::uint64_t view = 0;
  bool in_view_change = false;
  std::uint64_t stable_seq = 0;
  std::uint64_t last_executed = 0;
  std::uint64_t last_committed = 0;
  friend bool operator==(const Status&, const Status&) = default;
};

struct FetchBatch {  // "send me the batch with this digest at this seq"; any holder can answer
  std::uint64_t seq = 0;
  Digest digest;
  friend bool operator==(const FetchBatch&, const FetchBatch&) = default;
};
struct BatchData {  // self-certifying: the receiver checks batch.digest() against what it asked for
  std::uint64_t seq = 0;
  Batch batch;
  friend bool operator==(const BatchData&, const BatchData&) = default;
};

// ---- state transfer over the partition tree (TOCS §5.3.2; fanout 256) ----
// level 0 is the root; leaves are at level `depth`. The client table of the replica is leaf index
// kClientTableLeaf, outside the service's partitions.
inline constexpr std::uint64_t kClientTableLeaf = 0xFFFFFFFFFFFFFFFFull;

struct FetchState {
  std::uint64_t checkpoint_seq = 0;
  std::uint32_t level = 0;
  std::uint64_t index = 0;  // node index at that level, or a leaf index (or kClientTableLeaf) when level==depth
  friend bool operator==(const FetchState&, const FetchState&) = default;
};
struct StateNode {
  std::uint64_t checkpoint_seq = 0;
  std::uint32_t level = 0;
  std::uint64_t index = 0;
  std::vector<Digest> children;  // <= kStateChildrenMax
  friend bool operator==(const StateNode&, const StateNode&) = default;
};
struct StateLeaf {
  std::uint64_t checkpoint_seq = 0;
  std::uint64_t index = 0;
  Bytes data;  // <= kPartitionBytesMax
  friend bool operator==(const StateLeaf&, const StateLeaf&) = default;
};

using Message = std::variant<Request, PrePrepare, Prepare, Commit, Reply, Checkpoint, ViewChange, NewView, Status,
                             FetchBatch, BatchData, FetchState, StateNode, StateLeaf>;

MsgType type_of(const Message& m);

}  // namespace bftfs
