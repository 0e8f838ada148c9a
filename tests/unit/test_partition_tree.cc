// Partition tree (TOCS §5.3.1): shape, digests that bind position, and incremental recomputation.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "common/crypto.h"
#include "protocol/partition_tree.h"

using namespace bftfs;

namespace {

Digest leaf_of(std::uint64_t index, std::uint64_t version) {
  std::vector<std::uint8_t> data(16);
  for (int i = 0; i < 8; ++i) data[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(index >> (8 * i));
  for (int i = 0; i < 8; ++i) data[8 + static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(version >> (8 * i));
  return PartitionTree::leaf_digest(index, data);
}

// Every inner node equals combine() of its children: what a fetcher checks, node by node.
void check_consistent(const PartitionTree& t) {
  for (std::uint32_t level = 0; level < t.depth(); ++level) {
    for (std::uint64_t i = 0; i < t.width(level); ++i) {
      REQUIRE(PartitionTree::combine(level, i, t.children(level, i)) == t.node(level, i));
    }
  }
  REQUIRE(t.node(0, 0) == t.root());
}

}  // namespace

TEST_CASE("partition tree shape: depth is the number of 256-ary levels above the leaves, at least one") {
  CHECK(PartitionTree::depth_for(1) == 1);
  CHECK(PartitionTree::depth_for(256) == 1);
  CHECK(PartitionTree::depth_for(257) == 2);
  CHECK(PartitionTree::depth_for(65536) == 2);
  CHECK(PartitionTree::depth_for(65537) == 3);
  CHECK(PartitionTree::width_for(257, 2) == 257);
  CHECK(PartitionTree::width_for(257, 1) == 2);
  CHECK(PartitionTree::width_for(257, 0) == 1);

  PartitionTree one(1, Digest{});
  CHECK(one.depth() == 1);
  CHECK(one.width(0) == 1);
  CHECK(one.width(1) == 1);
  CHECK(one.children(0, 0).size() == 1);

  PartitionTree t(300, Digest{});
  CHECK(t.leaves() == 300);
  CHECK(t.depth() == 2);
  CHECK(t.width(1) == 2);
  CHECK(t.children(1, 0).size() == 256);
  CHECK(t.children(1, 1).size() == 44);  // the last node is partial
  CHECK(t.children(0, 0).size() == 2);
}

TEST_CASE("partition tree root changes if and only if a leaf changes") {
  PartitionTree t(1000, leaf_of(0, 0));
  const Digest r0 = t.root();
  t.set_leaf(7, leaf_of(0, 0));  // same digest as before: nothing changes
  CHECK(t.root() == r0);
  t.set_leaf(7, leaf_of(7, 1));
  const Digest r1 = t.root();
  CHECK(r1 != r0);
  t.set_leaf(999, leaf_of(999, 1));
  const Digest r2 = t.root();
  CHECK(r2 != r1);
  CHECK(r2 != r0);
  // Back to the original leaves gives back the original root: the root is a function of the leaves only.
  t.set_leaf(7, leaf_of(0, 0));
  t.set_leaf(999, leaf_of(0, 0));
  CHECK(t.root() == r0);
  check_consistent(t);
}

TEST_CASE("partition tree incremental recomputation equals a fresh build") {
  PartitionTree incremental(600, Digest{});
  (void)incremental.root();  // computed once, then changed in place
  for (std::uint64_t i = 0; i < 600; i += 37) incremental.set_leaf(i, leaf_of(i, 3));
  incremental.set_leaf(599, leaf_of(599, 9));

  PartitionTree fresh(600, Digest{});
  for (std::uint64_t i = 0; i < 600; i += 37) fresh.set_leaf(i, leaf_of(i, 3));
  fresh.set_leaf(599, leaf_of(599, 9));

  CHECK(incremental.root() == fresh.root());
  check_consistent(incremental);
  for (std::uint32_t level = 0; level <= fresh.depth(); ++level) {
    for (std::uint64_t i = 0; i < fresh.width(level); ++i) CHECK(incremental.node(level, i) == fresh.node(level, i));
  }
}

TEST_CASE("partition tree copies are snapshots") {
  PartitionTree t(10, Digest{});
  t.set_leaf(3, leaf_of(3, 1));
  const PartitionTree snapshot = t;
  const Digest before = snapshot.root();
  t.set_leaf(3, leaf_of(3, 2));
  CHECK(t.root() != before);
  CHECK(snapshot.root() == before);
  CHECK(snapshot.leaf(3) == leaf_of(3, 1));
}

TEST_CASE("partition tree digests bind position and domain") {
  const std::vector<std::uint8_t> data = {1, 2, 3};
  CHECK(PartitionTree::leaf_digest(0, data) != PartitionTree::leaf_digest(1, data));
  CHECK(PartitionTree::leaf_digest(0, data) != PartitionTree::leaf_digest(0, std::vector<std::uint8_t>{1, 2}));
  const std::vector<Digest> kids = {leaf_of(0, 1), leaf_of(1, 1)};
  CHECK(PartitionTree::combine(0, 0, kids) != PartitionTree::combine(1, 0, kids));
  CHECK(PartitionTree::combine(1, 0, kids) != PartitionTree::combine(1, 1, kids));
  const std::vector<Digest> swapped = {kids[1], kids[0]};
  CHECK(PartitionTree::combine(0, 0, kids) != PartitionTree::combine(0, 0, swapped));
}

TEST_CASE("partition tree with 70,000 leaves has three levels and updates one path") {
  const std::uint64_t leaves = 70000;
  PartitionTree t(leaves, Digest{});
  for (std::uint64_t i = 0; i < leaves; ++i) t.set_leaf(i, leaf_of(i, 0));
  REQUIRE(t.depth() == 3);
  CHECK(t.width(3) == leaves);
  CHECK(t.width(2) == 274);  // ceil(70000 / 256)
  CHECK(t.width(1) == 2);
  CHECK(t.width(0) == 1);
  const Digest r0 = t.root();
  check_consistent(t);
  const Digest other_parent = t.node(2, 0);
  const Digest other_grandparent = t.node(1, 0);
  const Digest parent = t.node(2, 273);  // 69999 / 256
  const Digest grandparent = t.node(1, 1);

  t.set_leaf(69999, leaf_of(69999, 1));
  const Digest r1 = t.root();
  CHECK(r1 != r0);
  // Only the path of leaf 69999 changed.
  CHECK(t.node(2, 0) == other_parent);
  CHECK(t.node(1, 0) == other_grandparent);
  CHECK(t.node(2, 273) != parent);
  CHECK(t.node(1, 1) != grandparent);
  PartitionTree fresh(leaves, Digest{});
  for (std::uint64_t i = 0; i < leaves; ++i) fresh.set_leaf(i, leaf_of(i, i == 69999 ? 1 : 0));
  CHECK(fresh.root() == r1);
  check_consistent(t);
}
