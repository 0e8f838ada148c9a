// Deterministic sample messages and log records of every type, valid for the decoders, from empty to large.
// Shared by the wire/record unit tests and the fuzz seed-corpus generator, so that both cover the same shapes.
#pragma once

#include <cstdint>
#include <vector>

#include "common/crypto.h"
#include "common/prng.h"
#include "protocol/effects.h"
#include "protocol/messages.h"

namespace bftfs::samples {

inline Bytes bytes(Prng& prng, std::size_t n) {
  Bytes b(n);
  for (auto& x : b) x = static_cast<std::uint8_t>(prng.next());
  return b;
}

inline Digest digest(Prng& prng) {
  Digest d;
  for (auto& x : d.bytes) x = static_cast<std::uint8_t>(prng.next());
  return d;
}

inline Signature signature(Prng& prng) {
  Signature s;
  for (auto& x : s.bytes) x = static_cast<std::uint8_t>(prng.next());
  return s;
}

// A request from `client` (>= replicas) with `op_bytes` of operation and a full authenticator.
inline Request request(Prng& prng, std::uint32_t replicas, NodeId client, std::size_t op_bytes) {
  Request r;
  r.client = client;
  r.request_id = prng.next() | 1;  // never 0
  r.prev_request_id = prng.chance(1, 2) ? 0 : prng.below(r.request_id);  // below the id, as decode requires
  r.flags = prng.chance(1, 2) ? kRequestReadOnly : 0;
  r.replier = prng.chance(1, 2) ? kReplierAll : static_cast<NodeId>(prng.below(replicas));
  r.op = bytes(prng, op_bytes);
  r.authenticator.resize(replicas);
  for (auto& m : r.authenticator) {
    for (auto& x : m.bytes) x = static_cast<std::uint8_t>(prng.next());
  }
  return r;
}

inline Batch batch(Prng& prng, std::uint32_t replicas, std::size_t requests, std::size_t op_bytes) {
  Batch b;
  b.timestamp_ns = prng.next();
  for (std::size_t i = 0; i < requests; ++i) {
    b.requests.push_back(request(prng, replicas, replicas + static_cast<NodeId>(i % 7), op_bytes));
  }
  return b;
}

inline ViewChange view_change(Prng& prng, std::uint64_t view, NodeId replica, std::size_t entries) {
  ViewChange vc;
  vc.new_view = view;
  vc.replica = replica;
  vc.stable_seq = prng.below(1u << 20);
  for (std::size_t i = 0; i < entries; ++i) {
    vc.checkpoints.push_back({vc.stable_seq + 128 * i, digest(prng)});
    vc.prepared.push_back({vc.stable_seq + 1 + i, digest(prng), prng.below(view + 1)});
    vc.pre_prepared.push_back({vc.stable_seq + 1 + i, digest(prng), prng.below(view + 1)});
  }
  vc.signature = signature(prng);
  return vc;
}

// One message of every type. `large` gives long ops, many requests, many entries, long results and data
// (still far below the limits, so that tests stay fast); otherwise fields are empty or minimal.
inline std::vector<Message> messages(Prng& prng, std::uint32_t replicas, bool large) {
  const std::size_t op = large ? 3000 : 0;
  const std::size_t count = large ? 17 : 0;
  std::vector<Message> out;
  out.emplace_back(request(prng, replicas, replicas + 1, op));
  out.emplace_back(PrePrepare{prng.next(), prng.next(), batch(prng, replicas, count, op / 10)});
  out.emplace_back(Prepare{prng.next(), prng.next(), digest(prng)});
  out.emplace_back(Commit{prng.next(), prng.next(), digest(prng)});
  Reply reply;
  reply.view = prng.next();
  reply.client = replicas + 3;
  reply.request_id = prng.next();
  reply.flags = kReplyTentative | kReplySpeculative;
  if (large) {
    reply.flags |= kReplyHasResult;
    reply.result = bytes(prng, 5000);
    reply.result_digest = digest_of(reply.result);
  } else {
    reply.result_digest = digest(prng);  // a digest-only reply (TOCS §5.1.1)
  }
  out.emplace_back(reply);
  out.emplace_back(Checkpoint{prng.next(), digest(prng)});
  const std::uint64_t view = prng.below(1u << 30) + 1;
  out.emplace_back(view_change(prng, view, static_cast<NodeId>(prng.below(replicas)), count));
  NewView nv;
  nv.view = view;
  const std::size_t vcs = large ? replicas : 0;
  for (std::size_t i = 0; i < vcs; ++i) nv.view_changes.push_back(view_change(prng, view, static_cast<NodeId>(i), count / 4));
  nv.signature = signature(prng);
  out.emplace_back(nv);
  out.emplace_back(Status{prng.next(), large, prng.next(), prng.next(), prng.next()});
  out.emplace_back(FetchBatch{prng.next(), digest(prng)});
  out.emplace_back(BatchData{prng.next(), batch(prng, replicas, count, op / 10)});
  out.emplace_back(FetchState{prng.next(), static_cast<std::uint32_t>(prng.below(4)), large ? kClientTableLeaf : prng.next()});
  StateNode node{prng.next(), static_cast<std::uint32_t>(prng.below(4)), prng.next(), {}};
  for (std::size_t i = 0; i < (large ? kStateChildrenMax : 1u); ++i) node.children.push_back(digest(prng));
  out.emplace_back(node);
  out.emplace_back(StateLeaf{prng.next(), prng.next(), bytes(prng, large ? 7000 : 0)});
  return out;
}

// One log record of every type (requests with `replicas` MACs).
inline std::vector<PersistRecord> records(Prng& prng, std::uint32_t replicas, bool large) {
  std::vector<PersistRecord> out;
  out.emplace_back(ViewRecord{prng.next(), large});
  out.emplace_back(PrePrepareRecord{prng.next(), prng.next(), batch(prng, replicas, large ? 9 : 0, large ? 700 : 0)});
  out.emplace_back(PreparedRecord{prng.next(), prng.next(), digest(prng)});
  out.emplace_back(CommittedRecord{prng.next(), digest(prng)});
  out.emplace_back(CheckpointRecord{prng.next(), digest(prng), bytes(prng, large ? 4000 : 0)});
  out.emplace_back(StableRecord{prng.next(), digest(prng)});
  return out;
}

// The sender and receiver a valid frame of `m` has in a cluster of `replicas` replicas: requests go from a
// client to replica 0, replies from replica 1 to a client, view changes from their signer, the rest between
// replicas 1 and 2. Precondition: replicas >= 3.
struct Route {
  NodeId sender = 0;
  NodeId receiver = 0;
};
inline Route route_of(const Message& m, std::uint32_t replicas) {
  if (const auto* r = std::get_if<Request>(&m)) return {r->client, 0};
  if (const auto* r = std::get_if<Reply>(&m)) return {1, r->client};
  if (const auto* vc = std::get_if<ViewChange>(&m)) return {vc->replica, vc->replica == 0 ? 1u : 0u};
  (void)replicas;
  return {1, 2};
}

}  // namespace bftfs::samples
