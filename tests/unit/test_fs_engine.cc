// The file service under the real PBFT engine (protocol/replica.h) and the PBFT-CS shim: four replicas on the
// scripted cluster driver (sim/cluster.h), each running Shim over FsService. What the service's own tests cannot
// show: that the engine's tentative execution, checkpoints, state transfer over the file service's partitions
// and recovery from its records keep every correct replica's file system identical.
#include <catch2/catch.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "shim/envelope.h"
#include "test_cluster_util.h"
#include "test_fs_util.h"

namespace {

using bftfs::NodeId;
using bftfs::sim::Envelope;
namespace shim = bftfs::shim;
namespace sim = bftfs::sim;
using namespace fstest;

constexpr std::uint64_t kSeed = 0xF5E5;

// Four replicas, each with a small file service under its shim, and one client.
class FsCluster : public sim::Cluster {
 public:
  static constexpr NodeId kReplicas = 4;
  static constexpr NodeId kClient = kReplicas;

  FsCluster()
      : sim::Cluster(bftfs::testing::fifo_cluster(bftfs::testing::short_log_options(), 1, kSeed,
                                                  sim::shim_stack<FsService>([](SnapshotStore* store) {
                                                    return std::make_unique<FsService>(store, small_options());
                                                  }))) {
    start_all();
  }

  // Orders one compound request (no cross-request predicates) and returns the file service's result, once
  // f+1 matching committed replies (or 2f+1 matching ones) arrived.
  Result submit(const std::vector<Op>& ops) {
    const std::optional<Bytes> bytes =
        order(kClient, ++rid_, shim::encode_envelope({}, encode_request(bftfs::fs::Request{ops})), 3000);
    REQUIRE(bytes.has_value());
    shim::ShimResult sr;
    REQUIRE(shim::decode_envelope_result(*bytes, sr));
    REQUIRE(sr.status == shim::ShimStatus::kExecuted);
    Result r;
    REQUIRE(decode_result(sr.inner, r) == FsDecodeError::kOk);
    return r;
  }
  // Ticks until `done` holds or 3000 ticks passed; returns whether it holds.
  bool tick_until(const std::function<bool()>& done) { return sim::Cluster::tick_until(done, 3000); }
  FsService& inner(NodeId i) { return *stack<sim::ShimStack<FsService>>(i).inner; }
  std::uint64_t new_errors() const { return quiet_.new_errors(); }

 private:
  bftfs::testing::LogQuiet quiet_;
  std::uint64_t rid_ = 0;
};

constexpr NodeId kN = FsCluster::kReplicas;
constexpr NodeId kClient = FsCluster::kClient;

// What a replica's file system looks like from outside: a listing with attributes of the root and of "dir",
// and the bytes of "dir/file" (all read-only, straight from the service).
Bytes view(FsService& fs) {
  const Bytes req = encode_request(bftfs::fs::Request{{lookup(kRoot, "dir"), readdir(Handle::result_of(0), 0, 100),
                                                readdir(kRoot, 0, 100), lookup(Handle::result_of(0), "file"),
                                                read(Handle::result_of(3), 0, 200000)}});
  Bytes out;
  REQUIRE(fs.execute_read_only(kClient, req, out));
  return out;
}

}  // namespace

TEST_CASE("fs under the engine: replicas agree across state transfer and restart", "[fs][replica]") {
  FsCluster c;
  // Replica 3 is cut off while the others order enough to garbage-collect the log it would need.
  c.drop = [](const Envelope& p) { return p.to == 3 || p.from == 3; };
  Result r = c.submit({mkdir(kRoot, "dir"), create(Handle::result_of(0), "file")});
  REQUIRE(r.outcome == Outcome::kDone);
  const Handle file = r.results[1].attr.handle();
  for (std::uint64_t k = 0; k < 12; ++k) {
    r = c.submit({write(file, k * 10000, Bytes(10000, static_cast<std::uint8_t>(k + 1))),
                  create(kRoot, "f" + std::to_string(k))});
    REQUIRE(r.outcome == Outcome::kDone);
  }
  // A request that fails changes nothing, on every replica.
  r = c.submit({remove(kRoot, "f0"), rmdir(kRoot, "dir")});
  CHECK(r.outcome == Outcome::kOpFailed);
  REQUIRE(c.replica(0).stable_checkpoint() >= 8);
  REQUIRE(c.replica(3).last_executed() == 0);

  // Replica 3 catches up by state transfer of the file service's partitions.
  c.drop = nullptr;
  // Everything executed commits (the last batch's COMMITs may still wait for the next tick: piggybacking).
  const std::uint64_t target = c.replica(0).last_executed();
  REQUIRE(c.tick_until([&] { return c.replica(3).last_committed() == target; }));
  CHECK(c.replica(3).stats().state_transfers >= 1);
  CHECK(view(c.inner(3)) == view(c.inner(0)));
  CHECK(c.inner(3).check_invariants() == "");

  // Without replica 0, progress needs replica 3.
  c.drop = [](const Envelope& p) { return p.to == 0 || p.from == 0; };
  r = c.submit({truncate(file, 5000), write(file, 150000, std::string("end"))});
  CHECK(r.outcome == Outcome::kDone);
  c.drop = nullptr;

  // Replica 1 restarts from its records and snapshot store; then, without replica 2, it is needed again.
  c.crash(1);
  c.restart(1);
  const std::uint64_t now = c.replica(0).last_committed();
  REQUIRE(c.tick_until([&] { return c.replica(1).last_committed() >= now; }));
  c.drop = [](const Envelope& p) { return p.to == 2 || p.from == 2; };
  r = c.submit({getattr(file), read(file, 149990, 20)});
  REQUIRE(r.outcome == Outcome::kDone);
  CHECK(r.results[0].attr.size == 150003);
  CHECK(str(Bytes(r.results[1].data.end() - 3, r.results[1].data.end())) == "end");
  c.drop = nullptr;
  const std::uint64_t last = c.replica(0).last_committed();
  REQUIRE(c.tick_until([&] {
    for (NodeId i = 0; i < kN; ++i) {
      if (c.replica(i).last_committed() < last) return false;
    }
    return true;
  }));
  for (NodeId i = 1; i < kN; ++i) CHECK(view(c.inner(i)) == view(c.inner(0)));
  CHECK(c.new_errors() == 0);
}
