// The replica's client table (protocol/replica_client_table.h): freshness window, cached replies, tentative
// undo, and the canonical encoding that is fetched from peers during state transfer.
#include <catch2/catch.hpp>

#include <map>
#include <vector>

#include "common/prng.h"
#include "protocol/messages.h"
#include "protocol/replica_client_table.h"

using namespace bftfs;

namespace {

Bytes result_of(std::uint64_t id) { return Bytes{static_cast<std::uint8_t>(id), 0xAB}; }

}  // namespace

TEST_CASE("client table classifies ids as fresh, executed or stale against its window", "[replica][client_table]") {
  ClientTable t(4);
  CHECK(t.classify(10, 1) == ClientTable::Freshness::kFresh);
  t.record(10, 1, 1, result_of(1), false);
  t.record(10, 3, 2, result_of(3), false);
  CHECK(t.classify(10, 1) == ClientTable::Freshness::kExecuted);
  CHECK(t.classify(10, 2) == ClientTable::Freshness::kFresh);  // inside the window, not executed: allowed
  CHECK(t.classify(10, 3) == ClientTable::Freshness::kExecuted);
  CHECK(t.classify(10, 4) == ClientTable::Freshness::kFresh);
  t.record(10, 6, 3, result_of(6), false);  // window is now (2, 6]
  CHECK(t.classify(10, 1) == ClientTable::Freshness::kStale);
  CHECK(t.classify(10, 2) == ClientTable::Freshness::kStale);
  CHECK(t.classify(10, 3) == ClientTable::Freshness::kExecuted);
  CHECK(t.cached_reply(10, 1) == nullptr);  // evicted with its id
  REQUIRE(t.cached_reply(10, 3) != nullptr);
  CHECK(t.cached_reply(10, 3)->result == result_of(3));
  CHECK(t.cached_reply(10, 3)->seq == 2);
  CHECK(t.highest_executed(10) == 6);
  CHECK(t.classify(11, 1) == ClientTable::Freshness::kFresh);  // clients are independent
  t.check_invariants();
}

TEST_CASE("client table rollback undoes tentative records exactly, newest first", "[replica][client_table]") {
  ClientTable t(2);
  t.record(10, 1, 1, result_of(1), false);
  t.record(10, 2, 2, result_of(2), false);
  const Bytes committed = t.encode();
  t.record(10, 3, 3, result_of(3), true);   // evicts id 1
  t.record(11, 1, 3, result_of(1), true);   // a new client
  t.record(10, 9, 4, result_of(9), true);   // evicts everything else
  CHECK(t.has_tentative_above(2));
  CHECK(t.classify(10, 2) == ClientTable::Freshness::kStale);
  t.rollback_to(3);
  CHECK(t.classify(10, 9) == ClientTable::Freshness::kFresh);
  CHECK(t.classify(10, 3) == ClientTable::Freshness::kExecuted);
  t.rollback_to(2);
  CHECK_FALSE(t.has_tentative_above(2));
  CHECK(t.encode() == committed);
  REQUIRE(t.cached_reply(10, 1) != nullptr);
  CHECK(t.cached_reply(10, 1)->result == result_of(1));
  t.check_invariants();
}

TEST_CASE("client table commit_through keeps the records and drops their undo", "[replica][client_table]") {
  ClientTable t(8);
  t.record(10, 1, 5, result_of(1), true);
  t.record(10, 2, 6, result_of(2), true);
  t.commit_through(5);
  t.rollback_to(5);
  CHECK(t.classify(10, 1) == ClientTable::Freshness::kExecuted);
  CHECK(t.classify(10, 2) == ClientTable::Freshness::kFresh);
}

TEST_CASE("client table encoding round-trips and is canonical", "[replica][client_table]") {
  ClientTable a(16);
  a.record(12, 5, 1, result_of(5), false);
  a.record(10, 1, 2, result_of(1), false);
  a.record(10, 2, 3, Bytes{}, false);
  ClientTable b(16);  // same state, other insertion order
  b.record(10, 1, 2, result_of(1), false);
  b.record(10, 2, 3, Bytes{}, false);
  b.record(12, 5, 1, result_of(5), false);
  CHECK(a.encode() == b.encode());
  ClientTable c(16);
  REQUIRE(ClientTable::decode(a.encode(), 16, c));
  CHECK(c.encode() == a.encode());
  CHECK(c.classify(12, 5) == ClientTable::Freshness::kExecuted);
  CHECK(c.client_count() == 2);
  ClientTable empty(16);
  REQUIRE(ClientTable::decode(ClientTable(16).encode(), 16, empty));
  CHECK(empty.client_count() == 0);
}

TEST_CASE("client table decoding rejects malformed bytes without touching the output", "[replica][client_table]") {
  ClientTable a(16);
  a.record(10, 3, 1, result_of(3), false);
  a.record(10, 4, 2, result_of(4), false);
  const Bytes good = a.encode();
  ClientTable out(16);
  out.record(99, 1, 1, result_of(1), false);
  const Bytes before = out.encode();

  SECTION("wrong window") { CHECK_FALSE(ClientTable::decode(good, 8, out)); }
  SECTION("every truncation") {
    for (std::size_t len = 0; len < good.size(); len++) {
      CHECK_FALSE(ClientTable::decode(std::span<const std::uint8_t>(good.data(), len), 16, out));
    }
  }
  SECTION("trailing byte") {
    Bytes b = good;
    b.push_back(0);
    CHECK_FALSE(ClientTable::decode(b, 16, out));
  }
  SECTION("bad magic") {
    Bytes b = good;
    b[0] ^= 1;
    CHECK_FALSE(ClientTable::decode(b, 16, out));
  }
  SECTION("mask bit without a reply") {
    Bytes b = good;
    // header 16 bytes, client id 4, hi 8, then the mask: set a third bit.
    b[16 + 4 + 8] |= 0x04;
    CHECK_FALSE(ClientTable::decode(b, 16, out));
  }
  SECTION("mask bit for an id at or below zero") {
    ClientTable small(16);
    small.record(10, 1, 1, result_of(1), false);
    Bytes b = small.encode();
    b[16 + 4 + 8] |= 0x02;  // would stand for id 0
    CHECK_FALSE(ClientTable::decode(b, 16, out));
  }
  SECTION("huge client count") {
    Bytes b = good;
    b[12] = 0xFF;
    b[13] = 0xFF;
    CHECK_FALSE(ClientTable::decode(b, 16, out));
  }
  CHECK(out.encode() == before);
}

TEST_CASE("client table: a predecessor is done once executed or stale, and a rollback undoes that",
          "[replica][client_table][order]") {
  ClientTable t(4);
  CHECK(t.predecessor_done(10, 0));        // no predecessor
  CHECK_FALSE(t.predecessor_done(10, 1));  // fresh: it may still execute, so its successor waits
  t.record(10, 1, 1, result_of(1), false);
  CHECK(t.predecessor_done(10, 1));
  CHECK_FALSE(t.predecessor_done(11, 1));  // clients are independent
  t.record(10, 3, 2, result_of(3), true);  // tentative
  CHECK(t.predecessor_done(10, 3));
  CHECK_FALSE(t.predecessor_done(10, 2));  // inside the window, not executed
  t.record(10, 9, 3, result_of(9), true);  // window (5, 9]: ids up to 5 can never execute again
  CHECK(t.predecessor_done(10, 2));
  CHECK(t.predecessor_done(10, 5));
  CHECK_FALSE(t.predecessor_done(10, 6));
  t.rollback_to(1);  // the answers follow the executed history exactly
  CHECK(t.predecessor_done(10, 1));
  CHECK_FALSE(t.predecessor_done(10, 2));
  CHECK_FALSE(t.predecessor_done(10, 3));
  t.check_invariants();
}

// The table keeps its replies in a ring of `window` slots; this checks it, seeded, against the plainest model:
// per client a map from executed id to (seq, result), everything at or below hi - window dropped, and a full
// copy of the model per tentative seq for rollback. Windows 1..64, ids that step by 1 (the common case), jump
// past the window, or fill holes below hi.
TEST_CASE("client table matches a map model under random records, commits and rollbacks", "[replica][client_table]") {
  struct Model {
    struct Client {
      std::uint64_t hi = 0;
      std::map<std::uint64_t, CachedReply> replies;
    };
    std::map<NodeId, Client> clients;
  };
  for (std::uint64_t seed = 1; seed <= 60; seed++) {
    Prng rng(seed);
    const std::uint32_t window = seed <= 3 ? static_cast<std::uint32_t>(seed) : static_cast<std::uint32_t>(rng.range(1, 64));
    ClientTable t(window);
    Model m;
    std::map<std::uint64_t, Model> before;  // the model as it was before each tentative seq
    std::uint64_t seq = 1;
    std::uint64_t committed = 0;
    for (int step = 0; step < 600; step++) {
      const std::uint64_t roll = rng.below(100);
      if (roll < 6 && seq > committed + 1) {  // roll back to a random point above the committed prefix
        const std::uint64_t to = rng.range(committed, seq - 1);
        t.rollback_to(to);
        auto it = before.upper_bound(to);
        if (it != before.end()) m = it->second;
        before.erase(it, before.end());
        seq = to + 1;
      } else if (roll < 10) {
        t.commit_through(seq - 1);
        committed = seq - 1;
        before.erase(before.begin(), before.upper_bound(committed));  // records at `seq` stay tentative
      } else {
        const bool tentative = rng.chance(3, 4);
        if (tentative && !before.count(seq)) before.emplace(seq, m);
        const NodeId client = static_cast<NodeId>(10 + rng.below(3));
        auto& c = m.clients[client];
        std::uint64_t id = 0;
        const std::uint64_t kind = rng.below(10);
        if (kind < 6 || c.hi == 0) {
          id = c.hi + 1;
        } else if (kind < 8) {
          id = c.hi + 1 + rng.below(2 * window + 2);
        } else {
          // A hole below hi that is still inside the window, if there is one.
          const std::uint64_t low = c.hi >= window ? c.hi - window + 1 : 1;
          id = rng.range(low, c.hi);
          if (c.replies.count(id)) id = c.hi + 1;
        }
        REQUIRE(t.classify(client, id) == ClientTable::Freshness::kFresh);
        const Bytes result{static_cast<std::uint8_t>(id), static_cast<std::uint8_t>(seq), 0x5A};
        t.record(client, id, seq, result, tentative);
        c.replies[id] = CachedReply{seq, result};
        c.hi = std::max(c.hi, id);
        if (c.hi >= window) c.replies.erase(c.replies.begin(), c.replies.lower_bound(c.hi - window + 1));
        if (!tentative) {
          // An untentative record may only follow committed ones: keep the model's history consistent.
          t.commit_through(seq);
          committed = seq;
          before.clear();
        }
        if (rng.chance(1, 3)) seq++;
      }
      t.check_invariants();
      // Compare every id near each client's window.
      for (NodeId client = 10; client < 13; client++) {
        auto it = m.clients.find(client);
        const std::uint64_t hi = it == m.clients.end() ? 0 : it->second.hi;
        REQUIRE(t.highest_executed(client) == hi);
        for (std::uint64_t id = hi > window + 2 ? hi - window - 2 : 1; id <= hi + 2; id++) {
          const CachedReply* got = t.cached_reply(client, id);
          const CachedReply* want = nullptr;
          if (it != m.clients.end()) {
            auto r = it->second.replies.find(id);
            if (r != it->second.replies.end()) want = &r->second;
          }
          REQUIRE((got == nullptr) == (want == nullptr));
          if (got != nullptr) {
            REQUIRE(got->seq == want->seq);
            REQUIRE(got->result == want->result);
            REQUIRE(t.classify(client, id) == ClientTable::Freshness::kExecuted);
          } else if (hi >= window && id <= hi - window) {
            REQUIRE(t.classify(client, id) == ClientTable::Freshness::kStale);
          } else {
            REQUIRE(t.classify(client, id) == ClientTable::Freshness::kFresh);
          }
        }
      }
      ClientTable copy(window);
      REQUIRE(ClientTable::decode(t.encode(), window, copy));
      REQUIRE(copy.encode() == t.encode());
    }
  }
}
