// Tests of the simulator (sim/): its checker objects to broken histories, its recording service follows the
// Service contract, its network is deterministic, and fixed seeds of every kind (each Byzantine strategy,
// every replica crashing at once, f = 2, the null service with a pipelining client) pass, as do the seeds
// in sim/regression-seeds.txt.
#include <catch2/catch.hpp>

#include <fstream>
#include <string>

#include "common/crypto.h"
#include "protocol/client.h"
#include "services/counter_service.h"
#include "services/null_service.h"
#include "shim/envelope.h"
#include "shim/shim.h"
#include "sim/byzantine.h"
#include "sim/checker.h"
#include "sim/network.h"
#include "sim/recording_service.h"
#include "sim/simulator.h"

using namespace bftfs;
using namespace bftfs::sim;

namespace {

Digest digest_byte(std::uint8_t b) {
  Digest d;
  d.bytes[0] = b;
  return d;
}

Bytes counter_result(std::uint8_t status, std::uint64_t value, std::uint64_t token) {
  Bytes out;
  out.push_back(status);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(value >> (8 * i)));
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(token >> (8 * i)));
  return out;
}

ExecRecord exec(std::uint64_t seq, NodeId client, std::uint64_t rid, const Bytes& result, std::uint8_t kind = 1) {
  ExecRecord r;
  r.seq = seq;
  r.client = client;
  r.request_id = rid;
  r.op_kind = kind;
  r.result_digest = digest_of(result);
  r.result = result;
  return r;
}

Completion completion(std::uint64_t rid, const Bytes& result) {
  Completion c;
  c.request_id = rid;
  c.result = result;
  return c;
}

// A shim result envelope around a counter result.
Bytes shim_counter_result(std::uint64_t value, std::uint64_t token) {
  return shim::encode_envelope_result(shim::ShimStatus::kExecuted, counter_result(0, value, token));
}

// A final record of an enveloped increment with `deps`, executed (status kExecuted) or made a no-op.
ExecRecord shim_exec(std::uint64_t seq, NodeId client, std::uint64_t rid, const Bytes& result,
                     std::vector<shim::Dependency> deps) {
  ExecRecord r = exec(seq, client, rid, result);
  r.enveloped = true;
  shim::ShimResult sr;
  REQUIRE(shim::decode_envelope_result(result, sr));
  r.shim_status = sr.status;
  r.deps = std::move(deps);
  return r;
}

// Runs a seed in a child process and explains a failure.
void require_pass(const SimConfig& c) {
  const SimResult r = run_isolated(c);
  INFO("seed " << c.seed << " scenario '" << c.scenario << "': " << r.scenario << "\n" << r.failure);
  REQUIRE(r.passed);
  CHECK(r.stats.completed > 0);
}

}  // namespace

TEST_CASE("checker accepts a consistent counter history", "[sim][checker]") {
  Checker ch(true);
  ch.on_submit(4, 1, OpKind::kIncrement, 1);
  ch.on_committed(0, 1, digest_byte(1));
  ch.on_committed(1, 1, digest_byte(1));
  ch.on_final(0, exec(1, 4, 1, counter_result(0, 1, 77)));
  ch.on_final(1, exec(1, 4, 1, counter_result(0, 1, 77)));
  ch.on_completion(4, completion(1, counter_result(0, 1, 77)), 2);
  ch.on_submit(5, 1, OpKind::kRead, 3);
  ch.on_completion(5, completion(1, counter_result(0, 1, 5)), 4);
  ch.on_submit(4, 2, OpKind::kIncrement, 5);
  ch.on_completion(4, completion(2, counter_result(0, 2, 78)), 6);  // accepted before any replica finalized it
  ch.on_final(2, exec(2, 4, 2, counter_result(0, 2, 78)));
  ch.finish({{0, 2}, {1, 2}});
  INFO(ch.violation());
  CHECK_FALSE(ch.failed());
  CHECK(ch.successful_increments() == 2);
}

TEST_CASE("checker catches two replicas committing different batches at a seq", "[sim][checker]") {
  Checker ch(true);
  ch.on_committed(0, 7, digest_byte(1));
  CHECK_FALSE(ch.failed());
  ch.on_committed(2, 7, digest_byte(2));
  REQUIRE(ch.failed());
  CHECK(ch.violation().find("agreement") != std::string::npos);
}

TEST_CASE("checker catches two replicas with different final results for a request", "[sim][checker]") {
  Checker ch(false);
  ch.on_final(0, exec(3, 4, 9, Bytes{1, 2, 3}, 0));
  ch.on_final(1, exec(3, 4, 9, Bytes{1, 2, 4}, 0));
  REQUIRE(ch.failed());
  CHECK(ch.violation().find("agreed results") != std::string::npos);
}

TEST_CASE("checker catches a request executed at two sequence numbers", "[sim][checker]") {
  Checker ch(false);
  ch.on_final(0, exec(3, 4, 9, Bytes{1}, 0));
  ch.on_final(0, exec(5, 4, 9, Bytes{1}, 0));
  CHECK(ch.failed());
}

TEST_CASE("checker catches a client accepting a result that was not agreed", "[sim][checker]") {
  SECTION("final first") {
    Checker ch(false);
    ch.on_submit(4, 1, OpKind::kNull, 1);
    ch.on_final(0, exec(1, 4, 1, Bytes{0, 0}, 0));
    ch.on_completion(4, completion(1, Bytes{0, 1}), 2);
    REQUIRE(ch.failed());
    CHECK(ch.violation().find("accepted result") != std::string::npos);
  }
  SECTION("completion first") {
    Checker ch(false);
    ch.on_submit(4, 1, OpKind::kNull, 1);
    ch.on_completion(4, completion(1, Bytes{0, 1}), 2);
    CHECK_FALSE(ch.failed());
    ch.on_final(0, exec(1, 4, 1, Bytes{0, 0}, 0));
    CHECK(ch.failed());
  }
  SECTION("never executed") {
    Checker ch(false);
    ch.on_submit(4, 1, OpKind::kNull, 1);
    ch.on_completion(4, completion(1, Bytes{0, 1}), 2);
    ch.finish({});
    CHECK(ch.failed());
  }
}

TEST_CASE("checker catches counter integrity violations", "[sim][checker]") {
  SECTION("two increments with one value") {
    Checker ch(true);
    ch.on_final(0, exec(1, 4, 1, counter_result(0, 1, 1)));
    ch.on_final(0, exec(2, 5, 1, counter_result(0, 1, 2)));
    CHECK(ch.failed());
  }
  SECTION("values against the agreed order") {
    Checker ch(true);
    ch.on_final(0, exec(2, 4, 1, counter_result(0, 1, 1)));
    ch.on_final(0, exec(1, 5, 1, counter_result(0, 2, 2)));
    CHECK(ch.failed());
  }
  SECTION("a replica holding another value at the end") {
    Checker ch(true);
    ch.on_final(0, exec(1, 4, 1, counter_result(0, 1, 1)));
    ch.finish({{0, 1}, {1, 2}});
    CHECK(ch.failed());
  }
  SECTION("a lost increment") {
    Checker ch(true);
    ch.on_final(0, exec(1, 4, 1, counter_result(0, 2, 1)));
    ch.finish({{0, 2}});
    CHECK(ch.failed());
  }
}

TEST_CASE("checker catches reads that break real-time order", "[sim][checker]") {
  // One increment, submitted at step base+1 and completed at base+2.
  auto history = [](Checker& ch, std::uint64_t base) {
    ch.on_submit(4, 1, OpKind::kIncrement, base + 1);
    ch.on_final(0, exec(1, 4, 1, counter_result(0, 1, 1)));
    ch.on_completion(4, completion(1, counter_result(0, 1, 1)), base + 2);
  };
  SECTION("stale read after a completed increment") {
    Checker ch(true);
    history(ch, 0);
    ch.on_submit(5, 1, OpKind::kRead, 3);
    ch.on_completion(5, completion(1, counter_result(0, 0, 9)), 4);
    ch.finish({{0, 1}});
    REQUIRE(ch.failed());
    CHECK(ch.violation().find("linearizability") != std::string::npos);
  }
  SECTION("read from the future") {
    Checker ch(true);
    ch.on_submit(5, 1, OpKind::kRead, 0);
    ch.on_completion(5, completion(1, counter_result(0, 1, 9)), 1);  // completes before the increment began
    history(ch, 1);
    ch.finish({{0, 1}});
    CHECK(ch.failed());
  }
  SECTION("a read overlapping the increment may see either value") {
    for (std::uint64_t v : {0, 1}) {
      Checker ch(true);
      ch.on_submit(5, 1, OpKind::kRead, 0);
      history(ch, 0);
      ch.on_completion(5, completion(1, counter_result(0, v, 9)), 5);
      ch.finish({{0, 1}});
      INFO(ch.violation());
      CHECK_FALSE(ch.failed());
    }
  }
}

TEST_CASE("checker catches correct replicas with different checkpoints at a seq", "[sim][checker]") {
  Checker ch(true);
  ch.on_checkpoint(0, 8, digest_byte(1));
  ch.on_checkpoint(1, 8, digest_byte(1));
  ch.on_checkpoint(1, 16, digest_byte(3));
  CHECK_FALSE(ch.failed());
  ch.on_checkpoint(2, 8, digest_byte(2));
  REQUIRE(ch.failed());
  CHECK(ch.violation().find("checkpoint agreement") != std::string::npos);
}

TEST_CASE("checker catches an agreed increment that no client accepted", "[sim][checker]") {
  Checker ch(true);
  ch.on_submit(4, 1, OpKind::kIncrement, 1);
  ch.on_final(0, exec(1, 4, 1, counter_result(0, 1, 7)));
  ch.finish({{0, 1}});
  REQUIRE(ch.failed());
  CHECK(ch.violation().find("clients accepted 0") != std::string::npos);
}

TEST_CASE("checker follows predicates through the agreed history", "[sim][checker][shim]") {
  const Bytes a = shim_counter_result(1, 11);
  const Bytes lie = shim_counter_result(1, 99);  // what a lying primary said request 1 returned
  const Bytes retry_failed = shim::encode_envelope_result(shim::ShimStatus::kRetryPredicateFailed, {});
  SECTION("a request predicated on the agreed result executes; one predicated on a lie is a no-op") {
    Checker ch(true, true);
    ch.on_submit(4, 1, OpKind::kIncrement, 1);
    ch.on_submit(4, 2, OpKind::kIncrement, 2);
    ch.on_submit(4, 3, OpKind::kIncrement, 3);
    ch.on_final(0, shim_exec(1, 4, 1, a, {}));
    ch.on_final(0, shim_exec(1, 4, 2, shim_counter_result(2, 12), {{1, digest_of(a)}}));
    ch.on_final(0, shim_exec(2, 4, 3, retry_failed, {{1, digest_of(lie)}}));
    ch.on_final(1, shim_exec(2, 4, 3, retry_failed, {{1, digest_of(lie)}}));
    ch.on_first(4, 1, a);
    ch.on_completion(4, completion(1, a), 4, FinalKind::kCommit);
    ch.on_completion(4, completion(2, shim_counter_result(2, 12)), 5, FinalKind::kCommit);
    ch.on_first(4, 3, shim_counter_result(3, 13));
    ch.on_completion(4, completion(3, retry_failed), 6, FinalKind::kRollback);
    ch.finish({{0, 2}, {1, 2}});
    INFO(ch.violation());
    CHECK_FALSE(ch.failed());
    CHECK(ch.shim_retries() == 1);
  }
  SECTION("an executed request whose predicate is false") {
    Checker ch(true, true);
    ch.on_final(0, shim_exec(1, 4, 1, a, {}));
    ch.on_final(0, shim_exec(2, 4, 2, shim_counter_result(2, 12), {{1, digest_of(lie)}}));
    REQUIRE(ch.failed());
    CHECK(ch.violation().find("predicate") != std::string::npos);
  }
  SECTION("an executed request whose dependency never executed before it") {
    Checker ch(true, true);
    ch.on_final(0, shim_exec(2, 4, 2, shim_counter_result(1, 12), {{1, digest_of(a)}}));
    CHECK(ch.failed());
  }
  SECTION("a no-op for a failed predicate that held") {
    Checker ch(true, true);
    ch.on_final(0, shim_exec(1, 4, 1, a, {}));
    ch.on_final(0, shim_exec(2, 4, 2, retry_failed, {{1, digest_of(a)}}));
    CHECK(ch.failed());
  }
  SECTION("two replicas deciding differently") {
    Checker ch(true, true);
    ch.on_final(0, shim_exec(1, 4, 1, a, {}));
    ch.on_final(0, shim_exec(2, 4, 2, retry_failed, {{1, digest_of(lie)}}));
    ch.on_final(1, shim_exec(1, 4, 1, a, {}));
    ch.on_final(1, shim_exec(2, 4, 2, shim_counter_result(2, 12), {{1, digest_of(lie)}}));
    REQUIRE(ch.failed());
    CHECK(ch.violation().find("shim decision") != std::string::npos);
  }
}

TEST_CASE("checker ties a speculating client's final events to its first replies", "[sim][checker][shim]") {
  const Bytes a = shim_counter_result(1, 11);
  const Bytes lie = shim_counter_result(1, 99);
  SECTION("a commit after a mispredicted first reply") {
    Checker ch(true, true);
    ch.on_submit(4, 1, OpKind::kIncrement, 1);
    ch.on_first(4, 1, lie);
    ch.on_completion(4, completion(1, a), 2, FinalKind::kCommit);
    REQUIRE(ch.failed());
    CHECK(ch.violation().find("speculation") != std::string::npos);
  }
  SECTION("a rollback without a misprediction") {
    Checker ch(true, true);
    ch.on_submit(4, 1, OpKind::kIncrement, 1);
    ch.on_first(4, 1, a);
    ch.on_completion(4, completion(1, a), 2, FinalKind::kRollback);
    CHECK(ch.failed());
  }
  SECTION("a rolled-back result accepted as final") {
    Checker ch(true, true);
    ch.on_submit(4, 1, OpKind::kIncrement, 1);
    ch.on_final(0, shim_exec(1, 4, 1, a, {}));
    ch.on_first(4, 1, lie);
    ch.on_completion(4, completion(1, lie), 2, FinalKind::kCommit);  // the client kept the first reply
    REQUIRE(ch.failed());
    CHECK(ch.violation().find("accepted result") != std::string::npos);
  }
}

TEST_CASE("recording service audits the shim below it", "[sim][recording][shim]") {
  MemorySnapshotStore store;
  CounterService counter(&store);
  ExecutionProbe probe(counter);
  shim::Shim shim(probe, &store, shim::ShimOptions{64, 8});
  const NodeId client = 9;
  const Bytes inc = counter_increment_op(counter_initial_token(client));
  SECTION("a correct shim passes, and its records carry the decisions") {
    RecordingService rec(shim, &shim, &probe);
    const Bytes r1 = rec.execute(ExecContext{1, client, 1, 0}, shim::encode_envelope({}, inc));
    const std::vector<shim::Dependency> wrong = {{1, digest_of(Bytes{1})}};
    const Bytes r2 = rec.execute(ExecContext{2, client, 2, 0}, shim::encode_envelope(wrong, inc));
    const std::vector<shim::Dependency> unknown = {{7, digest_of(r1)}};
    rec.execute(ExecContext{3, client, 3, 0}, shim::encode_envelope(unknown, inc));
    rec.execute(ExecContext{3, client, 4, 0}, Bytes{9, 9});
    CHECK(probe.executions() == 1);
    rec.commit_through(3);
    const auto finals = rec.take_final();
    REQUIRE(finals.size() == 4);
    CHECK(finals[0].shim_status == shim::ShimStatus::kExecuted);
    CHECK(finals[0].op_kind == 1);
    CHECK(finals[1].shim_status == shim::ShimStatus::kRetryPredicateFailed);
    CHECK(finals[1].deps == wrong);
    CHECK(finals[2].shim_status == shim::ShimStatus::kRetryDependencyUnknown);
    CHECK(finals[3].shim_status == shim::ShimStatus::kMalformed);
    INFO(rec.contract_error());
    CHECK(rec.contract_error().empty());
  }
  SECTION("a decision against the audited log is a breach") {
    // The audit reads another shim's (empty) log: the dependency the real shim finds looks unknown.
    MemorySnapshotStore other_store;
    CounterService other_counter(&other_store);
    shim::Shim other(other_counter, &other_store, shim::ShimOptions{64, 8});
    RecordingService rec(shim, &other, &probe);
    const Bytes r1 = rec.execute(ExecContext{1, client, 1, 0}, shim::encode_envelope({}, inc));
    CHECK(rec.contract_error().empty());  // `other` does not log this client at all: allowed (shim.h limits)
    CounterResult cr;
    shim::ShimResult sr;
    REQUIRE(shim::decode_envelope_result(r1, sr));
    REQUIRE(parse_counter_result(sr.inner, cr));
    const std::vector<shim::Dependency> deps = {{1, digest_of(r1)}};
    RecordingService fresh(shim, &other, &probe);
    fresh.execute(ExecContext{2, client, 2, 0}, shim::encode_envelope(deps, counter_increment_op(cr.next_token)));
    CHECK(fresh.contract_error().find("shim decision") != std::string::npos);
  }
}

TEST_CASE("recording service keeps executions tentative until committed", "[sim][recording]") {
  MemorySnapshotStore store;
  CounterService counter(&store);
  RecordingService rec(counter);
  const NodeId client = 9;
  const std::uint64_t token = counter_initial_token(client);
  const Bytes r1 = rec.execute(ExecContext{1, client, 1, 0}, counter_increment_op(token));
  CounterResult res;
  REQUIRE(parse_counter_result(r1, res));
  rec.execute(ExecContext{2, client, 2, 0}, counter_increment_op(res.next_token));
  CHECK(rec.take_final().empty());
  rec.rollback_to(1);  // seq 2 is undone
  CHECK(rec.tentative_count() == 1);
  rec.commit_through(1);
  const auto finals = rec.take_final();
  REQUIRE(finals.size() == 1);
  CHECK(finals[0].seq == 1);
  CHECK(finals[0].request_id == 1);
  CHECK(finals[0].result_digest == digest_of(r1));
  CHECK(rec.contract_error().empty());
  rec.rollback_to(0);  // below the commit: the engine broke the contract
  CHECK_FALSE(rec.contract_error().empty());
}

TEST_CASE("network delivers deterministically and honours partitions and crashes", "[sim][network]") {
  auto run = [](std::uint64_t seed) {
    Prng prng(seed);
    NetworkOptions o;
    o.delay_min_ticks = 1;
    o.delay_max_ticks = 9;
    o.duplicate_ppm = 100'000;
    Network net(3, o, prng);
    for (std::uint8_t i = 0; i < 50; ++i) net.send(i % 3, (i + 1) % 3, Bytes{i}, 0);
    std::vector<std::uint8_t> order;
    Packet p;
    for (std::uint64_t t = 0; t < 20; ++t) {
      while (net.pop_due(t, p)) order.push_back(p.frame[0]);
    }
    return order;
  };
  CHECK(run(5) == run(5));
  CHECK(run(5).size() >= 50);

  Prng prng(1);
  Network net(3, NetworkOptions{}, prng);
  net.set_partition({0, 0, 1});
  net.send(0, 2, Bytes{1}, 0);
  net.send(0, 1, Bytes{2}, 0);
  net.send(1, 0, Bytes{3}, 0);
  net.kill(0);
  Packet p;
  std::vector<std::uint8_t> got;
  while (net.pop_due(100, p)) got.push_back(p.frame[0]);
  CHECK(got == std::vector<std::uint8_t>{2});
  CHECK(net.stats().partitioned == 1);
  CHECK(net.stats().to_dead_node == 1);
}

TEST_CASE("a machine shared by the replicas takes in its bytes per tick; the rest waits in send order",
          "[sim][network]") {
  Prng prng(3);
  NetworkOptions o;
  o.delay_min_ticks = 1;
  o.delay_max_ticks = 1;
  Network net(3, o, prng);
  net.limit_receivers(2, 100);  // nodes 0 and 1 share 100 bytes per tick; node 2 (a client) has no limit
  for (std::uint8_t i = 0; i < 6; ++i) net.send(2, i % 2, Bytes(60, i), 0);
  net.send(0, 2, Bytes{9}, 0);
  std::vector<std::vector<std::uint8_t>> per_tick;
  Packet p;
  for (std::uint64_t t = 1; t <= 5; ++t) {
    per_tick.emplace_back();
    while (net.pop_due(t, p)) per_tick.back().push_back(p.frame[0]);
  }
  // Tick 1: 60 bytes, then 60 more while 40 are left (20 owed); the client's frame passes. Tick 2 has 80: two
  // frames (40 owed). Tick 3 has 60: one frame, which uses it up. Tick 4: the last one.
  CHECK(per_tick[0] == std::vector<std::uint8_t>{0, 1, 9});
  CHECK(per_tick[1] == std::vector<std::uint8_t>{2, 3});
  CHECK(per_tick[2] == std::vector<std::uint8_t>{4});
  CHECK(per_tick[3] == std::vector<std::uint8_t>{5});
  CHECK(per_tick[4].empty());
  CHECK(net.stats().delivered == 7);
  CHECK(net.stats().waited == 4 + 2 + 1);  // frames 2..5 waited at tick 1, 4 and 5 at tick 2, 5 at tick 3
  CHECK(net.stats().backlog_max == 4);
  CHECK(net.backlog() == 0);
}

TEST_CASE("regression lines parse", "[sim]") {
  SimConfig c;
  bool empty = false;
  std::string error;
  REQUIRE(parse_regression_line("  # only a comment", c, empty, error));
  CHECK(empty);
  REQUIRE(parse_regression_line("42 f=2 scenario=all-crash service=null ticks=900 # why", c, empty, error));
  CHECK_FALSE(empty);
  CHECK(c.service == "null");
  CHECK(c.seed == 42);
  CHECK(c.f == 2);
  CHECK(c.scenario == "all-crash");
  CHECK(c.fault_ticks == 900);
  REQUIRE(parse_regression_line("7 cs=1", c, empty, error));
  CHECK(c.speculation == 1);
  CHECK_FALSE(parse_regression_line("7 cs=2", c, empty, error));
  CHECK_FALSE(parse_regression_line("x1", c, empty, error));
  CHECK_FALSE(parse_regression_line("1 f=0", c, empty, error));
  CHECK_FALSE(parse_regression_line("1 service=files", c, empty, error));
}

TEST_CASE("a calm seed passes and a seed reproduces its run exactly", "[sim][seeds]") {
  SimConfig c;
  c.seed = 11;
  c.scenario = "calm";
  const SimResult a = run_isolated(c);
  INFO(a.failure);
  REQUIRE(a.passed);
  CHECK(a.stats.completed > 20);
  const SimResult b = run_isolated(c);
  CHECK(b.stats.fingerprint == a.stats.fingerprint);
  CHECK(b.stats.steps == a.stats.steps);
  c.seed = 12;
  CHECK(run_isolated(c).stats.fingerprint != a.stats.fingerprint);
}

TEST_CASE("fixed seeds pass under crashes, partitions and every replica crashing at once", "[sim][seeds]") {
  for (const char* scenario : {"network", "crash", "all-crash"}) {
    for (std::uint64_t seed : {1, 2}) {
      SimConfig c;
      c.seed = seed;
      c.scenario = scenario;
      c.service = "counter";
      c.byzantine = false;
      require_pass(c);
    }
  }
  SimConfig c;
  c.seed = 3;
  c.f = 2;
  c.scenario = "crash";
  c.service = "counter";
  require_pass(c);
}

TEST_CASE("a pipelining client on the null service passes calm and crash seeds", "[sim][seeds]") {
  for (const char* scenario : {"calm", "crash"}) {
    SimConfig c;
    c.seed = 2;
    c.scenario = scenario;
    c.service = "null";
    c.byzantine = false;
    require_pass(c);
  }
}

TEST_CASE("PBFT-CS seeds pass: early replies, the shim and speculating clients", "[sim][seeds][shim]") {
  for (const char* scenario : {"calm", "network", "crash", "all-crash"}) {
    for (std::uint64_t seed : {4, 5}) {
      SimConfig c;
      c.seed = seed;
      c.scenario = scenario;
      c.speculation = 1;
      const SimResult r = run_isolated(c);
      INFO("seed " << seed << " " << r.scenario << "\n" << r.failure);
      REQUIRE(r.passed);
      CHECK(r.stats.cs_shim == 1);
      CHECK(r.stats.cs_speculating_clients >= 1);
      CHECK(r.stats.first_delivered > 0);
    }
  }
  SimConfig c;
  c.seed = 4;
  c.service = "null";
  c.speculation = 1;
  CHECK_FALSE(check_config(c).empty());  // speculating clients chain counter increments
}

TEST_CASE("fixed seeds pass with each Byzantine strategy", "[sim][seeds]") {
  for (int s = 1; s < static_cast<int>(Strategy::kCount); ++s) {
    SimConfig c;
    c.seed = 100 + static_cast<std::uint64_t>(s);
    c.scenario = std::string(to_string(static_cast<Strategy>(s)));
    c.service = "counter";
    require_pass(c);
  }
  SimConfig c;
  c.seed = 7;
  c.f = 2;
  c.scenario = "byzantine";
  c.service = "counter";
  require_pass(c);
}

TEST_CASE("every seed in sim/regression-seeds.txt passes", "[sim][seeds]") {
  std::vector<SimConfig> configs;
  const std::string error = read_regression_seeds(regression_seeds_path(), configs);
  INFO(error);
  REQUIRE(error.empty());
  REQUIRE(!configs.empty());
  for (const SimConfig& c : configs) require_pass(c);
}

TEST_CASE("a failing run reports its seed and reason", "[sim]") {
  SimConfig c;
  c.seed = 5;
  c.scenario = "no-such-scenario";
  const SimResult r = run_isolated(c);
  CHECK_FALSE(r.passed);
  CHECK(r.failure.find("seed=5") != std::string::npos);
  CHECK(r.failure.find("unknown scenario") != std::string::npos);
  c.scenario = "byzantine";
  c.byzantine = false;
  CHECK_FALSE(run_simulation(c).passed);
}

TEST_CASE("the checker sees the cluster: a replica whose results are altered fails the run", "[sim]") {
  SimConfig c;
  c.seed = 11;
  c.scenario = "calm";
  c.sabotage_results = true;
  const SimResult r = run_isolated(c);
  REQUIRE_FALSE(r.passed);
  const bool named = r.failure.find("agreed results") != std::string::npos ||
                     r.failure.find("accepted result") != std::string::npos;
  INFO(r.failure);
  CHECK(named);
}

TEST_CASE("the PBFT-CS checks see the cluster: replicas that ignore predicates fail the run", "[sim][shim]") {
  SimConfig c;
  c.seed = 21;
  c.scenario = "lying-early-replies";
  c.speculation = 1;
  c.sabotage_predicates = true;
  const SimResult r = run_isolated(c);
  INFO(r.scenario << "\n" << r.failure);
  REQUIRE_FALSE(r.passed);
  const bool named = r.failure.find("shim decision") != std::string::npos ||
                     r.failure.find("predicate") != std::string::npos;
  CHECK(named);
  c.sabotage_predicates = false;  // and the same seed passes with honest replicas
  const SimResult honest = run_isolated(c);
  INFO(honest.failure);
  CHECK(honest.passed);
  CHECK(honest.stats.early_lies + honest.stats.fake_early_replies > 0);
}

TEST_CASE("checker catches a client's requests executed out of the order it issued them", "[sim][checker][order]") {
  SECTION("across batches, whichever replica reports first") {
    Checker ch(false);
    ch.on_final(0, exec(5, 4, 2, Bytes{2}, 0));
    ch.on_final(1, exec(5, 4, 2, Bytes{2}, 0));
    CHECK_FALSE(ch.failed());
    ch.on_final(1, exec(6, 4, 1, Bytes{1}, 0));  // request 1 after request 2
    REQUIRE(ch.failed());
    CHECK(ch.violation().find("client order") != std::string::npos);
  }
  SECTION("inside one batch") {
    Checker ch(false);
    ExecRecord later = exec(5, 4, 2, Bytes{2}, 0);
    ExecRecord earlier = exec(5, 4, 1, Bytes{1}, 0);
    later.index = 0;
    earlier.index = 1;
    ch.on_final(0, earlier);  // reported first, still placed after
    ch.on_final(0, later);
    REQUIRE(ch.failed());
    CHECK(ch.violation().find("client order") != std::string::npos);
  }
  SECTION("in order, with gaps and other clients in between, passes") {
    Checker ch(false);
    ExecRecord a = exec(5, 4, 1, Bytes{1}, 0);
    ExecRecord b = exec(5, 5, 9, Bytes{9}, 0);
    ExecRecord c = exec(5, 4, 3, Bytes{3}, 0);  // client 4: 1 then 3; client 5: 9 then 11
    b.index = 1;
    c.index = 2;
    ch.on_final(0, c);
    ch.on_final(0, a);
    ch.on_final(0, b);
    ch.on_final(2, exec(8, 4, 7, Bytes{7}, 0));  // id 2 was a read: never executed
    ch.on_final(2, exec(7, 5, 11, Bytes{4}, 0));  // clients are independent
    INFO(ch.violation());
    CHECK_FALSE(ch.failed());
  }
}

TEST_CASE("a primary that reorders a pipelining client's requests is caught by the order rule", "[sim][seeds][order]") {
  SimConfig c;
  c.seed = 1;
  c.scenario = "reorder-client";
  const SimResult r = run_isolated(c);
  INFO(r.scenario << "\n" << r.failure);
  REQUIRE(r.passed);
  CHECK(r.stats.pipelined_clients > 0);
  CHECK(r.stats.reorder_primary == 1);
  CHECK(r.stats.requests_deferred_order > 0);  // the lie reached execution and was skipped everywhere alike
}
