// The batching refinements of the PBFT replica core on a scripted cluster of four replicas over the counter service
// (tests/unit/test_cluster_util.h): piggybacked commits (Replica::Impl::defer_commit), the batch hold
// (ReplicaOptions::batch_hold) and the quiet primary (ReplicaOptions::quiet_primary).
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

// ---- piggybacked commits (Replica::Impl::defer_commit) ----

namespace {
ReplicaOptions piggyback_options() {
  ReplicaOptions o = small_options();
  o.piggyback_commits = true;
  o.checkpoint_interval = 16;  // no checkpoint boundary in these short runs (boundary commits are not deferred)
  o.log_window = 32;
  return o;
}
}  // namespace

TEST_CASE("piggybacked commits: a COMMIT waits for the next PREPARE and leaves just before it", "[replica]") {
  LogQuiet quiet;
  CounterCluster c(piggyback_options());
  const NodeId client = c.client_ids[0];
  CHECK(c.do_increment(client).value == 1);
  // The client accepted 2f+1 tentative replies, yet no replica sent a COMMIT: seq 1 is prepared, not committed.
  CHECK(c.count_delivered(is<Commit>) == 0);
  for (NodeId i = 0; i < 4; i++) {
    CHECK(c.r(i).last_executed() == 1);
    CHECK(c.r(i).last_committed() == 0);
    CHECK_FALSE(c.r(i).idle());  // so that the runtime keeps ticking for the flush
  }
  // The next request's PRE-PREPARE and PREPAREs carry them: every COMMIT for seq 1 precedes, from its sender,
  // that sender's vote for seq 2, and seq 1 commits without a tick.
  const Request req = c.increment(client);
  c.send(req, 0);
  c.run();
  CHECK(c.count_delivered(is<Commit>) == 4 * 3);
  for (NodeId i = 0; i < 4; i++) CHECK(c.r(i).last_committed() == 1);
  for (NodeId from = 0; from < 4; from++) {
    for (NodeId to = 0; to < 4; to++) {
      if (from == to) continue;
      std::size_t commit_at = SIZE_MAX, vote_at = SIZE_MAX;
      for (std::size_t k = 0; k < c.delivered().size(); k++) {
        const Envelope& e = c.delivered()[k];
        if (e.from != from || e.to != to) continue;
        if (const auto* cm = std::get_if<Commit>(&e.message); cm && cm->seq == 1) commit_at = std::min(commit_at, k);
        if (const auto* pp = std::get_if<PrePrepare>(&e.message); pp && pp->seq == 2) vote_at = std::min(vote_at, k);
        if (const auto* pr = std::get_if<Prepare>(&e.message); pr && pr->seq == 2) vote_at = std::min(vote_at, k);
      }
      CHECK(commit_at < vote_at);
    }
  }
  CHECK(c.await(client, req.request_id).value == 2);
  require_agreement(c, {0, 1, 2, 3});
  CHECK(quiet.new_errors() == 0);
}

TEST_CASE("piggybacked commits: a lone batch commits at the next tick", "[replica]") {
  LogQuiet quiet;
  CounterCluster c(piggyback_options());
  c.do_increment(c.client_ids[0]);
  for (NodeId i = 0; i < 4; i++) CHECK(c.r(i).last_committed() == 0);
  c.tick(1);
  for (NodeId i = 0; i < 4; i++) {
    CHECK(c.r(i).last_committed() == 1);
    CHECK(c.r(i).stats().batches_committed == 1);
    CHECK(c.r(i).idle());
  }
  CHECK(c.count_delivered(is<Commit>) == 4 * 3);
}

TEST_CASE("piggybacked commits: a read-only request sends them at once, and reads the committed state", "[replica]") {
  LogQuiet quiet;
  CounterCluster c(piggyback_options());
  const NodeId client = c.client_ids[0];
  c.do_increment(client);
  c.do_increment(client);
  CHECK(c.r(0).last_committed() == 1);  // seq 2's commits wait
  const Request ro = c.make_request(client, 100, counter_read_op(), /*read_only=*/true);
  c.send_all(ro);
  c.run();  // no tick
  const auto result = c.accepted(client, ro.request_id);
  REQUIRE(result);
  CounterResult res;
  REQUIRE(parse_counter_result(*result, res));
  CHECK(res.value == 2);
  for (NodeId i = 0; i < 4; i++) {
    CHECK(c.r(i).last_committed() == 2);
    CHECK(c.r(i).stats().read_only_executed == 1);
  }
}

TEST_CASE("piggybacked commits: a checkpoint seq's COMMIT is not deferred", "[replica]") {
  LogQuiet quiet;
  ReplicaOptions o = piggyback_options();
  o.checkpoint_interval = 2;
  o.log_window = 4;
  CounterCluster c(o);
  const NodeId client = c.client_ids[0];
  c.do_increment(client);
  c.do_increment(client);  // seq 2 is a checkpoint: it commits at once, and with it seq 1
  for (NodeId i = 0; i < 4; i++) {
    CHECK(c.r(i).last_committed() == 2);
    CHECK(c.r(i).stable_checkpoint() == 2);
  }
  // Execution past the boundary waits for that commit; it did not need a tick.
  CHECK(c.do_increment(client).value == 3);
  require_agreement(c, {0, 1, 2, 3});
}

// ---- batch hold (ReplicaOptions::batch_hold, Replica::Impl::hold_for_returning) ----

namespace {

ReplicaOptions hold_options() {
  ReplicaOptions o = small_options();
  o.batch_hold = true;
  o.batch_window = 1;
  return o;
}

// Client a (the first) is answered with nothing else of it queued; then client b's request reaches the primary,
// which holds it back for a. Returns b's request.
Request hold_b_for_a(CounterCluster& c) {
  c.do_increment(c.client_ids[0]);
  const Request b1 = c.increment(c.client_ids[1]);
  c.send(b1, 0);
  c.run();
  REQUIRE(c.r(0).batch_held());
  return b1;
}

// Every replica executed `seqs` batches holding `requests` requests in all.
void check_executed(CounterCluster& c, std::uint64_t seqs, std::uint64_t requests) {
  for (NodeId i = 0; i < 4; i++) {
    CHECK(c.r(i).last_executed() == seqs);
    CHECK(c.r(i).stats().requests_executed == requests);
  }
}

}  // namespace

TEST_CASE("batch hold: the next batch waits for the client just answered and takes its next request along", "[replica]") {
  LogQuiet quiet;
  CounterCluster c(hold_options(), 2);
  const NodeId a = c.client_ids[0];
  const NodeId b = c.client_ids[1];
  const Request b1 = hold_b_for_a(c);  // a was answered and has nothing queued: the primary expects it back
  check_executed(c, 1, 1);
  for (NodeId i = 1; i < 4; i++) CHECK_FALSE(c.r(i).batch_held());  // only a primary holds
  const Request a2 = c.increment(a);
  c.send(a2, 0);
  c.run();
  // a came back: one batch with both requests, sent without a tick.
  CHECK_FALSE(c.r(0).batch_held());
  check_executed(c, 2, 3);
  CHECK(c.accepted(b, b1.request_id).has_value());
  CHECK(c.accepted(a, a2.request_id).has_value());
  require_agreement(c, {0, 1, 2, 3});
}

TEST_CASE("batch hold: a client that does not come back costs one bounded wait", "[replica]") {
  LogQuiet quiet;
  CounterCluster c(hold_options(), 2);
  const NodeId b = c.client_ids[1];
  const Request b1 = hold_b_for_a(c);

  SECTION("the driver ends it") {
    c.end_batch_hold(0);  // Replica::end_batch_hold, then its effects are drained
    c.run();
  }
  SECTION("else the second tick ends it") {
    c.tick(1);
    CHECK(c.r(0).batch_held());
    check_executed(c, 1, 1);
    c.tick(1);
  }
  CHECK_FALSE(c.r(0).batch_held());
  check_executed(c, 2, 2);
  CHECK(c.accepted(b, b1.request_id).has_value());
  // b was answered now, a was given up on: b's next request waits for b alone, so it goes at once.
  c.tick_until([&] { return c.r(0).idle(); });
  const Request b2 = c.increment(b);
  c.send(b2, 0);
  c.run();
  CHECK_FALSE(c.r(0).batch_held());
  check_executed(c, 3, 3);
}

TEST_CASE("batch hold: a lone client, and a client with its next request already queued, never wait", "[replica]") {
  LogQuiet quiet;
  CounterCluster c(hold_options(), 1);
  const NodeId a = c.client_ids[0];
  for (std::uint64_t k = 1; k <= 3; k++) {
    const Request r = c.increment(a);
    c.send(r, 0);
    c.run();  // no tick: its own request ends any wait for it
    CHECK_FALSE(c.r(0).batch_held());
    check_executed(c, k, k);
    REQUIRE(c.accepted(a, r.request_id).has_value());
    c.await(a, r.request_id);  // accepted already: takes the next token without a tick
  }
}

TEST_CASE("batch hold: a view change forgets the clients waited for", "[replica]") {
  LogQuiet quiet;
  CounterCluster c(hold_options(), 2);
  const NodeId b = c.client_ids[1];
  const Request b1 = hold_b_for_a(c);
  // The primary goes silent; b retransmits to everyone, the backups time out and move to view 1.
  c.crash(0);
  c.send_all(b1);
  REQUIRE(c.tick_until([&] { return c.accepted(b, b1.request_id).has_value(); }, 5000));
  for (NodeId i = 1; i < 4; i++) {
    CHECK(c.r(i).view() >= 1);
    CHECK_FALSE(c.r(i).batch_held());
  }
  require_agreement(c, {1, 2, 3});
}

// ---- quiet primary (Replica::Impl::may_go_quiet) ----

namespace {
ReplicaOptions quiet_options() {
  ReplicaOptions o = small_options();
  o.quiet_primary = true;
  o.quiet_release_ticks = 12;
  o.checkpoint_interval = 16;  // no checkpoint seq in these short runs (a checkpoint seq never goes quiet)
  o.log_window = 32;
  return o;
}

std::size_t count_prepared_records(const std::vector<PersistRecord>& wal, std::uint64_t seq) {
  std::size_t count = 0;
  for (const PersistRecord& r : wal) {
    if (const auto* p = std::get_if<PreparedRecord>(&r); p != nullptr && p->seq == seq) count++;
  }
  return count;
}

bool commit_from(const Envelope& e, NodeId from, std::uint64_t seq) {
  const auto* c = std::get_if<Commit>(&e.message);
  return c != nullptr && e.from == from && c->seq == seq;
}

// Seq 1 completes with every replica; then replica 3 goes silent. The primary, going by seq 1, keeps seq 2
// quiet, and only two votes and two COMMITs come from the backups: the returned request is not accepted.
Request quiet_batch_with_a_silent_backup(CounterCluster& c, NodeId client) {
  c.do_increment(client);
  c.drop = [](const Envelope& e) { return e.from == 3 || e.to == 3; };
  const Request req = c.increment(client);
  c.send(req, 0);
  c.run();
  CHECK(c.r(0).stats().quiet_batches == 1);
  CHECK_FALSE(c.accepted(client, req.request_id));
  CHECK(c.r(0).last_committed() == 1);
  return req;
}
}  // namespace

TEST_CASE("quiet primary: a batch costs the primary no record, COMMIT or vote, and still commits everywhere",
          "[replica][quiet]") {
  LogQuiet quiet;
  CounterCluster c(quiet_options());
  const NodeId client = c.client_ids[0];
  // Seq 1: nothing tells the primary yet that all its backups answer (it prepares on the second PREPARE).
  CHECK(c.do_increment(client).value == 1);
  CHECK(c.r(0).stats().quiet_batches == 0);
  CHECK(count_prepared_records(c.records(0), 1) == 1);
  // Seq 2: all three backups prepared seq 1, so the primary stays quiet.
  c.delivered().clear();
  const Request req = c.increment(client);
  c.send(req, 0);
  c.run();  // no tick: the backups' votes and COMMITs make both certificates
  REQUIRE(c.accepted(client, req.request_id));
  CHECK(c.await(client, req.request_id).value == 2);
  CHECK(c.r(0).stats().quiet_batches == 1);
  CHECK(c.r(0).stats().quiet_releases == 0);
  CHECK(count_prepared_records(c.records(0), 2) == 0);
  for (NodeId i = 1; i < 4; i++) CHECK(count_prepared_records(c.records(i), 2) == 1);
  CHECK(c.count_delivered([](const Envelope& e) { return commit_from(e, 0, 2); }) == 0);
  for (NodeId i = 1; i < 4; i++) CHECK(c.count_delivered([&](const Envelope& e) { return commit_from(e, i, 2); }) == 3);
  // The primary's reply carries the result and is flagged as no vote; every backup's is a tentative vote.
  for (const auto& [from, rep] : c.inbox(client)) {
    if (rep.request_id != req.request_id) continue;
    if (from == 0) {
      CHECK((rep.flags & kReplySpeculative) != 0);
      CHECK((rep.flags & kReplyTentative) == 0);
      CHECK((rep.flags & kReplyHasResult) != 0);
    } else {
      CHECK((rep.flags & kReplyTentative) != 0);
    }
  }
  for (NodeId i = 0; i < 4; i++) CHECK(c.r(i).last_committed() == 2);
  require_agreement(c, {0, 1, 2, 3});
  CHECK(quiet.new_errors() == 0);
}

TEST_CASE("quiet primary: with a backup silent, the release timer makes the primary's promises, then it votes",
          "[replica][quiet]") {
  LogQuiet quiet;
  CounterCluster c(quiet_options());
  const NodeId client = c.client_ids[0];
  const Request req = quiet_batch_with_a_silent_backup(c, client);
  c.tick(c.opt.quiet_release_ticks - 1);
  CHECK_FALSE(c.accepted(client, req.request_id));
  CHECK(count_prepared_records(c.records(0), 2) == 0);
  c.tick(1);
  CHECK(c.r(0).stats().quiet_releases == 1);
  CHECK(count_prepared_records(c.records(0), 2) == 1);
  REQUIRE(c.accepted(client, req.request_id));
  CHECK(c.await(client, req.request_id).value == 2);
  for (NodeId i = 0; i < 3; i++) CHECK(c.r(i).last_committed() == 2);
  // Nothing goes quiet for a while: the next request completes without waiting for a timer.
  const Request next = c.increment(client);
  c.send(next, 0);
  c.run();
  REQUIRE(c.accepted(client, next.request_id));
  CHECK(c.r(0).stats().quiet_batches == 1);
  CHECK(count_prepared_records(c.records(0), 3) == 1);
  require_agreement(c, {0, 1, 2});
  CHECK(quiet.new_errors() == 0);
}

TEST_CASE("quiet primary: a client asking again gets the primary's vote at once", "[replica][quiet]") {
  LogQuiet quiet;
  CounterCluster c(quiet_options());
  const NodeId client = c.client_ids[0];
  const Request req = quiet_batch_with_a_silent_backup(c, client);
  c.send_all(req);  // the client's retransmission
  c.run();          // no tick
  REQUIRE(c.accepted(client, req.request_id));
  CHECK(c.r(0).stats().quiet_releases == 1);
  CHECK(count_prepared_records(c.records(0), 2) == 1);
  CHECK(c.await(client, req.request_id).value == 2);
  CHECK(quiet.new_errors() == 0);
}

TEST_CASE("quiet primary: its VIEW-CHANGE claims a quiet batch only after the batch's record", "[replica][quiet]") {
  LogQuiet quiet;
  CounterCluster c(quiet_options());
  const NodeId client = c.client_ids[0];
  c.do_increment(client);
  c.do_increment(client);
  REQUIRE(c.r(0).stats().quiet_batches == 1);
  REQUIRE(count_prepared_records(c.records(0), 2) == 0);
  // Replicas 1 and 2 time out on a request the primary never sees; the primary joins their view change.
  c.drop = [](const Envelope& e) { return e.from == 0 && !is<ViewChange>(e) && !is<Status>(e); };
  const Request req = c.increment(client);
  c.send(req, 1);
  c.send(req, 2);
  REQUIRE(c.tick_until([&] { return c.r(0).view() == 1; }));
  std::size_t prepared_at = SIZE_MAX, view_at = SIZE_MAX;
  for (std::size_t k = 0; k < c.records(0).size(); k++) {
    if (const auto* p = std::get_if<PreparedRecord>(&c.records(0)[k]); p && p->seq == 2 && p->view == 0) prepared_at = k;
    if (const auto* v = std::get_if<ViewRecord>(&c.records(0)[k]); v && v->view == 1) view_at = std::min(view_at, k);
  }
  REQUIRE(prepared_at != SIZE_MAX);
  CHECK(prepared_at < view_at);
  bool claimed = false;
  for (const Envelope& e : c.delivered()) {
    const auto* vc = std::get_if<ViewChange>(&e.message);
    if (vc == nullptr || e.from != 0) continue;
    for (const PreparedClaim& p : vc->prepared) claimed = claimed || (p.seq == 2 && p.view == 0);
  }
  CHECK(claimed);
  c.drop = nullptr;
  REQUIRE(c.tick_until([&] { return c.r(0).last_committed() == 3 && !c.r(0).in_view_change(); }));
  require_agreement(c, {0, 1, 2, 3});
  CHECK(quiet.new_errors() == 0);
}
