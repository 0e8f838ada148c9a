// State transfer (TOCS §5.3.2): a replica that is behind a stable checkpoint fetches that checkpoint from its
// peers, walking the partition tree from the root and fetching only subtrees whose digests differ from its own
// latest checkpoint. Every node and leaf is checked against the digest its parent promised, so one correct
// source is enough and a Byzantine one only wastes a retry.
//
// Checkpoint digest (what CHECKPOINT messages carry and what 2f+1 replicas agree on):
//   checkpoint_digest(seq, service_root, client_table_digest) = H("ckpt" || seq || service_root || ct_digest)
// Fetch addressing (FetchState.level/index):
//   level 0, index 0: the meta node; its StateNode children are exactly {service_root, client_table_digest}.
//   level 1 + l, index i (l < tree depth): node (l, i) of the service's PartitionTree; children as in the tree.
//   level 1 + depth: leaves; index i < partition_count gives StateLeaf with partition i's bytes, and index
//   kClientTableLeaf gives the serialized client table (its digest is digest_of(bytes)).
// Both the fetching side (StateFetcher) and the serving side (serve_fetch_state) live here; the replica owns
// one StateFetcher and forwards StateNode/StateLeaf messages and ticks to it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "common/prng.h"
#include "protocol/effects.h"
#include "protocol/messages.h"
#include "protocol/partition_tree.h"
#include "protocol/service.h"

namespace bftfs {

Digest checkpoint_digest(std::uint64_t seq, const Digest& service_root, const Digest& client_table_digest);

// Answers a FetchState from a retained checkpoint. Returns nothing (no message) if the checkpoint is not
// retained or the address is out of range: a correct fetcher then asks someone else.
// `client_table` is the serialized client table of that checkpoint.
std::optional<Message> serve_fetch_state(const FetchState& req, const Service& service,
                                         std::uint64_t retained_seq, const Bytes& client_table);

struct FetchedState {
  std::uint64_t seq = 0;
  Digest checkpoint_digest;
  Digest service_root;
  std::map<std::uint64_t, Bytes> partitions;  // only the partitions that differ from the local checkpoint
  Bytes client_table;
};

class StateFetcher {
 public:
  // `n` replicas; `self` never fetches from itself. `fetch_retry_ticks`: a request not answered in that many
  // ticks (plus jitter from prng) is sent to another replica.
  StateFetcher(std::uint32_t n, NodeId self, std::uint32_t fetch_retry_ticks, Prng& prng);

  // Starts (or restarts with a newer target) fetching checkpoint `seq` whose digest is `digest` (agreed by
  // f+1 CHECKPOINT messages, or by the new-view decision). `local` is the tree of this replica's latest
  // retained checkpoint (nullptr if none), used to skip equal subtrees. Precondition: !active() or seq greater
  // than the current target.
  void start(std::uint64_t seq, const Digest& digest, const PartitionTree* local, std::uint64_t partition_count);
  bool active() const;
  std::uint64_t target_seq() const;

  void on_state_node(NodeId from, const StateNode& node);
  void on_state_leaf(NodeId from, const StateLeaf& leaf);
  void on_tick();

  // Messages to send (FetchState to one replica at a time per outstanding node). Moves them out.
  std::vector<Send> take_sends();
  // When complete: the fetched state, once; the fetcher becomes inactive.
  std::optional<FetchedState> take_result();

  std::uint64_t bytes_fetched() const;  // leaf and node bytes received and accepted, for benchmarks
  std::uint64_t rejected() const;       // nodes or leaves that did not match their promised digest
  std::uint64_t ignored() const;        // answers to nothing outstanding: late, duplicate, another target
  std::uint64_t requests_sent() const;  // FetchState messages sent, retries included

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace bftfs
