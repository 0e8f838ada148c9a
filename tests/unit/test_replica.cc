// The PBFT replica core's normal case (TOCS §2.3-2.4, §5.1) on a scripted cluster of four replicas (f = 1)
// over the counter service (tests/unit/test_cluster_util.h): ordering and replies, the checks on incoming
// pre-prepares and prepares, checkpoints, the reply cache, read-only requests, batching, the effects filter,
// the per-client order of pipelined requests, and STATUS. View changes, recovery and state transfer, and the
// batching refinements (piggybacked commits, batch hold, quiet primary) have files of their own
// (test_replica_*.cc). The randomized whole-cluster runs are the simulator's (sim/).
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

TEST_CASE("four replicas commit a request and the client gets f+1 matching replies", "[replica]") {
  LogQuiet quiet;
  ReplicaOptions o = small_options();
  o.tentative_execution = false;
  CounterCluster c(o);
  const NodeId client = c.client_ids[0];
  const Request req = c.increment(client);
  c.send(req, 0);
  c.run();
  const auto result = c.accepted(client, req.request_id);
  REQUIRE(result);
  CounterResult res;
  REQUIRE(parse_counter_result(*result, res));
  CHECK(res.status == 0);
  CHECK(res.value == 1);
  for (NodeId i = 0; i < 4; i++) {
    CHECK(c.r(i).last_committed() == 1);
    CHECK(c.r(i).last_executed() == 1);
    CHECK(c.service(i).value() == 1);
    CHECK(c.r(i).stats().requests_executed == 1);
    CHECK(c.r(i).stats().batches_committed == 1);
  }
  // Without tentative execution every reply is final.
  for (const auto& [from, rep] : c.inbox(client)) CHECK((rep.flags & kReplyTentative) == 0);
  CHECK(c.inbox(client).size() == 4);
  require_agreement(c, {0, 1, 2, 3});
  CHECK(quiet.new_errors() == 0);
}

TEST_CASE("with tentative execution the client gets 2f+1 tentative replies and the batch still commits", "[replica]") {
  LogQuiet quiet;
  CounterCluster c(small_options());
  const NodeId client = c.client_ids[0];
  for (int k = 0; k < 3; k++) {
    const CounterResult res = c.do_increment(client);
    CHECK(res.value == static_cast<std::uint64_t>(k + 1));
  }
  std::size_t tentative = 0;
  for (const auto& [from, rep] : c.inbox(client)) tentative += (rep.flags & kReplyTentative) != 0 ? 1 : 0;
  CHECK(tentative >= 3);
  for (NodeId i = 0; i < 4; i++) {
    CHECK(c.r(i).last_committed() == 3);
    CHECK(c.service(i).value() == 3);
  }
  CHECK(quiet.new_errors() == 0);
}

TEST_CASE("a pre-prepare with a forged authenticator entry is rejected", "[replica]") {
  LogQuiet quiet;
  CounterCluster c(small_options());
  Request req = c.increment(c.client_ids[0]);
  req.authenticator[1].bytes[0] ^= 0xFF;  // the entry for replica 1 no longer verifies
  PrePrepare pp;
  pp.view = 0;
  pp.seq = 1;
  pp.batch.timestamp_ns = 5;
  pp.batch.requests.push_back(req);
  c.r(1).on_message(0, pp);
  const Effects e = c.r(1).take_effects();
  CHECK(e.sends.empty());
  CHECK(e.persist.empty());
  CHECK(c.r(1).stats().rejected_bad_authenticator == 1);
  // Replica 2's entry is intact: it accepts the same pre-prepare and prepares.
  c.r(2).on_message(0, pp);
  const Effects e2 = c.r(2).take_effects();
  REQUIRE(e2.sends.size() == 1);
  CHECK(std::holds_alternative<Prepare>(e2.sends[0].message));
  REQUIRE(e2.persist.size() == 1);
  CHECK(std::holds_alternative<PrePrepareRecord>(e2.persist[0]));
}

TEST_CASE("a pre-prepare from a replica that is not the primary is rejected", "[replica]") {
  LogQuiet quiet;
  CounterCluster c(small_options());
  PrePrepare pp;
  pp.view = 0;
  pp.seq = 1;
  pp.batch.timestamp_ns = 5;
  pp.batch.requests.push_back(c.increment(c.client_ids[0]));
  c.r(1).on_message(2, pp);
  CHECK(c.r(1).take_effects().empty());
  CHECK(c.r(1).stats().rejected_invalid == 1);
}

TEST_CASE("an equivocating second pre-prepare for the same seq is rejected", "[replica]") {
  LogQuiet quiet;
  CounterCluster c(small_options());
  PrePrepare a;
  a.view = 0;
  a.seq = 1;
  a.batch.timestamp_ns = 5;
  a.batch.requests.push_back(c.increment(c.client_ids[0]));
  PrePrepare b = a;
  b.batch.requests[0] = c.increment(c.client_ids[1]);
  c.r(1).on_message(0, a);
  const Effects ea = c.r(1).take_effects();
  REQUIRE(ea.sends.size() == 1);
  const Prepare prepare = std::get<Prepare>(ea.sends[0].message);
  CHECK(prepare.digest == a.batch.digest());
  c.r(1).on_message(0, b);
  CHECK(c.r(1).take_effects().empty());
  CHECK(c.r(1).stats().rejected_conflict == 1);
  // A plain retransmission of the first is neither a conflict nor a second prepare.
  c.r(1).on_message(0, a);
  CHECK(c.r(1).take_effects().empty());
  CHECK(c.r(1).stats().rejected_conflict == 1);
}

TEST_CASE("a pre-prepare above the high watermark is dropped", "[replica]") {
  LogQuiet quiet;
  CounterCluster c(small_options());
  PrePrepare pp;
  pp.view = 0;
  pp.seq = 9;  // h = 0, L = 8
  pp.batch.timestamp_ns = 5;
  pp.batch.requests.push_back(c.increment(c.client_ids[0]));
  c.r(1).on_message(0, pp);
  CHECK(c.r(1).take_effects().empty());
  CHECK(c.r(1).stats().rejected_out_of_window == 1);
}

TEST_CASE("prepares from distinct backups are counted once each and the primary's prepare is invalid", "[replica]") {
  LogQuiet quiet;
  CounterCluster c(small_options());
  PrePrepare pp;
  pp.view = 0;
  pp.seq = 1;
  pp.batch.timestamp_ns = 5;
  pp.batch.requests.push_back(c.increment(c.client_ids[0]));
  const Digest d = pp.batch.digest();
  c.r(1).on_message(0, pp);
  (void)c.r(1).take_effects();
  c.r(1).on_message(0, Prepare{0, 1, d});  // the primary never prepares
  CHECK(c.r(1).stats().rejected_invalid == 1);
  c.r(1).on_message(2, Prepare{0, 1, d});
  Effects e = c.r(1).take_effects();
  // Own prepare + replica 2's = 2f: prepared, so a PreparedRecord and a COMMIT (durable before sent).
  REQUIRE(e.persist.size() == 1);
  CHECK(std::holds_alternative<PreparedRecord>(e.persist[0]));
  REQUIRE(e.sends.size() >= 1);
  CHECK(std::holds_alternative<Commit>(e.sends[0].message));
  c.r(1).on_message(3, Prepare{0, 1, Digest{}});  // a different digest from a third backup: just a vote
  c.r(1).on_message(3, Prepare{0, 1, d});         // and then a second vote by the same backup: equivocation
  CHECK(c.r(1).stats().rejected_conflict == 1);
}

TEST_CASE("checkpoint becomes stable after 2f+1 matching messages and the log is truncated", "[replica]") {
  LogQuiet quiet;
  CounterCluster c(small_options());
  // Replica 3 hears nothing: the other three are exactly 2f+1.
  c.drop = [](const Envelope& e) { return e.to == 3 || e.from == 3; };
  const NodeId client = c.client_ids[0];
  for (int k = 0; k < 5; k++) c.do_increment(client);
  for (NodeId i = 0; i < 3; i++) {
    CHECK(c.r(i).last_committed() == 5);
    CHECK(c.r(i).stable_checkpoint() == 4);
  }
  CHECK(c.r(3).stable_checkpoint() == 0);
  // Seq 1 was garbage collected: nobody answers a FETCH-BATCH for it any more, while seq 5 is still served.
  const ExecutedBatch first = c.r(0).committed_history()[0];
  const ExecutedBatch fifth = c.r(0).committed_history()[4];
  c.drop = nullptr;
  c.r(0).on_message(1, FetchBatch{first.seq, first.digest});
  CHECK(c.r(0).take_effects().sends.empty());
  c.r(0).on_message(1, FetchBatch{fifth.seq, fifth.digest});
  const Effects e = c.r(0).take_effects();
  REQUIRE(e.sends.size() == 1);
  CHECK(std::get<BatchData>(e.sends[0].message).batch.digest() == fifth.digest);
  // The checkpoint record and the stable record are in the log of every participant.
  for (NodeId i = 0; i < 3; i++) {
    bool checkpoint = false, stable = false;
    for (const auto& rec : c.records(i)) {
      if (auto* cr = std::get_if<CheckpointRecord>(&rec)) checkpoint |= cr->seq == 4;
      if (auto* sr = std::get_if<StableRecord>(&rec)) stable |= sr->seq == 4;
    }
    CHECK(checkpoint);
    CHECK(stable);
  }
  CHECK(quiet.new_errors() == 0);
}

TEST_CASE("duplicate request gets the cached reply without executing again", "[replica]") {
  LogQuiet quiet;
  CounterCluster c(small_options());
  const NodeId client = c.client_ids[0];
  const Request req = c.increment(client);
  c.send(req, 0);
  const CounterResult first = c.await(client, req.request_id);
  c.tick(1);
  c.inbox(client).clear();
  c.send_all(req);
  c.run();
  REQUIRE(c.inbox(client).size() == 4);
  for (const auto& [from, rep] : c.inbox(client)) {
    CHECK((rep.flags & kReplyHasResult) != 0);
    CHECK(rep.request_id == req.request_id);
  }
  const auto again = c.accepted(client, req.request_id);
  REQUIRE(again);
  CounterResult res;
  REQUIRE(parse_counter_result(*again, res));
  CHECK(res.value == first.value);
  for (NodeId i = 0; i < 4; i++) {
    CHECK(c.r(i).stats().requests_executed == 1);
    CHECK(c.service(i).value() == 1);
  }
}

TEST_CASE("a request id below the client's window is stale and dropped", "[replica]") {
  LogQuiet quiet;
  ReplicaOptions o = small_options();
  o.client_window = 2;
  CounterCluster c(o);
  const NodeId client = c.client_ids[0];
  const Request old = c.increment(client);
  c.send(old, 0);
  c.await(client, old.request_id);
  c.do_increment(client);
  c.do_increment(client);  // window is now (1, 3]
  c.inbox(client).clear();
  c.send(old, 1);
  c.run();
  CHECK(c.inbox(client).empty());
  CHECK(c.r(1).stats().rejected_out_of_window == 1);
}

TEST_CASE("read-only request executes without ordering", "[replica]") {
  LogQuiet quiet;
  CounterCluster c(small_options());
  const NodeId client = c.client_ids[0];
  c.do_increment(client);
  c.do_increment(client);
  c.tick(1);
  const std::size_t pre_prepares = c.count_delivered(is<PrePrepare>);
  const Request ro = c.make_request(client, 100, counter_read_op(), /*read_only=*/true, /*replier=*/2);
  c.send_all(ro);
  c.run();
  CHECK(c.count_delivered(is<PrePrepare>) == pre_prepares);
  std::size_t with_result = 0;
  std::size_t replies = 0;
  for (const auto& [from, rep] : c.inbox(client)) {
    if (rep.request_id != ro.request_id) continue;
    replies++;
    CHECK((rep.flags & kReplyReadOnly) != 0);
    with_result += (rep.flags & kReplyHasResult) != 0 ? 1 : 0;
  }
  CHECK(replies == 4);
  CHECK(with_result == 1);  // only the designated replier sends the full result (TOCS §5.1.1)
  const auto result = c.accepted(client, ro.request_id);
  REQUIRE(result);
  CounterResult res;
  REQUIRE(parse_counter_result(*result, res));
  CHECK(res.value == 2);
  for (NodeId i = 0; i < 4; i++) {
    CHECK(c.r(i).stats().read_only_executed == 1);
    CHECK(c.r(i).last_executed() == 2);
  }
}

TEST_CASE("read-only request waits while tentative state exists", "[replica]") {
  LogQuiet quiet;
  CounterCluster c(small_options());
  const NodeId client = c.client_ids[0];
  // Commits are lost: every replica prepares and executes tentatively, nothing commits.
  c.drop = [](const Envelope& e) { return is<Commit>(e); };
  c.send(c.increment(client), 0);
  c.run();
  REQUIRE(c.r(1).last_executed() == 1);
  REQUIRE(c.r(1).last_committed() == 0);
  const Request ro = c.make_request(client, 100, counter_read_op(), true);
  c.send(ro, 1);
  c.run();
  CHECK(c.r(1).stats().read_only_executed == 0);
  // Commits get through (retransmitted after STATUS): the read runs then.
  c.drop = nullptr;
  REQUIRE(c.tick_until([&] { return c.r(1).stats().read_only_executed == 1; }, 500));
  CHECK(c.r(1).last_committed() == 1);
}

TEST_CASE("the primary batches requests that arrive while a batch is in flight", "[replica]") {
  LogQuiet quiet;
  ReplicaOptions o = small_options();
  o.batch_window = 1;
  CounterCluster c(o, 5);
  for (NodeId client : c.client_ids) c.send(c.increment(client), 0);
  c.run();
  // The first request went out alone at once; the other four waited for it to commit and left together.
  for (NodeId i = 0; i < 4; i++) {
    CHECK(c.r(i).last_committed() == 2);
    CHECK(c.r(i).stats().requests_executed == 5);
  }
  for (NodeId client : c.client_ids) CHECK(c.accepted(client, 1).has_value());

  SECTION("batch_window 0 orders one request per pre-prepare") {
    ReplicaOptions o0 = small_options();
    o0.batch_window = 0;
    CounterCluster c0(o0, 5);
    for (NodeId client : c0.client_ids) c0.send(c0.increment(client), 0);
    c0.run();
    for (NodeId i = 0; i < 4; i++) CHECK(c0.r(i).last_committed() == 5);
  }
}

TEST_CASE("the effects filter sees every outgoing effect and can drop it", "[replica]") {
  LogQuiet quiet;
  CounterCluster c(small_options());
  std::size_t seen = 0;
  c.r(0).set_effects_filter([&](Effects& e) {
    seen += e.sends.size();
    std::erase_if(e.sends, [](const Send& s) { return std::holds_alternative<PrePrepare>(s.message); });
  });
  const NodeId client = c.client_ids[0];
  c.send(c.increment(client), 0);
  c.run();
  CHECK(seen >= 1);
  CHECK(c.count_delivered(is<PrePrepare>) == 0);
  for (NodeId i = 1; i < 4; i++) CHECK(c.r(i).last_executed() == 0);
}

// ---- per-client order of pipelined requests (TOCS §5.1.4; ClientTable::predecessor_done) ----

namespace {

// A request of `client` with id `id` that names `prev` as the ordered request issued before it.
Request after(CounterCluster& c, NodeId client, std::uint64_t id, std::uint64_t prev, Bytes op, bool read_only = false) {
  Request r = c.make_request(client, id, std::move(op), read_only);
  r.prev_request_id = prev;
  const Digest d = r.digest();
  r.authenticator.clear();
  for (NodeId i = 0; i < c.n(); i++) r.authenticator.push_back(c.crypto(client).mac(i, d.bytes));
  return r;
}

CounterResult counter_of(const std::optional<Bytes>& result) {
  REQUIRE(result.has_value());
  CounterResult res;
  REQUIRE(parse_counter_result(*result, res));
  return res;
}

}  // namespace

TEST_CASE("a request waits for the one its client issued before it, and its wait starts no view change",
          "[replica][order]") {
  LogQuiet quiet;
  CounterCluster c(small_options());
  const NodeId client = c.client_ids[0];
  const std::uint64_t token = c.token[client];
  // Both increments present the same token: whichever runs first succeeds, the other gets "bad token".
  const Request first = after(c, client, 1, 0, counter_increment_op(token));
  const Request second = after(c, client, 2, 1, counter_increment_op(token));
  c.send_all(second);  // the first one is late (lost, or still on its way)
  c.run();
  c.tick(3 * c.opt.view_change_timeout_ticks);
  for (NodeId i = 0; i < 4; i++) {
    CHECK(c.r(i).stats().requests_executed == 0);
    CHECK(c.r(i).stats().view_changes_started == 0);  // nothing the primary could order: not its fault
  }
  c.send(first, 0);
  c.run();
  CHECK(counter_of(c.accepted(client, 1)).status == 0);
  REQUIRE(c.tick_until([&] { return c.accepted(client, 2).has_value(); }, 2000));
  CHECK(counter_of(c.accepted(client, 2)).status == 1);  // ran second: its token was used up
  for (NodeId i = 0; i < 4; i++) {
    CHECK(c.r(i).stats().requests_executed == 2);
    CHECK(c.r(i).view() == 0);
  }
}

TEST_CASE("a batch that orders a request before its predecessor: every replica skips it alike, then runs it in order",
          "[replica][order]") {
  LogQuiet quiet;
  CounterCluster c(small_options());
  const NodeId client = c.client_ids[0];
  const std::uint64_t token = c.token[client];
  const Request first = after(c, client, 1, 0, counter_increment_op(token));
  const Request second = after(c, client, 2, 1, counter_increment_op(token));
  // A faulty primary pre-prepares the client's requests in the wrong order, the same batch to every backup, and
  // then falls silent (replica 0 stands for it: its own core never proposed this, so it is taken down).
  c.crash(0);
  PrePrepare pp;
  pp.view = 0;
  pp.seq = 1;
  pp.batch.timestamp_ns = 2'000'000;
  pp.batch.requests = {second, first};
  for (NodeId j = 1; j < 4; j++) c.inject(Envelope{0, j, pp});
  c.run();
  for (NodeId j = 1; j < 4; j++) {
    CHECK(c.r(j).last_committed() == 1);
    CHECK(c.r(j).stats().requests_executed == 1);
    CHECK(c.r(j).stats().requests_deferred_order == 1);
  }
  CHECK(counter_of(c.accepted(client, 1)).status == 0);
  CHECK_FALSE(c.accepted(client, 2).has_value());  // skipped without a record: nothing was answered
  // The skipped request waits at the backups, ready now; the primary never orders it (it sent none of this),
  // so they change views and the next primary orders it.
  REQUIRE(c.tick_until([&] { return c.accepted(client, 2).has_value(); }, 5000));
  CHECK(counter_of(c.accepted(client, 2)).status == 1);  // after the first: its token was used up
  for (NodeId j = 1; j < 4; j++) CHECK(c.r(j).view() >= 1);
  require_agreement(c, {1, 2, 3});
}

TEST_CASE("a read-only request is answered only after its client's previous ordered request executed",
          "[replica][order]") {
  LogQuiet quiet;
  CounterCluster c(small_options());
  const NodeId client = c.client_ids[0];
  const Request write = after(c, client, 1, 0, counter_increment_op(c.token[client]));
  const Request read = after(c, client, 2, 1, counter_read_op(), /*read_only=*/true);
  c.send_all(read);  // overtakes the write
  c.run();
  for (NodeId i = 0; i < 4; i++) CHECK(c.r(i).stats().read_only_executed == 0);
  c.send(write, 0);
  c.run();
  REQUIRE(c.tick_until([&] { return c.accepted(client, 2).has_value(); }, 500));
  CHECK(counter_of(c.accepted(client, 2)).value == 1);  // the read sees the write issued before it
}

// ---- STATUS only when it helps, and Replica::idle (the runtime's tick pacing) ----

TEST_CASE("an idle replica sends STATUS only as a heartbeat, every 10th status interval", "[replica][status]") {
  LogQuiet quiet;
  CounterCluster c(small_options());
  c.do_increment(c.client_ids[0]);
  c.tick(c.opt.status_interval_ticks * 2);  // settle: every replica has heard every other's position
  for (NodeId i = 0; i < c.n(); i++) CHECK(c.r(i).idle());
  c.delivered().clear();
  c.tick(c.opt.status_interval_ticks * 20);
  // 20 intervals, a heartbeat every 10: two STATUS per replica to each of its 3 peers, no more.
  for (NodeId i = 0; i < c.n(); i++) {
    CHECK(c.count_delivered([&](const Envelope& e) { return e.from == i && is<Status>(e); }) == 2 * (c.n() - 1));
  }
  CHECK(quiet.new_errors() == 0);
}

TEST_CASE("a replica waiting for a request without progress sends STATUS every interval", "[replica][status]") {
  LogQuiet quiet;
  CounterCluster c(small_options());
  c.do_increment(c.client_ids[0]);
  c.tick(c.opt.status_interval_ticks * 2);
  // Replica 3 hears of a request the primary never gets: it waits (and its view-change timer runs).
  c.drop = [](const Envelope& e) { return e.to == 0 && is<Request>(e); };
  const Request req = c.increment(c.client_ids[0]);
  c.send(req, 3);
  c.run();
  CHECK_FALSE(c.r(3).idle());
  c.delivered().clear();
  c.tick(c.opt.status_interval_ticks * 3);
  CHECK(c.count_delivered([](const Envelope& e) { return e.from == 3 && is<Status>(e); }) >= 2 * (c.n() - 1));
  CHECK(quiet.new_errors() == 0);
}

TEST_CASE("a replica that missed batches learns it from the answer to its STATUS and catches up",
          "[replica][status]") {
  LogQuiet quiet;
  CounterCluster c(small_options());
  // Replica 3 misses everything about the second increment but STATUS frames.
  c.do_increment(c.client_ids[0]);
  c.drop = [](const Envelope& e) { return e.to == 3 && !is<Status>(e); };
  c.do_increment(c.client_ids[0]);
  c.drop = nullptr;
  CHECK(c.r(3).last_committed() + 1 == c.r(0).last_committed());
  // Its heartbeat reaches the others, who answer with their position; then it asks until it has caught up.
  REQUIRE(c.tick_until([&] { return c.r(3).last_committed() == c.r(0).last_committed(); },
                       c.opt.status_interval_ticks * 30));
  CHECK(c.r(3).last_executed() == c.r(0).last_executed());
  require_agreement(c, {0, 1, 2, 3});
  CHECK(quiet.new_errors() == 0);
}
