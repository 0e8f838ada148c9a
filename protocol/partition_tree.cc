// The partition tree (TOCS §5.3.1): a 256-ary Merkle tree over the service's partitions. See
// partition_tree.h for the contract.
//
// Digests are domain-separated ("leaf" / "node") and bind their position (level, index), so a digest of one
// node can never be presented as the digest of another: a fetcher that checks every node against what its
// parent promised therefore receives exactly the tree the root commits to (TOCS §5.3.2).
#include "protocol/partition_tree.h"

#include <algorithm>
#include <string_view>

#include "common/assert.h"
#include "common/crypto.h"

namespace bftfs {
namespace {

constexpr std::string_view kLeafTag = "leaf";
constexpr std::string_view kNodeTag = "node";

std::span<const std::uint8_t> tag_bytes(std::string_view tag) {
  return {reinterpret_cast<const std::uint8_t*>(tag.data()), tag.size()};
}

// ceil(w / fanout): the number of parents of `w` nodes.
std::uint64_t parents_of(std::uint64_t w) { return w / kTreeFanout + (w % kTreeFanout != 0 ? 1 : 0); }

}  // namespace

std::uint32_t PartitionTree::depth_for(std::uint64_t leaves) {
  BFT_ASSERT(leaves > 0);
  // At least one inner level, so that even a one-partition service has a root distinct from its leaf.
  std::uint32_t depth = 0;
  std::uint64_t w = leaves;
  do {
    w = parents_of(w);
    ++depth;
  } while (w > 1);
  return depth;
}

std::uint64_t PartitionTree::width_for(std::uint64_t leaves, std::uint32_t level) {
  const std::uint32_t depth = depth_for(leaves);
  BFT_ASSERT(level <= depth);
  std::uint64_t w = leaves;
  for (std::uint32_t l = depth; l > level; --l) w = parents_of(w);
  return w;
}

PartitionTree::PartitionTree(std::uint64_t leaves, const Digest& initial_leaf)
    : leaves_(leaves), depth_(depth_for(leaves)) {
  levels_.resize(depth_ + 1);
  dirty_.resize(depth_);
  for (std::uint32_t l = 0; l <= depth_; ++l) {
    const std::uint64_t w = width_for(leaves_, l);
    if (l == depth_) {
      levels_[l].assign(w, initial_leaf);
    } else {
      levels_[l].assign(w, Digest{});
      // Every inner node starts dirty; the first root() computes them all once.
      dirty_[l].assign(w, true);
    }
  }
  BFT_ASSERT(levels_[0].size() == 1);
}

std::uint64_t PartitionTree::width(std::uint32_t level) const {
  BFT_ASSERT(level <= depth_);
  return levels_[level].size();
}

void PartitionTree::set_leaf(std::uint64_t index, const Digest& d) {
  BFT_ASSERT(index < leaves_);
  if (levels_[depth_][index] == d) return;  // unchanged: keep the path clean
  levels_[depth_][index] = d;
  // Mark the path to the root. Stop early where a node is already dirty: its ancestors are too (every
  // marking walks to the root, and refresh() cleans bottom-up).
  std::uint64_t i = index;
  for (std::uint32_t l = depth_; l > 0; --l) {
    i /= kTreeFanout;
    if (dirty_[l - 1][i]) break;
    dirty_[l - 1][i] = true;
  }
}

const Digest& PartitionTree::leaf(std::uint64_t index) const {
  BFT_ASSERT(index < leaves_);
  return levels_[depth_][index];
}

Digest PartitionTree::root() const {
  refresh();
  return levels_[0][0];
}

std::vector<Digest> PartitionTree::children(std::uint32_t level, std::uint64_t index) const {
  BFT_ASSERT(level < depth_);
  BFT_ASSERT(index < levels_[level].size());
  refresh();
  const auto& below = levels_[level + 1];
  const std::uint64_t first = index * kTreeFanout;
  const std::uint64_t end = std::min<std::uint64_t>(first + kTreeFanout, below.size());
  BFT_ASSERT(first < end);
  return std::vector<Digest>(below.begin() + static_cast<std::ptrdiff_t>(first),
                             below.begin() + static_cast<std::ptrdiff_t>(end));
}

Digest PartitionTree::node(std::uint32_t level, std::uint64_t index) const {
  BFT_ASSERT(level <= depth_);
  BFT_ASSERT(index < levels_[level].size());
  if (level < depth_) refresh();
  return levels_[level][index];
}

Digest PartitionTree::combine(std::uint32_t level, std::uint64_t index, const std::vector<Digest>& children) {
  BFT_ASSERT(!children.empty());
  BFT_ASSERT(children.size() <= kTreeFanout);
  DigestBuilder b;
  b.add(tag_bytes(kNodeTag)).add_u32(level).add_u64(index);
  for (const auto& c : children) b.add_digest(c);
  return b.finish();
}

Digest PartitionTree::leaf_digest(std::uint64_t index, std::span<const std::uint8_t> data) {
  DigestBuilder b;
  b.add(tag_bytes(kLeafTag)).add_u64(index).add(data);
  return b.finish();
}

void PartitionTree::refresh() const {
  // Every dirty node has a dirty parent (set_leaf marks whole paths), so a clean root means a clean tree,
  // and a depth-first walk that descends only into dirty nodes recomputes exactly the changed paths:
  // O(changed leaves * depth) hashes instead of a full rebuild.
  if (!dirty_[0][0]) return;
  struct Walker {
    const PartitionTree& t;
    void recompute(std::uint32_t level, std::uint64_t index) const {
      const std::uint64_t first = index * kTreeFanout;
      const std::uint64_t end = std::min<std::uint64_t>(first + kTreeFanout, t.levels_[level + 1].size());
      if (level + 1 < t.depth_) {
        for (std::uint64_t c = first; c < end; ++c) {
          if (t.dirty_[level + 1][c]) recompute(level + 1, c);
        }
      }
      DigestBuilder b;
      b.add(tag_bytes(kNodeTag)).add_u32(level).add_u64(index);
      for (std::uint64_t c = first; c < end; ++c) b.add_digest(t.levels_[level + 1][c]);
      t.levels_[level][index] = b.finish();
      t.dirty_[level][index] = false;
    }
  };
  Walker{*this}.recompute(0, 0);
  BFT_ASSERT(!dirty_[0][0]);
}

}  // namespace bftfs
