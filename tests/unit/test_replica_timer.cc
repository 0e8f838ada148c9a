// The backups' view-change timer under load (TOCS §4.5.2; protocol/replica_view_change.cc): slow but steady
// commits are not taken for a faulty primary, and a primary that orders nothing is still suspected. On a
// scripted cluster of four replicas over the counter service (tests/unit/test_cluster_util.h), with every
// COMMIT held back for a while to make batches slow.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "protocol/replica.h"
#include "test_cluster_util.h"

using namespace bftfs;
using namespace bftfs::testing;

namespace {

// Holds every COMMIT while `holding` (they are lost to the network and kept here), and delivers them later.
struct CommitHold {
  explicit CommitHold(CounterCluster& cluster) : c(cluster) {
    c.drop = [this](const Envelope& e) {
      if (!holding || !is<Commit>(e)) return false;
      held.push_back(e);
      return true;
    };
  }
  void release() {
    holding = false;
    for (Envelope& e : held) c.inject(std::move(e));
    held.clear();
    c.run();
  }
  CounterCluster& c;
  bool holding = true;
  std::vector<Envelope> held;
};

std::uint64_t view_changes(CounterCluster& c) {
  std::uint64_t total = 0;
  for (NodeId i = 0; i < 4; ++i) total += c.replica_stats(i).view_changes_started;
  return total;
}

// One increment that every backup knows (it waits for it with its timer running), whose batch commits only
// `delay` ticks after it was ordered.
void slow_increment(CounterCluster& c, NodeId client, std::uint64_t delay) {
  CommitHold hold(c);
  const Request req = c.increment(client);
  c.send_all(req);
  c.run();
  c.tick(delay);
  hold.release();
  c.await(client, req.request_id);
  c.drop = nullptr;
}

}  // namespace

TEST_CASE("a backup does not suspect a primary whose batches commit slowly but steadily", "[replica][timer]") {
  LogQuiet quiet;
  ReplicaOptions o = small_options();  // view-change timeout 100 ticks
  CounterCluster c(o);
  const NodeId client = c.client_ids[0];
  // The machine gets slower batch after batch, up to batches that take 2.5 times the fixed timeout: the
  // timer follows what batches have been taking.
  for (std::uint64_t delay = 40; delay <= 250; delay += 10) {
    slow_increment(c, client, delay);
    INFO("commit delay " << delay);
    REQUIRE(view_changes(c) == 0);
  }
  for (NodeId i = 0; i < 4; ++i) CHECK(c.r(i).view() == 0);
  require_agreement(c, {0, 1, 2, 3});
  CHECK(quiet.new_errors() == 0);
}

TEST_CASE("a sudden stall longer than the timer and what batches took still starts a view change",
          "[replica][timer]") {
  LogQuiet quiet;
  CounterCluster c(small_options());
  const NodeId client = c.client_ids[0];
  for (int i = 0; i < 10; ++i) slow_increment(c, client, 5);  // batches commit within a few ticks
  // The allowance is a few ticks: a commit held 300 ticks is a stall, and the backups leave the view.
  CommitHold hold(c);
  const Request req = c.increment(client);
  c.send_all(req);
  c.run();
  REQUIRE(c.tick_until([&] { return view_changes(c) > 0; }, 300));
  hold.release();
  c.drop = nullptr;
  c.await(client, req.request_id);
  CHECK(quiet.new_errors() == 0);
}

TEST_CASE("a backup still suspects a primary that receives requests and orders nothing, after slow batches",
          "[replica][timer]") {
  LogQuiet quiet;
  ReplicaOptions o = small_options();
  o.latency_allowance_ticks_max = 300;
  CounterCluster c(o);
  const NodeId client = c.client_ids[0];
  for (std::uint64_t delay = 40; delay <= 400; delay += 20) slow_increment(c, client, delay);
  REQUIRE(view_changes(c) == 0);
  // The primary gets the next request (every replica does) and never orders it.
  c.crash(0);
  const Request req = c.increment(client);
  c.send_all(req);
  c.run();
  const std::uint64_t sent_at = c.now();
  REQUIRE(c.tick_until([&] { return view_changes(c) > 0; }, 2000));
  // Within the fixed timeout (with its jitter of at most 1/8) plus the capped latency allowance: the slow
  // batches lengthened the wait, but only that far.
  CHECK(c.now() - sent_at <= 100 + 100 / 8 + 300 + 2);
  CHECK(c.now() - sent_at > 100);
  c.await(client, req.request_id);
  for (NodeId i = 1; i < 4; ++i) CHECK(c.r(i).view() >= 1);
  require_agreement(c, {1, 2, 3});
  CHECK(quiet.new_errors() == 0);
}
