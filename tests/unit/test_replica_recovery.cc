// Recovery and catch-up of the PBFT replica core on a scripted cluster of four replicas over the counter service
// (tests/unit/test_cluster_util.h): restarts from the durable records (TOCS §5.3 with the records of
// protocol/effects.h), state transfer after the log was garbage collected (§5.3.2), catch-up from peers' logs.
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

TEST_CASE("a replica restarted from its records re-executes committed batches and reaches the same counter value",
          "[replica][recovery]") {
  LogQuiet quiet;
  CounterCluster c(small_options());
  const NodeId client = c.client_ids[0];
  for (int k = 0; k < 6; k++) c.do_increment(client);
  c.tick(1);
  REQUIRE(c.r(2).last_committed() == 6);
  REQUIRE(c.service(2).value() == 6);
  c.crash(2);
  c.restart(2);
  // The service came back at its checkpoint (4) and the replica replayed 5 and 6 from its log.
  CHECK(c.r(2).last_committed() == 6);
  CHECK(c.r(2).last_executed() == 6);
  CHECK(c.service(2).value() == 6);
  CHECK(c.r(2).stable_checkpoint() == 4);
  c.run();
  // It keeps working with the others.
  for (int k = 0; k < 3; k++) c.do_increment(client);
  REQUIRE(c.tick_until([&] { return c.r(2).last_committed() == 9; }, 500));
  CHECK(c.service(2).value() == 9);
  require_agreement(c, {0, 1, 2, 3});
  CHECK(quiet.new_errors() == 0);
}

TEST_CASE("a restarted primary never pre-prepares again in the view it recovered in", "[replica][recovery]") {
  // Pre-prepare records are not synced before the PRE-PREPARE goes out (effects.h), so a restarted primary
  // may have forgotten seqs it assigned: it must leave the view instead of assigning more.
  LogQuiet quiet;
  ReplicaOptions o = small_options();
  o.batch_window = 0;  // no batching: the second request would go out although the first never commits
  CounterCluster c(o);
  c.drop = [](const Envelope& e) { return is<Prepare>(e); };  // nothing prepares
  const NodeId client = c.client_ids[0];
  c.send(c.increment(client), 0);
  c.run();
  c.crash(0);
  c.restart(0);
  CHECK(c.r(0).view() == 1);
  CHECK(c.r(0).in_view_change());
  c.run();
  c.send(c.make_request(c.client_ids[1], 1, counter_increment_op(counter_initial_token(c.client_ids[1]))), 0);
  c.run();
  std::size_t view0_pre_prepares = 0;
  for (const auto& e : c.delivered()) {
    if (const auto* pp = std::get_if<PrePrepare>(&e.message); pp != nullptr && e.to == 1 && pp->view == 0) {
      view0_pre_prepares++;
      CHECK(pp->seq == 1);
    }
  }
  CHECK(view0_pre_prepares == 1);
}

TEST_CASE("a restarted backup sends no prepare in the view it recovered in but still commits", "[replica][recovery]") {
  LogQuiet quiet;
  ReplicaOptions o = small_options();
  CounterCluster c(o);
  const NodeId client = c.client_ids[0];
  c.do_increment(client);
  c.crash(3);
  c.restart(3);
  CHECK(c.r(3).view() == 0);
  CHECK(!c.r(3).in_view_change());
  const std::size_t before = c.delivered().size();
  for (int k = 0; k < 2; k++) c.do_increment(client);
  REQUIRE(c.tick_until([&] { return c.r(3).last_committed() >= 3; }, 500));
  for (std::size_t i = before; i < c.delivered().size(); i++) {
    const auto& e = c.delivered()[i];
    if (const auto* p = std::get_if<Prepare>(&e.message); p != nullptr) CHECK(e.from != 3);
  }
  CHECK(c.service(3).value() == 3);
  require_agreement(c, {0, 1, 2, 3});
}

TEST_CASE("a restarted replica still counts the commit it sent before the crash", "[replica][recovery]") {
  LogQuiet quiet;
  CounterCluster c(small_options());
  // Replica 3 prepares and commits-votes seq 1 but hears no commit; then it restarts and only replicas 0 and 1
  // retransmit theirs: with its own (durable) vote that is 2f+1.
  c.drop = [](const Envelope& e) { return is<Commit>(e) && e.to == 3; };
  const NodeId client = c.client_ids[0];
  c.do_increment(client);
  REQUIRE(c.r(3).last_committed() == 0);
  c.crash(3);
  c.restart(3);
  c.drop = [](const Envelope& e) { return is<Commit>(e) && e.from == 2 && e.to == 3; };
  REQUIRE(c.tick_until([&] { return c.r(3).last_committed() == 1; }, 90));  // before any view-change timer
  CHECK(c.service(3).value() == 1);
  CHECK(c.r(3).view() == 0);
}

TEST_CASE("a lagging replica catches up by state transfer after the log was garbage collected", "[replica][state_transfer]") {
  LogQuiet quiet;
  CounterCluster c(small_options());
  c.drop = [](const Envelope& e) { return e.to == 3 || e.from == 3; };
  const NodeId client = c.client_ids[0];
  const NodeId other = c.client_ids[1];
  for (int k = 0; k < 10; k++) {
    c.do_increment(client);
    c.do_increment(other);
  }
  REQUIRE(c.r(0).last_committed() == 20);
  REQUIRE(c.r(0).stable_checkpoint() >= 16);
  REQUIRE(c.r(3).last_executed() == 0);
  c.drop = nullptr;
  REQUIRE(c.tick_until([&] { return c.r(3).last_committed() == 20; }, 2000));
  CHECK(c.r(3).stats().state_transfers >= 1);
  CHECK(c.r(3).stats().state_transfer_bytes > 0);
  CHECK(c.service(3).value() == 20);
  CHECK(c.r(3).stable_checkpoint() >= 16);
  // Its client table came along: a retransmission of the client's last request gets the cached reply.
  c.inbox(client).clear();
  c.send(c.sent.at({client, c.next_id[client]}), 3);
  c.run();
  REQUIRE(c.inbox(client).size() == 1);
  CHECK((c.inbox(client)[0].second.flags & kReplyHasResult) != 0);
  // And it takes part in ordering again: with replica 0 silent, progress needs replica 3.
  c.drop = [](const Envelope& e) { return e.from == 2 || e.to == 2; };
  CHECK(c.do_increment(client).value == 21);
  REQUIRE(c.tick_until([&] { return c.r(3).last_committed() == 21; }, 500));
  CHECK(quiet.new_errors() == 0);
}

TEST_CASE("a replica whose tentative executions never commit catches up by state transfer", "[replica][state_transfer]") {
  LogQuiet quiet;
  CounterCluster c(small_options());
  // Replica 3 prepares and executes tentatively but never sees a commit; the others commit, make checkpoints
  // stable and discard the log it would need.
  c.drop = [](const Envelope& e) { return is<Commit>(e) && e.to == 3; };
  const NodeId client = c.client_ids[0];
  for (int k = 0; k < 8; k++) c.do_increment(client);
  REQUIRE(c.r(0).stable_checkpoint() == 8);
  REQUIRE(c.r(3).last_committed() == 0);
  REQUIRE(c.r(3).last_executed() == 4);  // tentative execution stops at the uncommitted checkpoint seq
  c.drop = nullptr;
  REQUIRE(c.tick_until([&] { return c.r(3).last_committed() == 8; }, 1000));
  CHECK(c.r(3).stats().state_transfers == 1);
  CHECK(c.r(3).stats().rollbacks == 1);  // the tentative state is dropped before the install
  CHECK(c.service(3).value() == 8);
  CHECK(quiet.new_errors() == 0);
}

TEST_CASE("a lagging replica within the window catches up from its peers' logs", "[replica]") {
  LogQuiet quiet;
  CounterCluster c(small_options());
  c.drop = [](const Envelope& e) { return e.to == 3; };
  const NodeId client = c.client_ids[0];
  c.do_increment(client);
  c.do_increment(client);
  REQUIRE(c.r(3).last_executed() == 0);
  c.drop = nullptr;
  REQUIRE(c.tick_until([&] { return c.r(3).last_committed() == 2; }, 500));
  CHECK(c.r(3).stats().state_transfers == 0);
  CHECK(c.service(3).value() == 2);
  require_agreement(c, {0, 1, 2, 3});
}

namespace {

// What a crash of replica `id` keeps when it strikes after Service::checkpoint(seq) made the service's state
// durable but before the driver synced the records of that step: the log is cut back to just before the
// CommittedRecord of `seq` (appended, unsynced, in the step that executed seq and took the checkpoint, like
// the CheckpointRecord after it). The PreparedRecord of seq survives: it was synced before its COMMIT left.
// With `keep_checkpoint_record` the cut comes right after the CheckpointRecord instead (its sync completed,
// the StableRecord's did not). Call between crash and restart.
void lose_tail_after_service_checkpoint(CounterCluster& c, NodeId id, std::uint64_t seq, bool keep_checkpoint_record) {
  std::vector<PersistRecord>& log = c.records(id);
  const auto is_committed = [&](const PersistRecord& r) {
    const auto* x = std::get_if<CommittedRecord>(&r);
    return x != nullptr && x->seq == seq;
  };
  const auto is_checkpoint = [&](const PersistRecord& r) {
    const auto* x = std::get_if<CheckpointRecord>(&r);
    return x != nullptr && x->seq == seq;
  };
  auto committed = std::find_if(log.begin(), log.end(), is_committed);
  auto checkpoint = std::find_if(log.begin(), log.end(), is_checkpoint);
  REQUIRE(committed != log.end());
  REQUIRE(checkpoint != log.end());
  REQUIRE(committed < checkpoint);
  log.erase(keep_checkpoint_record ? checkpoint + 1 : committed, log.end());
  sim::ReplicaHost& host = c.host(id);
  host.synced = log.size();
  host.promises = sim::PromiseIndex{};
  for (const PersistRecord& r : log) host.promises.add(r);
}

}  // namespace

TEST_CASE("replicas that all crash after their service checkpoint but before its records were synced recover by "
          "themselves", "[replica][recovery]") {
  // The whole cluster loses power at once. Replicas 0, 1 and 3 had made the service's checkpoint at 4 durable
  // but not the log records of that step (the CheckpointRecord, the CommittedRecord of 4); replica 2 had synced
  // its CheckpointRecord but not the StableRecord. No stable certificate for 4 exists anywhere, so nobody can
  // serve it by state transfer: the replicas must make it stable among themselves from what they kept.
  LogQuiet quiet;
  CounterCluster c(small_options());
  const NodeId client = c.client_ids[0];
  for (int k = 0; k < 4; k++) c.do_increment(client);
  c.tick(1);
  for (NodeId r = 0; r < 4; r++) REQUIRE(c.r(r).last_committed() == 4);
  for (NodeId r = 0; r < 4; r++) c.crash(r);
  for (NodeId r : {0u, 1u, 3u}) lose_tail_after_service_checkpoint(c, r, 4, false);
  lose_tail_after_service_checkpoint(c, 2, 4, true);
  for (NodeId r = 0; r < 4; r++) c.restart(r);
  for (NodeId r = 0; r < 4; r++) CHECK(c.service(r).value() == 4);  // the service kept its checkpoint
  c.run();
  // New requests commit and execute everywhere: before the service kept the client table with its checkpoint,
  // replicas 0, 1 and 3 waited forever for a state transfer of checkpoint 4.
  const Request req = c.increment(client);
  c.send_all(req);
  CHECK(c.await(client, req.request_id, 3000).value == 5);
  REQUIRE(c.tick_until(
      [&] {
        for (NodeId r = 0; r < 4; r++) {
          if (c.r(r).last_executed() < 5) return false;
        }
        return true;
      },
      3000));
  for (NodeId r = 0; r < 4; r++) {
    CHECK(c.service(r).value() == 5);
    CHECK(c.r(r).stable_checkpoint() == 4);
    CHECK(c.r(r).stats().state_transfers == 0);  // their own checkpoints, not fetched ones
  }
  CHECK(c.r(0).stats().recovered_checkpoints_adopted + c.r(1).stats().recovered_checkpoints_adopted +
            c.r(3).stats().recovered_checkpoints_adopted == 3);
  // The client table came back with the checkpoint: a retransmission of a request executed before the crash
  // gets its cached reply from every replica.
  c.inbox(client).clear();
  c.send_all(c.sent.at({client, 4}));
  c.run();
  CHECK(c.inbox(client).size() == 4);
  for (int k = 0; k < 4; k++) c.do_increment(client);
  require_agreement(c, {0, 1, 2, 3});
  for (NodeId r = 0; r < 4; r++) CHECK(c.service(r).value() == 9);
  CHECK(quiet.new_errors() == 0);
}

TEST_CASE("a replica that crashed after its service checkpoint but before its records were synced rejoins, also "
          "after a second crash", "[replica][recovery]") {
  LogQuiet quiet;
  CounterCluster c(small_options());
  const NodeId client = c.client_ids[0];
  for (int k = 0; k < 4; k++) c.do_increment(client);
  c.tick(1);
  c.crash(3);
  lose_tail_after_service_checkpoint(c, 3, 4, false);
  c.restart(3);
  CHECK(c.service(3).value() == 4);
  CHECK(c.r(3).last_executed() < 4);  // it waits for checkpoint 4 to be confirmed (recovered_pending)
  // Crashing again while it waits: the CheckpointRecord it wrote at the restart must not make the next
  // recovery stand at 4 without the committed log below it.
  c.crash(3);
  c.restart(3);
  c.run();
  for (int k = 0; k < 2; k++) c.do_increment(client);
  REQUIRE(c.tick_until([&] { return c.r(3).last_executed() == 6; }, 3000));
  CHECK(c.service(3).value() == 6);
  CHECK(c.r(3).stable_checkpoint() >= 4);
  require_agreement(c, {0, 1, 2, 3});
  CHECK(quiet.new_errors() == 0);
}
