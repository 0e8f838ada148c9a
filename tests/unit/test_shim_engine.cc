// The shim under the real PBFT engine (protocol/replica.h): four replicas on the scripted cluster driver
// (sim/cluster.h), each running Shim over CounterService. What the shim's own tests cannot show: that the
// engine's checkpoints, state transfer (over inner + shim partitions), tentative execution and recovery from its
// records all carry the predicate log, so every correct replica makes the same predicate decisions.
#include <catch2/catch.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "services/counter_service.h"
#include "shim/envelope.h"
#include "shim/shim.h"
#include "test_cluster_util.h"

using namespace bftfs;
using namespace bftfs::shim;

namespace {

constexpr std::uint64_t kKeySeed = 0x5A1A;
constexpr NodeId kReplicas = 4;

// Four replicas, each with a counter under its shim, and two clients (kReplicas and kReplicas + 1).
class ShimCluster : public sim::Cluster {
 public:
  ShimCluster()
      : sim::Cluster(testing::fifo_cluster(testing::short_log_options(), 2, kKeySeed,
                                           sim::shim_stack<CounterService>([](SnapshotStore* store) {
                                             return std::make_unique<CounterService>(store);
                                           }))) {
    start_all();
  }

  // Orders request `request_id` of `client` and returns the accepted result.
  Bytes order(NodeId client, std::uint64_t request_id, const Bytes& op) {
    const std::optional<Bytes> result = sim::Cluster::order(client, request_id, op, 3000);
    REQUIRE(result.has_value());
    return *result;
  }
  // Ticks until `done` holds or 3000 ticks passed; returns whether it holds.
  bool tick_until(const std::function<bool()>& done) { return sim::Cluster::tick_until(done, 3000); }
  Shim& shim(NodeId i) { return *stack<sim::ShimStack<CounterService>>(i).shim; }
  std::uint64_t new_errors() const { return quiet_.new_errors(); }

 private:
  testing::LogQuiet quiet_;
};

using sim::Envelope;

// A counter client that speculates: every increment names the previous one and the digest of its reply.
struct Speculator {
  NodeId id;
  std::uint64_t token;
  std::uint64_t rid = 0;
  std::optional<Dependency> last;
  explicit Speculator(NodeId c) : id(c), token(counter_initial_token(c)) {}

  ShimResult increment(ShimCluster& c, std::optional<Digest> predicted = std::nullopt) {
    std::vector<Dependency> deps;
    if (last) deps.push_back(Dependency{last->request_id, predicted.value_or(last->result_digest)});
    const Bytes bytes = c.order(id, ++rid, encode_envelope(deps, counter_increment_op(token)));
    ShimResult res;
    REQUIRE(decode_envelope_result(bytes, res));
    if (res.status == ShimStatus::kExecuted) {
      CounterResult cr;
      REQUIRE(parse_counter_result(res.inner, cr));
      if (cr.status == 0) token = cr.next_token;
    }
    last = Dependency{rid, digest_of(bytes)};
    return res;
  }
};

Digest bogus_digest() {
  Digest d;
  d.bytes.fill(0x77);
  return d;
}

std::uint64_t value_of(const ShimResult& r) {
  CounterResult cr;
  REQUIRE(r.status == ShimStatus::kExecuted);
  REQUIRE(parse_counter_result(r.inner, cr));
  return cr.value;
}

}  // namespace

TEST_CASE("shim under the engine: predicates decide the same everywhere, across state transfer and restart",
          "[shim][replica]") {
  ShimCluster c;
  Speculator a(kReplicas), b(kReplicas + 1);

  // Replica 3 is cut off while the others order enough to garbage-collect the log it would need.
  c.drop = [](const Envelope& p) { return p.to == 3 || p.from == 3; };
  for (int k = 0; k < 6; ++k) CHECK(value_of(a.increment(c)) == static_cast<std::uint64_t>(k + 1));
  b.increment(c);
  // b speculated on a wrong reply: every correct replica turns its request into a no-op.
  const ShimResult wrong = b.increment(c, bogus_digest());
  CHECK(wrong.status == ShimStatus::kRetryPredicateFailed);
  b.last.reset();  // the client resubmits without the failed speculation
  CHECK(value_of(b.increment(c)) == 8);
  for (int k = 0; k < 6; ++k) a.increment(c);
  REQUIRE(c.replica(0).stable_checkpoint() >= 12);
  REQUIRE(c.replica(3).last_executed() == 0);

  // Replica 3 catches up by state transfer: the logs come with the checkpoint.
  c.drop = nullptr;
  // Everything executed commits (the last batch's COMMITs may still wait for the next tick: piggybacking).
  const std::uint64_t target = c.replica(0).last_executed();
  REQUIRE(c.tick_until([&] { return c.replica(3).last_committed() == target; }));
  CHECK(c.replica(3).stats().state_transfers >= 1);
  for (std::uint64_t rid = 1; rid <= a.rid; ++rid) {
    CHECK(c.shim(3).logged_digest(a.id, rid) == c.shim(0).logged_digest(a.id, rid));
  }
  CHECK(c.shim(3).logged_digest(b.id, 2) == c.shim(0).logged_digest(b.id, 2));

  // Without replica 0, progress needs replica 3, whose log must hold a's last reply for the predicate to hold.
  c.drop = [](const Envelope& p) { return p.to == 0 || p.from == 0; };
  const ShimResult via3 = a.increment(c);
  CHECK(via3.status == ShimStatus::kExecuted);
  c.drop = nullptr;

  // Replica 1 restarts from its records and store; then, without replica 2, it is needed again.
  c.crash(1);
  c.restart(1);
  const std::uint64_t now = c.replica(0).last_committed();
  REQUIRE(c.tick_until([&] { return c.replica(1).last_committed() >= now; }));
  c.drop = [](const Envelope& p) { return p.to == 2 || p.from == 2; };
  CHECK(a.increment(c).status == ShimStatus::kExecuted);
  // And a stale prediction is still caught after all of that.
  CHECK(b.increment(c, bogus_digest()).status == ShimStatus::kRetryPredicateFailed);
  CHECK(c.new_errors() == 0);
}
