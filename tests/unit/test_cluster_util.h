// Helpers for the unit tests that drive real replicas on the cluster driver (sim/cluster.h) in its scripted mode:
// messages delivered in order through one queue, a drop filter, a log of what was delivered, client inboxes.
//   LogQuiet           quiets the replicas' logs for a test and counts the ERROR lines it logged
//   fifo_cluster       the ClusterOptions of a scripted cluster
//   CounterCluster     replicas over the counter service with counter clients that follow their tokens
//                      (tests/unit/test_replica_*.cc)
//   require_agreement  every seq committed by two replicas has one digest
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "common/log.h"
#include "protocol/replica.h"
#include "services/counter_service.h"
#include "sim/cluster.h"
#include "sim/service_stack.h"

namespace bftfs::testing {

using sim::Envelope;
using sim::is;

// Quiets INFO/WARN lines of the replicas under test and remembers the ERROR count, which must not grow.
class LogQuiet {
 public:
  LogQuiet() : level_(log_level()), errors_(log_error_count()) {
    // BFTFS_TEST_VERBOSE=1 shows the replicas' INFO lines when a test needs debugging.
    log_set_level(std::getenv("BFTFS_TEST_VERBOSE") != nullptr ? LogLevel::kInfo : LogLevel::kError);
  }
  ~LogQuiet() { log_set_level(level_); }
  LogQuiet(const LogQuiet&) = delete;
  LogQuiet& operator=(const LogQuiet&) = delete;
  // ERROR lines logged since construction.
  std::uint64_t new_errors() const { return log_error_count() - errors_; }

 private:
  LogLevel level_;
  std::uint64_t errors_;
};

// A scripted cluster: `replica` options, `clients` client endpoints, keys and core seeds from `key_seed` (replica
// i's core seeds key_seed + i), every core's wall clock at 1 ms from its start, services from `factory`.
inline sim::ClusterOptions fifo_cluster(const ReplicaOptions& replica, std::uint32_t clients, std::uint64_t key_seed,
                                        sim::ServiceFactory factory) {
  sim::ClusterOptions o;
  o.replica = replica;
  o.clients = clients;
  o.key_seed = key_seed;
  o.factory = std::move(factory);
  o.delivery = sim::Delivery::kFifo;
  o.start_wall_clock_ns = 1'000'000;
  return o;
}

// Four replicas (f = 1) with a short checkpoint interval and log window, so that a few requests garbage-collect
// the log and force state transfer; every other option as the daemons have it.
inline ReplicaOptions short_log_options() {
  ReplicaOptions o;
  o.n = 4;
  o.f = 1;
  o.checkpoint_interval = 4;
  o.log_window = 8;
  o.client_window = 8;
  o.view_change_timeout_ticks = 100;
  o.view_change_timeout_ticks_max = 1000;
  o.status_interval_ticks = 20;
  o.fetch_retry_ticks = 10;
  return o;
}

// short_log_options() with the classic message flow, which the step-by-step replica tests follow: each COMMIT at
// once (piggybacked commits have their own tests), each batch as soon as the window allows (the batch hold has
// its own tests), and a primary that votes like every replica (the quiet primary has its own tests).
inline ReplicaOptions small_options() {
  ReplicaOptions o = short_log_options();
  o.piggyback_commits = false;
  o.batch_hold = false;
  o.quiet_primary = false;
  return o;
}

inline constexpr std::uint64_t kCounterKeySeed = 20261122;

// Replicas over the counter service (no shim) and `clients` counter clients, each following the tokens of its
// results.
class CounterCluster : public sim::Cluster {
 public:
  explicit CounterCluster(const ReplicaOptions& options, std::uint32_t clients = 2)
      : sim::Cluster(fifo_cluster(options, clients, kCounterKeySeed,
                                  sim::plain_stack<CounterService>(
                                      [](SnapshotStore* store) { return std::make_unique<CounterService>(store); }))),
        opt(options),
        client_ids(sim::Cluster::client_ids()) {
    for (NodeId c : client_ids) token[c] = counter_initial_token(c);
    start_all();
  }

  Replica& r(NodeId i) { return replica(i); }
  CounterService& service(NodeId i) { return *stack<sim::PlainStack<CounterService>>(i).service; }

  // Ticks until `done` holds (checked before every tick); false after `max_ticks`.
  bool tick_until(const std::function<bool()>& done, std::uint64_t max_ticks = 20000) {
    return sim::Cluster::tick_until(done, max_ticks);
  }

  // The next increment of `client` with the token it holds (remembered in `sent`).
  Request increment(NodeId client) {
    Request req = make_request(client, ++next_id[client], counter_increment_op(token[client]));
    sent[{client, req.request_id}] = req;
    return req;
  }
  // Runs and ticks until the request is accepted; updates the client's token from its counter result.
  CounterResult await(NodeId client, std::uint64_t id, std::uint64_t max_ticks = 20000) {
    run();
    REQUIRE(tick_until([&] { return accepted(client, id).has_value(); }, max_ticks));
    CounterResult res;
    REQUIRE(parse_counter_result(*accepted(client, id), res));
    token[client] = res.next_token;
    return res;
  }
  // One increment, sent to the primary of `view`, retransmitted to all on the way if needed.
  CounterResult do_increment(NodeId client, std::uint64_t view = 0) {
    const Request req = increment(client);
    send(req, static_cast<NodeId>(view % n()));
    run();
    if (!accepted(client, req.request_id)) send_all(req);
    return await(client, req.request_id);
  }

  const ReplicaOptions opt;
  const std::vector<NodeId> client_ids;
  std::map<NodeId, std::uint64_t> token;    // the token of each client's next increment
  std::map<NodeId, std::uint64_t> next_id;  // each client's last request id
  std::map<std::pair<NodeId, std::uint64_t>, Request> sent;
};

// Every seq committed by two of `which` has the same digest at both (histories may start at different seqs
// after a restart or a state transfer), and each history is increasing.
inline void require_agreement(sim::Cluster& c, const std::vector<NodeId>& which) {
  std::map<std::uint64_t, Digest> seen;
  for (NodeId i : which) {
    std::uint64_t previous = 0;
    for (const ExecutedBatch& b : c.replica(i).committed_history()) {
      REQUIRE(b.seq > previous);
      previous = b.seq;
      auto [it, inserted] = seen.emplace(b.seq, b.digest);
      REQUIRE(it->second == b.digest);
    }
  }
}

}  // namespace bftfs::testing
