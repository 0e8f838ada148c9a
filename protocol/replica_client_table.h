// The replica's client table: for every client, which request ids were executed and their replies
// (TOCS §2.1: "replicas keep the last reply sent to each client" so a retransmitted request is answered
// again without being executed twice; we keep a window of replies because a client pipelines up to
// `window` requests, §5.1.4).
//
// The table is replicated state: it is part of every checkpoint (its serialized bytes are hashed into the
// checkpoint digest and fetched as the kClientTableLeaf during state transfer, TOCS §5.3), so every method
// that changes it is deterministic, and the encoding is canonical (clients and replies in increasing order).
//
// Per client the table holds `hi`, the highest executed request id, and a bit mask of which ids in
// (hi - window, hi] were executed (bit i stands for id hi - i), with the cached result of each of them.
// An id <= hi - window is stale: it is neither executed nor answered.
//
// The order rule (predecessor_done) needs no state of its own: "executed" and "stale" are exactly what the
// table already records, so the checkpoint encoding is unchanged by it.
//
// Tentative execution (TOCS §5.1.2) changes the table before a batch commits; record(..., tentative=true)
// keeps undo information per sequence number, so rollback_to(s) restores exactly the table after s and
// commit_through(s) drops the undo information, mirroring Service::rollback_to / commit_through.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "common/types.h"

namespace bftfs {

// The reply to one executed request, as kept for retransmissions.
struct CachedReply {
  std::uint64_t seq = 0;  // sequence number of the batch that executed it
  Bytes result;
};

class ClientTable {
 public:
  // `window` is ReplicaOptions::client_window. Precondition: 1 <= window <= 64 (the mask is one word).
  explicit ClientTable(std::uint32_t window);

  enum class Freshness : std::uint8_t {
    kFresh,     // not executed and inside or above the window: may be executed
    kExecuted,  // executed; cached_reply() has its result
    kStale,     // at or below hi - window: too old to tell, never executed again
  };

  std::uint32_t window() const { return window_; }
  // Precondition: request_id > 0 (id 0 is rejected as invalid before it reaches the table).
  Freshness classify(NodeId client, std::uint64_t request_id) const;
  // The cached reply of an executed request, or nullptr when classify() is not kExecuted.
  const CachedReply* cached_reply(NodeId client, std::uint64_t request_id) const;
  // The highest executed id of `client` (0 if none).
  std::uint64_t highest_executed(NodeId client) const;

  // The per-client order rule (TOCS §5.1.4 lets a client pipeline; we keep its requests in issue order): a
  // request of `client` whose predecessor is `prev_request_id` (Request::prev_request_id) may execute only if
  // this returns true: there is no predecessor (0), or it executed, or it is stale and so can never execute.
  // By induction over the chain of predecessors, every earlier request of the client that can still execute
  // has then executed. The answer depends only on the table, i.e. on the executed history, so every correct
  // replica decides alike at the same point of the sequence (and a rollback restores the same answers).
  bool predecessor_done(NodeId client, std::uint64_t prev_request_id) const;

  // Records the execution of (client, request_id) at `seq` with `result`. Precondition: classify() == kFresh
  // and seq is not below the seq of an earlier tentative record. With `tentative`, keeps undo information
  // until commit_through(seq) or rollback_to(< seq).
  void record(NodeId client, std::uint64_t request_id, std::uint64_t seq, Bytes result, bool tentative);
  // Everything recorded at or below `seq` is final.
  void commit_through(std::uint64_t seq);
  // Undoes every tentative record with a seq above `seq`, newest first.
  void rollback_to(std::uint64_t seq);
  // True if tentative records above `seq` exist.
  bool has_tentative_above(std::uint64_t seq) const;

  // Canonical byte encoding (little-endian):
  //   u32 magic "BFCT", u32 version 1, u32 window, u32 client count,
  //   per client (increasing id): u32 client, u64 hi, u64 mask, u32 reply count,
  //     per reply (increasing id): u64 request id, u64 seq, u32 result bytes, result.
  // Tentative undo information is not part of the state and is not encoded.
  Bytes encode() const;
  // Decodes and validates bytes fetched from a peer (never asserts): magic, version, window equal to
  // `window`, clients strictly increasing, hi > 0 with its bit set, no bits at or above the window nor for ids
  // <= 0, exactly one reply per set bit in increasing id order, result sizes within kResultBytesMax, no
  // trailing bytes. On success replaces `out` (with no undo information) and returns true.
  static bool decode(std::span<const std::uint8_t> bytes, std::uint32_t window, ClientTable& out);

  std::size_t client_count() const { return clients_.size(); }
  // Asserts the representation invariants (see decode for the list).
  void check_invariants() const;

 private:
  // The cached replies of one client sit in a ring of `window` slots: id's reply is in slots[id % window]
  // while its mask bit is set (the window's ids are consecutive, so no two share a slot). A map keyed by id
  // cost a walk of cold tree nodes per record: at 32 closed-loop clients, the largest single item of a
  // replica's profile.
  struct Slot {
    std::uint64_t id = 0;  // 0: empty
    CachedReply reply;
  };
  struct Entry {
    std::uint64_t hi = 0;
    std::uint64_t mask = 0;
    std::vector<Slot> slots;  // `window` of them; a slot is filled exactly when its id's mask bit is set
  };
  struct Undo {
    NodeId client = 0;
    bool created = false;  // the entry did not exist before
    std::uint64_t old_hi = 0;
    std::uint64_t old_mask = 0;
    std::uint64_t request_id = 0;
    std::vector<std::pair<std::uint64_t, CachedReply>> evicted;  // replies pushed out of the window
  };

  std::uint64_t window_mask() const;
  Slot& slot(Entry& e, std::uint64_t id) const { return e.slots[id % window_]; }
  const Slot& slot(const Entry& e, std::uint64_t id) const { return e.slots[id % window_]; }
  // Calls f(id, slot) for every executed id of `e`, in increasing id order.
  template <typename F>
  void for_each_reply(const Entry& e, F&& f) const;

  std::uint32_t window_;
  std::map<NodeId, Entry> clients_;
  std::map<std::uint64_t, std::vector<Undo>> undo_;  // by seq
};

}  // namespace bftfs
