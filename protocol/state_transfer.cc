// State transfer over the partition tree (Castro & Liskov, TOCS 2002, §5.3.2). See state_transfer.h for the
// checkpoint digest and the FetchState addressing.
//
// The fetcher trusts nothing it receives: the target digest was agreed by f+1 replicas (or the new-view
// decision), the meta node is checked against it, and every inner node and leaf is checked against the digest
// its already-verified parent promised. So any one correct source suffices, and a Byzantine source can only
// cost a retry (TOCS §5.3.2, "the replica ... checks the digests against the parent").
#include "protocol/state_transfer.h"

#include <algorithm>
#include <deque>
#include <string_view>
#include <utility>

#include "common/assert.h"
#include "common/crypto.h"

namespace bftfs {
namespace {

constexpr std::string_view kCheckpointTag = "ckpt";

// At most this many FetchState requests outstanding: enough to keep all replicas busy on a large transfer,
// few enough that a burst of answers (up to kPartitionBytesMax each) stays bounded in memory.
constexpr std::size_t kOutstandingMax = 64;

}  // namespace

Digest checkpoint_digest(std::uint64_t seq, const Digest& service_root, const Digest& client_table_digest) {
  DigestBuilder b;
  b.add({reinterpret_cast<const std::uint8_t*>(kCheckpointTag.data()), kCheckpointTag.size()});
  b.add_u64(seq).add_digest(service_root).add_digest(client_table_digest);
  return b.finish();
}

std::optional<Message> serve_fetch_state(const FetchState& req, const Service& service,
                                         std::uint64_t retained_seq, const Bytes& client_table) {
  // Every field of `req` comes from the network: each is range-checked before it reaches an asserting
  // accessor of the tree or the service.
  if (req.checkpoint_seq != retained_seq) return std::nullopt;
  const PartitionTree& tree = service.checkpoint_tree(retained_seq);
  const std::uint32_t depth = tree.depth();
  if (req.level == 0) {
    if (req.index != 0) return std::nullopt;
    StateNode meta;
    meta.checkpoint_seq = retained_seq;
    meta.level = 0;
    meta.index = 0;
    meta.children = {tree.root(), digest_of(client_table)};
    return Message{std::move(meta)};
  }
  if (req.level <= depth) {
    const std::uint32_t tree_level = req.level - 1;
    if (req.index >= tree.width(tree_level)) return std::nullopt;
    StateNode node;
    node.checkpoint_seq = retained_seq;
    node.level = req.level;
    node.index = req.index;
    node.children = tree.children(tree_level, req.index);
    return Message{std::move(node)};
  }
  if (req.level == depth + 1) {
    StateLeaf leaf;
    leaf.checkpoint_seq = retained_seq;
    leaf.index = req.index;
    if (req.index == kClientTableLeaf) {
      leaf.data = client_table;
    } else if (req.index < service.partition_count()) {
      leaf.data = service.read_partition(retained_seq, req.index);
    } else {
      return std::nullopt;
    }
    return Message{std::move(leaf)};
  }
  return std::nullopt;
}

struct StateFetcher::Impl {
  Impl(std::uint32_t n_, NodeId self_, std::uint32_t retry_ticks_, Prng& prng_)
      : n(n_), self(self_), retry_ticks(std::max<std::uint32_t>(retry_ticks_, 1)), prng(prng_), penalty(n_, 0) {}

  // A node or leaf to fetch, addressed as in FetchState, with the digest a verified parent promised for it.
  struct Item {
    std::uint32_t level = 0;
    std::uint64_t index = 0;
    Digest expected;
  };
  struct Outstanding {
    Digest expected;
    NodeId asked = 0;          // the replica the latest request went to
    std::uint64_t deadline = 0;  // tick at which it is re-sent to another replica
  };
  using Key = std::pair<std::uint32_t, std::uint64_t>;  // (level, index)

  const std::uint32_t n;
  const NodeId self;
  const std::uint32_t retry_ticks;
  Prng& prng;

  bool active = false;
  std::uint64_t target_seq = 0;
  Digest target_digest;
  std::uint64_t partition_count = 0;
  std::uint32_t depth = 0;  // depth of the service's partition tree; leaves are fetch level depth + 1
  std::optional<PartitionTree> local;  // a copy: the service may discard its checkpoint mid-transfer

  bool meta_verified = false;
  FetchedState result;
  bool client_table_received = false;
  std::optional<FetchedState> ready;

  std::uint64_t now = 0;
  std::deque<Item> pending;  // breadth-first: verified parents enqueue their differing children
  std::map<Key, Outstanding> outstanding;
  std::vector<Send> sends;
  NodeId cursor = 0;                   // round-robin position over the replicas
  std::vector<std::uint64_t> penalty;  // per replica: wrong answers and timeouts; lower is asked first

  std::uint64_t bytes = 0;
  std::uint64_t rejected = 0;
  std::uint64_t ignored = 0;
  std::uint64_t requests_sent = 0;

  std::uint32_t leaf_level() const { return depth + 1; }

  // The next replica to ask: not self, not `avoid` (the one that just failed) unless no other exists, and
  // among the rest one with the lowest penalty, round-robin so that requests spread over the correct ones.
  NodeId pick(std::optional<NodeId> avoid) {
    std::uint64_t best = UINT64_MAX;
    for (NodeId r = 0; r < n; ++r) {
      if (r == self || (avoid && r == *avoid)) continue;
      best = std::min(best, penalty[r]);
    }
    if (best == UINT64_MAX) {
      // n == 2 and the only peer failed: ask it again rather than nobody.
      BFT_ASSERT(avoid.has_value());
      return *avoid;
    }
    for (std::uint32_t k = 0; k < n; ++k) {
      const NodeId r = (cursor + k) % n;
      if (r == self || (avoid && r == *avoid) || penalty[r] != best) continue;
      cursor = (r + 1) % n;
      return r;
    }
    BFT_UNREACHABLE();
  }

  std::uint64_t jittered_deadline() {
    // ±25% jitter so that retries from several fetchers (or several items) do not move in lockstep.
    const std::uint64_t spread = retry_ticks / 4;
    return now + prng.range(retry_ticks - spread, retry_ticks + spread);
  }

  void send(const Key& key, const Digest& expected, std::optional<NodeId> avoid) {
    const NodeId to = pick(avoid);
    FetchState req;
    req.checkpoint_seq = target_seq;
    req.level = key.first;
    req.index = key.second;
    sends.push_back(Send{to, Message{req}});
    ++requests_sent;
    outstanding[key] = Outstanding{expected, to, jittered_deadline()};
  }

  void pump() {
    while (outstanding.size() < kOutstandingMax && !pending.empty()) {
      const Item item = pending.front();
      pending.pop_front();
      const Key key{item.level, item.index};
      BFT_ASSERT(outstanding.count(key) == 0);  // the tree addresses every node once
      send(key, item.expected, std::nullopt);
    }
  }

  // A wrong answer: penalize the sender, and if it was the replica we were waiting for, ask another one now
  // instead of waiting for the retry timeout.
  void reject(NodeId from, std::map<Key, Outstanding>::iterator it) {
    ++rejected;
    if (from < n) ++penalty[from];
    if (it->second.asked == from) send(it->first, it->second.expected, from);
  }

  // Children of verified tree node (tree_level, index) that differ from the local tree go to the queue.
  void expand(std::uint32_t tree_level, std::uint64_t index, const std::vector<Digest>& children) {
    const std::uint32_t child_level = tree_level + 1;
    for (std::size_t j = 0; j < children.size(); ++j) {
      const std::uint64_t child = index * kTreeFanout + j;
      if (local) {
        const Digest& mine = child_level == depth ? local->leaf(child) : local->node(child_level, child);
        if (mine == children[j]) continue;  // equal subtree: nothing below it differs
      }
      pending.push_back(Item{child_level + 1, child, children[j]});
    }
  }

  void finish_if_complete() {
    if (!meta_verified || !pending.empty() || !outstanding.empty()) return;
    BFT_ASSERT(client_table_received);
    ready = std::move(result);
    result = FetchedState{};
    active = false;
  }

  void on_node(NodeId from, const StateNode& node) {
    if (!active || node.checkpoint_seq != target_seq) {
      ++ignored;
      return;
    }
    auto it = outstanding.find(Key{node.level, node.index});
    if (it == outstanding.end()) {
      ++ignored;
      return;
    }
    if (node.level == leaf_level()) {  // a node where a leaf was asked for
      reject(from, it);
      return;
    }
    if (node.level == 0) {
      // Meta node: exactly {service root, client table digest}, bound to the agreed checkpoint digest.
      if (node.children.size() != 2 ||
          checkpoint_digest(target_seq, node.children[0], node.children[1]) != target_digest) {
        reject(from, it);
        return;
      }
      outstanding.erase(it);
      bytes += 2 * kDigestBytes;
      meta_verified = true;
      result.service_root = node.children[0];
      pending.push_back(Item{leaf_level(), kClientTableLeaf, node.children[1]});
      if (!local || local->root() != result.service_root) {
        pending.push_back(Item{1, 0, result.service_root});
      }
    } else {
      const std::uint32_t tree_level = node.level - 1;
      const std::uint64_t below = PartitionTree::width_for(partition_count, tree_level + 1);
      const std::uint64_t first = node.index * kTreeFanout;
      BFT_ASSERT(first < below);  // we only ask for nodes that exist
      const std::uint64_t count = std::min<std::uint64_t>(kTreeFanout, below - first);
      if (node.children.size() != count ||
          PartitionTree::combine(tree_level, node.index, node.children) != it->second.expected) {
        reject(from, it);
        return;
      }
      outstanding.erase(it);
      bytes += node.children.size() * kDigestBytes;
      expand(tree_level, node.index, node.children);
    }
    pump();
    finish_if_complete();
  }

  void on_leaf(NodeId from, const StateLeaf& leaf) {
    if (!active || leaf.checkpoint_seq != target_seq) {
      ++ignored;
      return;
    }
    auto it = outstanding.find(Key{leaf_level(), leaf.index});
    if (it == outstanding.end()) {
      ++ignored;
      return;
    }
    if (leaf.index == kClientTableLeaf) {
      if (digest_of(leaf.data) != it->second.expected) {
        reject(from, it);
        return;
      }
      result.client_table = leaf.data;
      client_table_received = true;
    } else {
      if (PartitionTree::leaf_digest(leaf.index, leaf.data) != it->second.expected) {
        reject(from, it);
        return;
      }
      result.partitions[leaf.index] = leaf.data;
    }
    outstanding.erase(it);
    bytes += leaf.data.size();
    pump();
    finish_if_complete();
  }

  void on_tick() {
    ++now;
    if (!active) return;
    for (auto& [key, o] : outstanding) {
      if (o.deadline > now) continue;
      // Unanswered: the replica is slow, crashed, lacks the checkpoint or is lying by silence. Ask another.
      if (o.asked < n) ++penalty[o.asked];
      send(key, o.expected, o.asked);
    }
  }
};

StateFetcher::StateFetcher(std::uint32_t n, NodeId self, std::uint32_t fetch_retry_ticks, Prng& prng)
    : impl_(std::make_shared<Impl>(n, self, fetch_retry_ticks, prng)) {
  BFT_ASSERT(n >= 2);
  BFT_ASSERT(self < n);
}

void StateFetcher::start(std::uint64_t seq, const Digest& digest, const PartitionTree* local,
                         std::uint64_t partition_count) {
  Impl& s = *impl_;
  BFT_ASSERT(!s.active || seq > s.target_seq);
  BFT_ASSERT(partition_count > 0);
  // A restart forgets everything of the old target: its nodes are not known to be part of the new one, and
  // answers still in flight for it carry the old seq and are ignored. Penalties are kept: a replica that lied
  // or stayed silent is asked last again.
  s.active = true;
  s.target_seq = seq;
  s.target_digest = digest;
  s.partition_count = partition_count;
  s.depth = PartitionTree::depth_for(partition_count);
  s.local.reset();
  if (local != nullptr && local->leaves() == partition_count) s.local.emplace(*local);
  s.meta_verified = false;
  s.result = FetchedState{};
  s.result.seq = seq;
  s.result.checkpoint_digest = digest;
  s.client_table_received = false;
  s.ready.reset();
  s.pending.clear();
  s.outstanding.clear();
  s.pending.push_back(Impl::Item{0, 0, digest});
  s.pump();
}

bool StateFetcher::active() const { return impl_->active; }
std::uint64_t StateFetcher::target_seq() const { return impl_->target_seq; }

void StateFetcher::on_state_node(NodeId from, const StateNode& node) { impl_->on_node(from, node); }
void StateFetcher::on_state_leaf(NodeId from, const StateLeaf& leaf) { impl_->on_leaf(from, leaf); }
void StateFetcher::on_tick() { impl_->on_tick(); }

std::vector<Send> StateFetcher::take_sends() { return std::exchange(impl_->sends, {}); }

std::optional<FetchedState> StateFetcher::take_result() {
  auto out = std::move(impl_->ready);
  impl_->ready.reset();
  return out;
}

std::uint64_t StateFetcher::bytes_fetched() const { return impl_->bytes; }
std::uint64_t StateFetcher::rejected() const { return impl_->rejected; }
std::uint64_t StateFetcher::ignored() const { return impl_->ignored; }
std::uint64_t StateFetcher::requests_sent() const { return impl_->requests_sent; }

}  // namespace bftfs
