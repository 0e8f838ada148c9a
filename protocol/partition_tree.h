// The partition tree over a service's state (TOCS §5.3.1): leaves are the service's partitions, every inner
// node has up to 256 children and its digest is H("node" || level || index || child digests). The root digest
// is the service part of a checkpoint digest.
//
// Incremental: set_leaf() marks the path dirty and root() recomputes only dirty nodes, so a checkpoint of a
// large state that changed in a few partitions costs a few hashes. Copyable (a snapshot is a copy of the
// inner-node digests; services keep one per retained checkpoint).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/types.h"

namespace bftfs {

inline constexpr std::uint32_t kTreeFanout = 256;

class PartitionTree {
 public:
  // `leaves` > 0. All leaves start as `initial_leaf`.
  PartitionTree(std::uint64_t leaves, const Digest& initial_leaf);

  std::uint64_t leaves() const { return leaves_; }
  // Levels of inner nodes above the leaves: the root is level 0, the parents of leaves are level depth()-1,
  // and the leaves are "level depth()". depth() >= 1.
  std::uint32_t depth() const { return depth_; }
  // Number of nodes at `level` (level <= depth(); at depth() it is leaves()).
  std::uint64_t width(std::uint32_t level) const;

  void set_leaf(std::uint64_t index, const Digest& d);
  const Digest& leaf(std::uint64_t index) const;

  Digest root() const;  // recomputes dirty nodes (logically const)
  // Digests of the children of node (level, index), level < depth(): inner node digests or leaf digests.
  std::vector<Digest> children(std::uint32_t level, std::uint64_t index) const;
  Digest node(std::uint32_t level, std::uint64_t index) const;

  // Digest of the node built from `children` at (level, index): what a fetcher checks a StateNode against.
  static Digest combine(std::uint32_t level, std::uint64_t index, const std::vector<Digest>& children);
  // Digest of a leaf holding `data`: H("leaf" || index || data).
  static Digest leaf_digest(std::uint64_t index, std::span<const std::uint8_t> data);

  // The shape of a tree over `leaves` leaves (> 0) without building it: what depth() and width(level) of
  // such a tree return. A fetcher uses them to address and check a remote tree it does not hold.
  static std::uint32_t depth_for(std::uint64_t leaves);
  static std::uint64_t width_for(std::uint64_t leaves, std::uint32_t level);

 private:
  void refresh() const;
  std::uint64_t leaves_;
  std::uint32_t depth_;
  // levels_[l] holds the digests of level l (0 = root); levels_[depth_] are the leaves.
  mutable std::vector<std::vector<Digest>> levels_;
  mutable std::vector<std::vector<bool>> dirty_;
};

}  // namespace bftfs
