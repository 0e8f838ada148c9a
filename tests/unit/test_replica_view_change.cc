// The new-view decision procedure (TOCS §4.5, protocol/new_view_decision.h), on hand-built VIEW-CHANGE sets.
#include <catch2/catch.hpp>

#include <algorithm>

#include "protocol/messages.h"
#include "protocol/new_view_decision.h"

using namespace bftfs;

namespace {

constexpr std::uint32_t kF = 1;
constexpr std::uint64_t kK = 4;
constexpr std::uint64_t kL = 8;

Digest dig(std::uint8_t tag) {
  Digest d;
  d.bytes[0] = tag;
  d.bytes[1] = 0x5A;
  return d;
}

ViewChange vc(NodeId replica, std::uint64_t stable, std::uint8_t ckpt_tag = 0) {
  ViewChange v;
  v.new_view = 2;
  v.replica = replica;
  v.stable_seq = stable;
  v.checkpoints.push_back(CheckpointClaim{stable, dig(static_cast<std::uint8_t>(ckpt_tag + stable))});
  return v;
}

std::optional<NewViewDecision> decide(const std::vector<ViewChange>& set) {
  std::vector<const ViewChange*> ptrs;
  for (const auto& v : set) {
    REQUIRE(view_change_well_formed(v, 4, kK, kL));
    ptrs.push_back(&v);
  }
  return decide_new_view(ptrs, kF, kL);
}

}  // namespace

TEST_CASE("decision with nothing prepared re-proposes nothing from the common checkpoint", "[replica][view_change]") {
  auto d = decide({vc(0, 0), vc(1, 0), vc(2, 0)});
  REQUIRE(d);
  CHECK(d->checkpoint_seq == 0);
  CHECK(d->checkpoint_digest == dig(0));
  CHECK(d->choices.empty());
  CHECK(d->max_seq() == 0);
}

TEST_CASE("decision picks a request prepared at one replica and pre-prepared at f+1", "[replica][view_change]") {
  auto a = vc(0, 0), b = vc(1, 0), c = vc(2, 0);
  a.prepared.push_back(PreparedClaim{2, dig(7), 1});
  a.pre_prepared.push_back(PreparedClaim{2, dig(7), 1});
  b.pre_prepared.push_back(PreparedClaim{2, dig(7), 1});
  auto d = decide({a, b, c});
  REQUIRE(d);
  REQUIRE(d->choices.size() == 2);
  CHECK(d->choices[0] == NewViewChoice{1, null_batch_digest(), false});  // a gap below a choice: null
  CHECK(d->choices[1] == NewViewChoice{2, dig(7), true});
  REQUIRE(d->choice(2) != nullptr);
  CHECK(d->choice(3) == nullptr);
}

TEST_CASE("decision waits when a prepared claim lacks f+1 pre-prepare witnesses", "[replica][view_change]") {
  // Only the claimant pre-prepared it: A2 fails, and B fails because one of three has a P entry.
  auto a = vc(0, 0), b = vc(1, 0), c = vc(2, 0);
  a.prepared.push_back(PreparedClaim{1, dig(7), 1});
  a.pre_prepared.push_back(PreparedClaim{1, dig(7), 1});
  CHECK_FALSE(decide({a, b, c}));
  // A fourth message that saw the pre-prepare settles it.
  auto e = vc(3, 0);
  e.pre_prepared.push_back(PreparedClaim{1, dig(7), 1});
  auto d = decide({a, b, c, e});
  REQUIRE(d);
  REQUIRE(d->choices.size() == 1);
  CHECK(d->choices[0].digest == dig(7));
}

TEST_CASE("decision prefers the prepared claim of the latest view", "[replica][view_change]") {
  auto a = vc(0, 0), b = vc(1, 0), c = vc(2, 0);
  a.prepared.push_back(PreparedClaim{1, dig(1), 0});
  a.pre_prepared.push_back(PreparedClaim{1, dig(1), 0});
  b.prepared.push_back(PreparedClaim{1, dig(2), 1});
  b.pre_prepared.push_back(PreparedClaim{1, dig(1), 0});
  b.pre_prepared.push_back(PreparedClaim{1, dig(2), 1});
  c.pre_prepared.push_back(PreparedClaim{1, dig(2), 1});
  auto d = decide({a, b, c});
  REQUIRE(d);
  REQUIRE(d->choices.size() == 1);
  CHECK(d->choices[0].digest == dig(2));
  // Order of S does not matter.
  auto d2 = decide({c, b, a});
  REQUIRE(d2);
  CHECK(d2->choices == d->choices);
}

TEST_CASE("decision rejects an older-view prepared claim contradicted by a newer one", "[replica][view_change]") {
  // Replica 0 claims dig(1) prepared in view 0 but replica 1 claims dig(2) prepared in view 1: A1 fails for
  // dig(1); dig(2) lacks f+1 Q witnesses; B fails: no decision yet.
  auto a = vc(0, 0), b = vc(1, 0), c = vc(2, 0);
  a.prepared.push_back(PreparedClaim{1, dig(1), 0});
  a.pre_prepared.push_back(PreparedClaim{1, dig(1), 0});
  b.prepared.push_back(PreparedClaim{1, dig(2), 1});
  b.pre_prepared.push_back(PreparedClaim{1, dig(2), 1});
  c.pre_prepared.push_back(PreparedClaim{1, dig(1), 0});
  CHECK_FALSE(decide({a, b, c}));
}

TEST_CASE("decision chooses the highest checkpoint vouched by f+1 with 2f+1 at or below it", "[replica][view_change]") {
  auto a = vc(0, 4), b = vc(1, 4), c = vc(2, 0);
  c.checkpoints.push_back(CheckpointClaim{4, dig(4)});
  auto d = decide({a, b, c});
  REQUIRE(d);
  CHECK(d->checkpoint_seq == 4);
  CHECK(d->checkpoint_digest == dig(4));
  // A checkpoint only one replica vouches for is not chosen, and one that 2f+1 are not at or above is not
  // either: with these three nothing qualifies and the decision waits; a fourth message settles on 0.
  auto x = vc(0, 8), y = vc(1, 0), z = vc(2, 0);
  x.checkpoints.push_back(CheckpointClaim{12, dig(12)});
  CHECK_FALSE(decide({x, y, z}));
  auto d2 = decide({x, y, z, vc(3, 0)});
  REQUIRE(d2);
  CHECK(d2->checkpoint_seq == 0);
}

TEST_CASE("decision keeps prepared entries above a checkpoint and ignores those below", "[replica][view_change]") {
  auto a = vc(0, 4), b = vc(1, 4), c = vc(2, 0);
  c.checkpoints.push_back(CheckpointClaim{4, dig(4)});
  c.prepared.push_back(PreparedClaim{3, dig(3), 0});  // below h*: irrelevant
  c.pre_prepared.push_back(PreparedClaim{3, dig(3), 0});
  c.prepared.push_back(PreparedClaim{6, dig(6), 0});
  c.pre_prepared.push_back(PreparedClaim{6, dig(6), 0});
  a.pre_prepared.push_back(PreparedClaim{6, dig(6), 0});
  auto d = decide({a, b, c});
  REQUIRE(d);
  CHECK(d->checkpoint_seq == 4);
  REQUIRE(d->choices.size() == 2);
  CHECK(d->choices[0] == NewViewChoice{5, null_batch_digest(), false});
  CHECK(d->choices[1] == NewViewChoice{6, dig(6), true});
}

TEST_CASE("decision keeps a null request that prepared even as the last choice", "[replica][view_change]") {
  auto a = vc(0, 0), b = vc(1, 0), c = vc(2, 0);
  for (auto* m : {&a, &b}) {
    m->prepared.push_back(PreparedClaim{1, null_batch_digest(), 1});
    m->pre_prepared.push_back(PreparedClaim{1, null_batch_digest(), 1});
  }
  auto d = decide({a, b, c});
  REQUIRE(d);
  REQUIRE(d->choices.size() == 1);
  CHECK(d->choices[0] == NewViewChoice{1, null_batch_digest(), true});
}

TEST_CASE("decision needs 2f+1 messages", "[replica][view_change]") {
  std::vector<ViewChange> two = {vc(0, 0), vc(1, 0)};
  CHECK_FALSE(decide(two));
}

TEST_CASE("malformed view changes are recognised", "[replica][view_change]") {
  auto good = vc(1, 4);
  good.prepared.push_back(PreparedClaim{5, dig(5), 1});
  good.pre_prepared.push_back(PreparedClaim{5, dig(5), 1});
  good.pre_prepared.push_back(PreparedClaim{5, dig(6), 0});
  REQUIRE(view_change_well_formed(good, 4, kK, kL));
  SECTION("stable checkpoint missing from C") {
    auto m = good;
    m.checkpoints[0].seq = 8;
    CHECK_FALSE(view_change_well_formed(m, 4, kK, kL));
  }
  SECTION("checkpoint not a multiple of K") {
    auto m = good;
    m.checkpoints.push_back(CheckpointClaim{6, dig(6)});
    CHECK_FALSE(view_change_well_formed(m, 4, kK, kL));
  }
  SECTION("P entry at or below the stable checkpoint") {
    auto m = good;
    m.prepared[0].seq = 4;
    CHECK_FALSE(view_change_well_formed(m, 4, kK, kL));
  }
  SECTION("P entry above the window") {
    auto m = good;
    m.prepared[0].seq = 13;
    CHECK_FALSE(view_change_well_formed(m, 4, kK, kL));
  }
  SECTION("P entry from the new view itself") {
    auto m = good;
    m.prepared[0].view = 2;
    CHECK_FALSE(view_change_well_formed(m, 4, kK, kL));
  }
  SECTION("two P entries for one seq") {
    auto m = good;
    m.prepared.push_back(m.prepared[0]);
    CHECK_FALSE(view_change_well_formed(m, 4, kK, kL));
  }
  SECTION("three Q entries for one seq") {
    auto m = good;
    m.pre_prepared.push_back(PreparedClaim{5, dig(9), 0});
    CHECK_FALSE(view_change_well_formed(m, 4, kK, kL));
  }
  SECTION("replica out of range") {
    auto m = good;
    m.replica = 4;
    CHECK_FALSE(view_change_well_formed(m, 4, kK, kL));
  }
}
