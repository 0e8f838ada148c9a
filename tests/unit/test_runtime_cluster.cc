// A real 4-replica PBFT cluster in this process: each replica's runtime runs its own event loop in its own
// thread, on loopback TCP, with its write-ahead log and snapshots on disk (fdatasync on). A PBFT client runs
// in the test's thread.
#include <array>
#include <atomic>
#include <thread>

#include "common/config.h"
#include "common/log.h"
#include "runtime/client_runtime.h"
#include "replica/replica_runtime.h"
#include "services/counter_service.h"
#include "tests/unit/test_runtime_util.h"

using namespace bftfs;
using namespace bftfs::testing;

namespace {

class Cluster {
 public:
  // `view_change_timeout_ticks`: a test that asserts "no view change" on a fault-free run gives the replicas
  // more than the default 200 ms, so that a machine busy with other work (a log write stalled for a few hundred
  // milliseconds) does not make the assertion about timing rather than behaviour.
  explicit Cluster(std::uint32_t view_change_timeout_ticks = ReplicaOptions{}.view_change_timeout_ticks)
      : view_change_timeout_ticks_(view_change_timeout_ticks) {
    port_ = free_port_range(4);
    REQUIRE(generate_cluster(dir_.path, 1, 4, {"127.0.0.1"}, port_).empty());
    conf_ = dir_.path + "/cluster.conf";
    for (NodeId i = 0; i < 4; ++i) start(i);
  }
  ~Cluster() {
    for (NodeId i = 0; i < 4; ++i) {
      if (rt_[i]) stop(i);
    }
  }

  void start(NodeId i) {
    REQUIRE(rt_[i] == nullptr);
    ReplicaRuntimeOptions o;
    o.config_path = conf_;
    o.id = i;
    o.data_dir = dir_.path + "/r" + std::to_string(i);
    o.service = "counter";
    o.core.checkpoint_interval = 32;  // several checkpoints (and log compactions) within the test
    o.core.log_window = 64;
    o.wal.compact_bytes_min = 0;
    o.check_invariants = true;
    o.core.view_change_timeout_ticks = view_change_timeout_ticks_;
    const std::string err = ReplicaRuntime::create(o, rt_[i]);
    INFO(err);
    REQUIRE(err.empty());
    ReplicaRuntime* rt = rt_[i].get();
    threads_[i] = std::thread([rt] { rt->run(); });
  }
  void stop(NodeId i) {
    rt_[i]->stop();
    threads_[i].join();
    rt_[i].reset();
  }
  ReplicaSnapshot snap(NodeId i) const { return rt_[i]->snapshot(); }
  const std::string& conf() const { return conf_; }

 private:
  std::uint32_t view_change_timeout_ticks_;
  TempDir dir_;
  std::uint16_t port_ = 0;
  std::string conf_;
  std::array<std::unique_ptr<ReplicaRuntime>, 4> rt_;
  std::array<std::thread, 4> threads_;
};

// Runs `count` sequential increments (each with the previous reply's token); returns the values seen.
std::vector<std::uint64_t> increments(event_base* base, SubmitClient& client, std::uint64_t& token, int count,
                                      int timeout_ms) {
  std::vector<std::uint64_t> values;
  bool failed = false;
  std::function<void()> next = [&] {
    client.submit(counter_increment_op(token), false, [&](const Completion& c) {
      CounterResult r;
      if (!parse_counter_result(c.result, r) || r.status != 0) {
        failed = true;
        return;
      }
      values.push_back(r.value);
      token = r.next_token;
      if (static_cast<int>(values.size()) < count) next();
    });
  };
  next();
  const bool done = run_until(base, [&] { return failed || static_cast<int>(values.size()) >= count; }, timeout_ms);
  INFO("completed " << values.size() << " of " << count);
  REQUIRE(done);
  REQUIRE_FALSE(failed);
  return values;
}

}  // namespace

TEST_CASE("cluster: 200 sequential counter increments on 4 replicas succeed in order", "[runtime][cluster]") {
  const std::uint64_t errors_before = log_error_count();
  Cluster cluster(5000);
  EventBasePtr base = make_event_base();
  std::unique_ptr<ClientRuntime> client;
  ClientOptions co;
  co.first_request_id = fresh_first_request_id();
  REQUIRE(ClientRuntime::create(base.get(), cluster.conf(), 4, co, client).empty());
  std::uint64_t token = counter_initial_token(4);
  const auto values = increments(base.get(), *client, token, 200, 15000);
  REQUIRE(values.size() == 200);
  for (std::size_t i = 0; i < values.size(); ++i) REQUIRE(values[i] == i + 1);
  // Every replica executes every batch (none was left behind on a fault-free run).
  const std::uint64_t executed = cluster.snap(0).last_executed;
  CHECK(executed >= 1);
  CHECK(wait_until(
      [&] {
        for (NodeId i = 0; i < 4; ++i) {
          if (cluster.snap(i).last_executed < executed) return false;
        }
        return true;
      },
      5000));
  for (NodeId i = 0; i < 4; ++i) CHECK(cluster.snap(i).view == 0);
  CHECK(client->stats().completed == 200);
  CHECK(log_error_count() == errors_before);
}

TEST_CASE("cluster: a replica restarted on its data directory rejoins and catches up", "[runtime][cluster]") {
  const std::uint64_t errors_before = log_error_count();
  Cluster cluster;
  EventBasePtr base = make_event_base();
  std::unique_ptr<ClientRuntime> client;
  ClientOptions co;
  co.first_request_id = fresh_first_request_id();
  REQUIRE(ClientRuntime::create(base.get(), cluster.conf(), 4, co, client).empty());
  std::uint64_t token = counter_initial_token(4);

  CHECK(increments(base.get(), *client, token, 40, 10000).back() == 40);
  // Replica 3 (a backup) goes down; 2f+1 = 3 replicas keep going.
  cluster.stop(3);
  CHECK(increments(base.get(), *client, token, 40, 10000).back() == 80);
  cluster.start(3);
  CHECK(increments(base.get(), *client, token, 40, 10000).back() == 120);
  const std::uint64_t target = cluster.snap(0).last_executed;
  INFO("replica 3 executed " << cluster.snap(3).last_executed << ", replica 0 " << target);
  CHECK(wait_until([&] { return cluster.snap(3).last_executed >= target; }, 8000));
  CHECK(cluster.snap(3).view == cluster.snap(0).view);
  CHECK(log_error_count() == errors_before);
}
