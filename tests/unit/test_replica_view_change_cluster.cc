// View changes of the PBFT replica core (TOCS §2.5, §4.5) on a scripted cluster of four replicas over the counter
// service (tests/unit/test_cluster_util.h): a silent primary, a new primary fetching what it never saw, rollback
// of what the new view drops, joining a view change, a replica alone in one, relayed and forged NEW-VIEWs.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "protocol/replica.h"
#include "services/counter_service.h"
#include "test_cluster_util.h"

using namespace bftfs;
using namespace bftfs::testing;

TEST_CASE("view change after the primary is silent preserves a prepared request", "[replica][view_change]") {
  LogQuiet quiet;
  CounterCluster c(small_options());
  const NodeId client = c.client_ids[0];
  // Every commit of view 0 is lost (retransmissions too): the request prepares everywhere but cannot commit.
  c.drop = [](const Envelope& e) { return is<Commit>(e) && std::get<Commit>(e.message).view == 0; };
  const Request req = c.increment(client);
  c.send_all(req);  // every backup knows the request and waits for it
  c.run();
  for (NodeId i = 1; i < 4; i++) REQUIRE(c.r(i).last_committed() == 0);
  c.crash(0);
  REQUIRE(c.tick_until([&] {
    for (NodeId i = 1; i < 4; i++) {
      if (c.r(i).view() != 1 || c.r(i).in_view_change() || c.r(i).last_committed() < 1) return false;
    }
    return true;
  }));
  for (NodeId i = 1; i < 4; i++) {
    CHECK(c.r(i).stats().new_views_installed == 1);
    CHECK(c.r(i).stats().rollbacks == 0);
    CHECK(c.service(i).value() == 1);
    CHECK(c.r(i).stats().requests_executed == 1);
  }
  CHECK(c.r(1).is_primary());
  require_agreement(c, {1, 2, 3});
  const CounterResult res = c.await(client, req.request_id);
  CHECK(res.value == 1);
  // The new primary orders new requests.
  CHECK(c.do_increment(client, 1).value == 2);
  CHECK(quiet.new_errors() == 0);
}

TEST_CASE("a new primary fetches a chosen batch it never saw before sending the new view", "[replica][view_change]") {
  LogQuiet quiet;
  CounterCluster c(small_options());
  // Replica 1 (the next primary) never gets the pre-prepare; 2 and 3 prepare it; no commit of view 0 arrives.
  c.drop = [](const Envelope& e) {
    if (const auto* pp = std::get_if<PrePrepare>(&e.message)) return pp->view == 0 && e.to == 1;
    if (const auto* cm = std::get_if<Commit>(&e.message)) return cm->view == 0;
    return false;
  };
  const NodeId client = c.client_ids[0];
  const Request req = c.increment(client);
  c.send_all(req);
  c.run();
  REQUIRE(c.r(2).last_executed() == 1);
  REQUIRE(c.r(1).last_executed() == 0);
  const Digest original = [&] {
    for (const auto& rec : c.records(2)) {
      if (const auto* pp = std::get_if<PrePrepareRecord>(&rec)) return pp->batch.digest();
    }
    return Digest{};
  }();
  c.crash(0);
  REQUIRE(c.tick_until([&] {
    for (NodeId i = 1; i < 4; i++) {
      if (c.r(i).view() != 1 || c.r(i).in_view_change() || c.r(i).last_committed() < 1) return false;
    }
    return true;
  }));
  // The re-proposed batch is the original one (same digest), executed once everywhere.
  for (NodeId i = 1; i < 4; i++) {
    REQUIRE(!c.r(i).committed_history().empty());
    CHECK(c.r(i).committed_history()[0].digest == original);
    CHECK(c.service(i).value() == 1);
  }
  CHECK(c.count_delivered([](const Envelope& e) { return is<BatchData>(e) && e.to == 1; }) >= 1);
  CHECK(c.await(client, req.request_id).value == 1);
  CHECK(quiet.new_errors() == 0);
}

TEST_CASE("a tentatively executed batch that the new view drops is rolled back", "[replica][view_change]") {
  LogQuiet quiet;
  CounterCluster c(small_options());
  const NodeId client = c.client_ids[0];
  // In view 0 only replica 2 prepares (it sees replica 1's prepare, nobody sees its own), so only it executes;
  // retransmissions of view-0 messages are lost the same way.
  const auto view0 = [](const Envelope& e) {
    if (const auto* pp = std::get_if<PrePrepare>(&e.message)) return pp->view == 0 && e.to == 3;
    if (const auto* p = std::get_if<Prepare>(&e.message)) return p->view == 0 && (e.to == 0 || (e.from == 2 && e.to == 1));
    if (const auto* cm = std::get_if<Commit>(&e.message)) return cm->view == 0;
    return false;
  };
  c.drop = view0;
  const Request req = c.increment(client);
  c.send(req, 0);
  c.run();
  REQUIRE(c.r(2).last_executed() == 1);
  REQUIRE(c.service(2).value() == 1);
  for (NodeId i : {0u, 1u, 3u}) REQUIRE(c.r(i).last_executed() == 0);
  // The client retransmits to everyone; replicas 1 and 3 time out. The new primary (1) does not hear replica
  // 2's view change, so its decision rests on three messages without a prepared entry: seq 1 is dropped.
  c.drop = [view0](const Envelope& e) { return view0(e) || (is<ViewChange>(e) && e.from == 2 && e.to == 1); };
  c.send_all(req);
  REQUIRE(c.tick_until([&] {
    for (NodeId i = 0; i < 4; i++) {
      if (c.r(i).view() != 1 || c.r(i).in_view_change() || c.r(i).last_committed() < 1) return false;
    }
    return true;
  }));
  CHECK(c.r(2).stats().rollbacks == 1);
  for (NodeId i = 0; i < 4; i++) {
    CHECK(c.service(i).value() == 1);
    CHECK(c.r(i).stats().rollbacks == (i == 2 ? 1u : 0u));
  }
  require_agreement(c, {0, 1, 2, 3});
  CHECK(quiet.new_errors() == 0);
}

TEST_CASE("a replica joins a view change when f+1 others ask for a higher view", "[replica][view_change]") {
  LogQuiet quiet;
  CounterCluster c(small_options());
  // Replicas 1 and 2 time out (they hold a request the primary never orders); 0 and 3 have no reason to.
  c.drop = [](const Envelope& e) { return e.from == 0 && !is<ViewChange>(e) && !is<Status>(e); };
  const NodeId client = c.client_ids[0];
  const Request req = c.increment(client);
  c.send(req, 1);
  c.send(req, 2);
  REQUIRE(c.tick_until([&] { return c.r(0).view() == 1 && c.r(3).view() == 1; }));
  CHECK(c.r(3).stats().view_changes_started == 1);
  c.drop = nullptr;
  REQUIRE(c.tick_until([&] { return c.r(3).last_committed() == 1 && !c.r(3).in_view_change(); }));
  CHECK(c.service(3).value() == 1);
}

TEST_CASE("a replica alone in a view change learns committed batches from commit certificates", "[replica][view_change]") {
  LogQuiet quiet;
  CounterCluster c(small_options());
  // Replica 3 is cut off from the replicas, holding a request nobody else sees: it times out and changes views
  // alone.
  c.drop = [](const Envelope& e) { return (e.to == 3 && e.from < 4) || (e.from == 3 && e.to < 4); };
  c.send(c.increment(c.client_ids[1]), 3);
  c.run();
  REQUIRE(c.tick_until([&] { return c.r(3).in_view_change(); }, 1000));
  c.drop = nullptr;
  const NodeId client = c.client_ids[0];
  for (int k = 0; k < 3; k++) c.do_increment(client);
  // The others stay in view 0 (one view change is not f+1); replica 3 stays in its view change but catches up.
  REQUIRE(c.tick_until([&] { return c.r(3).last_committed() == c.r(0).last_committed(); }, 1000));
  CHECK(c.r(0).view() == 0);
  CHECK(c.r(3).in_view_change());
  CHECK(c.r(3).view() == 1);
  CHECK(c.service(3).value() == 3);
  require_agreement(c, {0, 1, 2, 3});
  // When the others do change views (the primary fails with a request outstanding), it is already there.
  c.crash(0);
  const Request req = c.increment(client);
  c.send_all(req);
  REQUIRE(c.tick_until([&] { return c.r(1).view() == 1 && !c.r(1).in_view_change() && !c.r(3).in_view_change(); }));
  CHECK(c.await(client, req.request_id).value == 4);
  CHECK(c.r(3).stats().view_changes_started == 1);
  CHECK(quiet.new_errors() == 0);
}

TEST_CASE("a new-view relayed by a backup is accepted", "[replica][view_change]") {
  LogQuiet quiet;
  CounterCluster c(small_options());
  // Replica 3 never hears the new primary's NEW-VIEW directly; replica 2 relays its copy after a STATUS.
  c.drop = [](const Envelope& e) { return is<NewView>(e) && e.from == 1 && e.to == 3; };
  c.crash(0);
  const NodeId client = c.client_ids[0];
  const Request req = c.increment(client);
  c.send_all(req);
  REQUIRE(c.tick_until([&] { return c.r(3).view() == 1 && !c.r(3).in_view_change() && c.r(3).last_committed() == 1; }));
  CHECK(c.count_delivered([](const Envelope& e) { return is<NewView>(e) && e.from == 2 && e.to == 3; }) >= 1);
  CHECK(c.r(3).stats().new_views_installed == 1);
  CHECK(c.await(client, req.request_id).value == 1);
}

TEST_CASE("view change messages and new-view messages with bad signatures are rejected", "[replica][view_change]") {
  LogQuiet quiet;
  CounterCluster c(small_options());
  ViewChange vc;
  vc.new_view = 1;
  vc.replica = 2;
  vc.stable_seq = 0;
  vc.checkpoints.push_back(CheckpointClaim{0, Digest{}});
  c.r(1).on_message(2, vc);  // unsigned
  CHECK(c.r(1).stats().rejected_bad_signature == 1);
  CHECK(c.r(1).take_effects().empty());
  NewView nv;
  nv.view = 1;
  c.r(2).on_message(1, nv);
  CHECK(c.r(2).stats().rejected_bad_signature == 1);
  CHECK(c.r(2).view() == 0);
  // A view change whose signer is not the sender is invalid.
  c.r(1).on_message(3, vc);
  CHECK(c.r(1).stats().rejected_invalid == 1);
}
