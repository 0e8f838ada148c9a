// The file service under the real PBFT engine (protocol/replica.h) and the PBFT-CS shim: four replicas, each
// running Shim over FsService, wired by delivering their effects in order. What the service's own tests cannot
// show: that the engine's tentative execution, checkpoints, state transfer over the file service's partitions
// and recovery from its records keep every correct replica's file system identical.
#include <catch2/catch.hpp>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "common/crypto.h"
#include "common/log.h"
#include "protocol/replica.h"
#include "services/null_service.h"
#include "shim/envelope.h"
#include "shim/shim.h"
#include "test_fs_util.h"

namespace {

using bftfs::Effects;
using bftfs::Message;
using bftfs::NodeId;
using bftfs::PersistRecord;
using bftfs::Replica;
using bftfs::ReplicaOptions;
namespace shim = bftfs::shim;
using namespace fstest;

constexpr std::uint64_t kSeed = 0xF5E5;
constexpr NodeId kN = 4;
constexpr NodeId kClient = kN;

struct Packet {
  NodeId from = 0;
  NodeId to = 0;
  Message message;
};

// A replica process: the snapshot store and the records survive a crash; the objects do not.
struct FsNode {
  bftfs::MemorySnapshotStore store;
  std::vector<PersistRecord> records;
  std::unique_ptr<FsService> fs;
  std::unique_ptr<shim::Shim> shim;
  std::unique_ptr<Replica> replica;
  bool up = false;
};

class FsCluster {
 public:
  FsCluster() : errors_at_start_(bftfs::log_error_count()), level_(bftfs::log_level()) {
    bftfs::log_set_level(bftfs::LogLevel::kError);
    opt_.n = kN;
    opt_.f = 1;
    opt_.checkpoint_interval = 4;
    opt_.log_window = 8;
    opt_.client_window = 8;
    opt_.view_change_timeout_ticks = 100;
    opt_.view_change_timeout_ticks_max = 1000;
    opt_.status_interval_ticks = 20;
    opt_.fetch_retry_ticks = 10;
    std::map<NodeId, bftfs::PublicKeys> pub;
    std::map<NodeId, bftfs::SecretKeys> sec;
    for (NodeId id = 0; id <= kClient; ++id) bftfs::generate_keys_from_seed(kSeed, id, pub[id], sec[id]);
    for (NodeId id = 0; id <= kClient; ++id) crypto_.push_back(std::make_unique<bftfs::Crypto>(id, sec[id], pub));
    nodes_.resize(kN);
    for (NodeId i = 0; i < kN; ++i) boot(i);
  }
  ~FsCluster() { bftfs::log_set_level(level_); }

  std::uint64_t new_errors() const { return bftfs::log_error_count() - errors_at_start_; }
  FsNode& node(NodeId i) { return nodes_[i]; }

  void crash(NodeId i) {
    FsNode& n = nodes_[i];
    n.replica.reset();  // the engine uses the shim, the shim the file service
    n.shim.reset();
    n.fs.reset();
    n.up = false;
  }
  void restart(NodeId i) {
    boot(i);
    nodes_[i].replica->recover(nodes_[i].records);
    flush(i);
  }

  void run() {
    while (!net_.empty()) {
      Packet p = std::move(net_.front());
      net_.pop_front();
      if (drop && drop(p)) continue;
      if (p.to >= kN) {
        if (const auto* rep = std::get_if<bftfs::Reply>(&p.message)) replies_.emplace_back(p.from, *rep);
        continue;
      }
      FsNode& n = nodes_[p.to];
      if (!n.up) continue;
      n.replica->on_message(p.from, p.message);
      flush(p.to);
    }
  }
  bool tick_until(const std::function<bool()>& done, int ticks_max = 3000) {
    for (int t = 0; t < ticks_max; ++t) {
      if (done()) return true;
      for (NodeId i = 0; i < kN; ++i) {
        if (!nodes_[i].up) continue;
        nodes_[i].replica->on_tick();
        flush(i);
      }
      run();
    }
    return done();
  }

  // Orders one compound request (no cross-request predicates) and returns the file service's result, once
  // f+1 matching committed replies (or 2f+1 matching ones) arrived.
  Result submit(const std::vector<Op>& ops) {
    bftfs::Request req;
    req.client = kClient;
    req.request_id = ++rid_;
    req.op = shim::encode_request({}, encode_request(bftfs::fs::Request{ops}));
    const Digest d = req.digest();
    for (NodeId i = 0; i < kN; ++i) req.authenticator.push_back(crypto_[kClient]->mac(i, d.bytes));
    for (NodeId i = 0; i < kN; ++i) net_.push_back(Packet{kClient, i, req});
    run();
    std::optional<Bytes> bytes;
    REQUIRE(tick_until([&] { return (bytes = accepted(rid_)).has_value(); }));
    shim::ShimResult sr;
    REQUIRE(shim::decode_result(*bytes, sr));
    REQUIRE(sr.status == shim::ShimStatus::kExecuted);
    Result r;
    REQUIRE(decode_result(sr.inner, r) == FsDecodeError::kOk);
    return r;
  }

  std::function<bool(const Packet&)> drop;  // true: the packet is lost
  ReplicaOptions opt_;

 private:
  void boot(NodeId i) {
    FsNode& n = nodes_[i];
    n.fs = std::make_unique<FsService>(&n.store, small_options());
    n.shim = std::make_unique<shim::Shim>(*n.fs, &n.store);
    n.replica = std::make_unique<Replica>(opt_, i, *n.shim, *crypto_[i], kSeed + i);
    n.replica->set_wall_clock_ns(1'000'000);
    n.up = true;
  }

  void flush(NodeId i) {
    FsNode& n = nodes_[i];
    Effects e = n.replica->take_effects();
    for (PersistRecord& r : e.persist) n.records.push_back(std::move(r));
    for (bftfs::Send& s : e.sends) {
      if (s.to == bftfs::kAllReplicas) {
        for (NodeId j = 0; j < kN; ++j) {
          if (j != i) net_.push_back(Packet{i, j, s.message});
        }
      } else {
        net_.push_back(Packet{i, s.to, std::move(s.message)});
      }
    }
    n.replica->check_invariants();
  }

  std::optional<Bytes> accepted(std::uint64_t request_id) const {
    std::map<Digest, std::map<NodeId, bool>> committed_by;
    std::map<Digest, Bytes> full;
    for (const auto& [from, rep] : replies_) {
      if (rep.request_id != request_id) continue;
      const bool committed = (rep.flags & (bftfs::kReplyTentative | bftfs::kReplyReadOnly)) == 0;
      committed_by[rep.result_digest][from] |= committed;
      if ((rep.flags & bftfs::kReplyHasResult) != 0) full[rep.result_digest] = rep.result;
    }
    for (const auto& [digest, senders] : committed_by) {
      std::uint32_t strong = 0;
      for (const auto& [from, committed] : senders) strong += committed ? 1 : 0;
      const bool enough = strong >= opt_.f + 1 || senders.size() >= 2 * opt_.f + 1;
      if (enough && full.count(digest) != 0) return full.at(digest);
    }
    return std::nullopt;
  }

  std::uint64_t errors_at_start_;
  bftfs::LogLevel level_;
  std::vector<std::unique_ptr<bftfs::Crypto>> crypto_;
  std::vector<FsNode> nodes_;
  std::deque<Packet> net_;
  std::vector<std::pair<NodeId, bftfs::Reply>> replies_;
  std::uint64_t rid_ = 0;
};

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
  c.drop = [](const Packet& p) { return p.to == 3 || p.from == 3; };
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
  REQUIRE(c.node(0).replica->stable_checkpoint() >= 8);
  REQUIRE(c.node(3).replica->last_executed() == 0);

  // Replica 3 catches up by state transfer of the file service's partitions.
  c.drop = nullptr;
  const std::uint64_t target = c.node(0).replica->last_committed();
  REQUIRE(c.tick_until([&] { return c.node(3).replica->last_committed() == target; }));
  CHECK(c.node(3).replica->stats().state_transfers >= 1);
  CHECK(view(*c.node(3).fs) == view(*c.node(0).fs));
  CHECK(c.node(3).fs->check_invariants() == "");

  // Without replica 0, progress needs replica 3.
  c.drop = [](const Packet& p) { return p.to == 0 || p.from == 0; };
  r = c.submit({truncate(file, 5000), write(file, 150000, std::string("end"))});
  CHECK(r.outcome == Outcome::kDone);
  c.drop = nullptr;

  // Replica 1 restarts from its records and snapshot store; then, without replica 2, it is needed again.
  c.crash(1);
  c.restart(1);
  const std::uint64_t now = c.node(0).replica->last_committed();
  REQUIRE(c.tick_until([&] { return c.node(1).replica->last_committed() >= now; }));
  c.drop = [](const Packet& p) { return p.to == 2 || p.from == 2; };
  r = c.submit({getattr(file), read(file, 149990, 20)});
  REQUIRE(r.outcome == Outcome::kDone);
  CHECK(r.results[0].attr.size == 150003);
  CHECK(str(Bytes(r.results[1].data.end() - 3, r.results[1].data.end())) == "end");
  c.drop = nullptr;
  const std::uint64_t last = c.node(0).replica->last_committed();
  REQUIRE(c.tick_until([&] {
    for (NodeId i = 0; i < kN; ++i) {
      if (c.node(i).replica->last_committed() < last) return false;
    }
    return true;
  }));
  for (NodeId i = 1; i < kN; ++i) CHECK(view(*c.node(i).fs) == view(*c.node(0).fs));
  CHECK(c.new_errors() == 0);
}
