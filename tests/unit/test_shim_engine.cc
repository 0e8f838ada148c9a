// The shim under the real PBFT engine (protocol/replica.h): four replicas, each running Shim over
// CounterService, wired by delivering their effects in order. What the shim's own tests cannot show: that the
// engine's checkpoints, state transfer (over inner + shim partitions), tentative execution and recovery from its
// records all carry the predicate log, so every correct replica makes the same predicate decisions.
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
#include "services/counter_service.h"
#include "services/null_service.h"
#include "shim/envelope.h"
#include "shim/shim.h"

using namespace bftfs;
using namespace bftfs::shim;

namespace {

constexpr std::uint64_t kKeySeed = 0x5A1A;
constexpr NodeId kReplicas = 4;

struct Packet {
  NodeId from = 0;
  NodeId to = 0;
  Message message;
};

// One replica's process: its durable state (store, records) survives a crash, the objects do not.
struct Node {
  MemorySnapshotStore store;
  std::vector<PersistRecord> records;
  std::unique_ptr<CounterService> counter;
  std::unique_ptr<Shim> shim;
  std::unique_ptr<Replica> replica;
  bool up = false;
};

class ShimCluster {
 public:
  ShimCluster() : errors_at_start_(log_error_count()), level_(log_level()) {
    log_set_level(LogLevel::kError);
    opt_.n = kReplicas;
    opt_.f = 1;
    opt_.checkpoint_interval = 4;
    opt_.log_window = 8;
    opt_.client_window = 8;
    opt_.view_change_timeout_ticks = 100;
    opt_.view_change_timeout_ticks_max = 1000;
    opt_.status_interval_ticks = 20;
    opt_.fetch_retry_ticks = 10;
    std::map<NodeId, PublicKeys> pub;
    std::map<NodeId, SecretKeys> sec;
    for (NodeId id = 0; id < kReplicas + 2; ++id) generate_keys_from_seed(kKeySeed, id, pub[id], sec[id]);
    for (NodeId id = 0; id < kReplicas + 2; ++id) crypto_.push_back(std::make_unique<Crypto>(id, sec[id], pub));
    nodes_.resize(kReplicas);
    for (NodeId i = 0; i < kReplicas; ++i) boot(i);
  }
  ~ShimCluster() { log_set_level(level_); }

  std::uint64_t new_errors() const { return log_error_count() - errors_at_start_; }
  Node& node(NodeId i) { return nodes_[i]; }

  void crash(NodeId i) {
    Node& n = nodes_[i];
    n.replica.reset();  // in dependency order: the engine uses the shim, the shim the counter
    n.shim.reset();
    n.counter.reset();
    n.up = false;
  }
  void restart(NodeId i) {
    boot(i);
    nodes_[i].replica->recover(nodes_[i].records);
    flush(i);
  }

  // Delivers queued messages until none are left.
  void run() {
    while (!net_.empty()) {
      Packet p = std::move(net_.front());
      net_.pop_front();
      if (drop && drop(p)) continue;
      if (p.to >= kReplicas) {
        if (const auto* rep = std::get_if<Reply>(&p.message)) replies_[p.to].emplace_back(p.from, *rep);
        continue;
      }
      Node& n = nodes_[p.to];
      if (!n.up) continue;
      n.replica->on_message(p.from, p.message);
      flush(p.to);
    }
  }
  void tick() {
    for (NodeId i = 0; i < kReplicas; ++i) {
      if (!nodes_[i].up) continue;
      nodes_[i].replica->on_tick();
      flush(i);
    }
    run();
  }
  bool tick_until(const std::function<bool()>& done, int ticks_max = 3000) {
    for (int t = 0; t < ticks_max; ++t) {
      if (done()) return true;
      tick();
    }
    return done();
  }

  // Sends a predicated request of `client` to every replica and waits for the client's acceptance rule
  // (f+1 matching committed replies or 2f+1 matching ones, with a full result); returns the accepted bytes.
  Bytes submit(NodeId client, std::uint64_t request_id, const std::vector<Dependency>& deps, const Bytes& op) {
    Request req;
    req.client = client;
    req.request_id = request_id;
    req.op = encode_request(deps, op);
    const Digest d = req.digest();
    for (NodeId i = 0; i < kReplicas; ++i) req.authenticator.push_back(crypto_[client]->mac(i, d.bytes));
    for (NodeId i = 0; i < kReplicas; ++i) net_.push_back(Packet{client, i, req});
    run();
    std::optional<Bytes> result;
    REQUIRE(tick_until([&] { return (result = accepted(client, request_id)).has_value(); }));
    return *result;
  }

  ReplicaOptions opt_;
  std::function<bool(const Packet&)> drop;  // true: the packet is lost

 private:
  void boot(NodeId i) {
    Node& n = nodes_[i];
    n.counter = std::make_unique<CounterService>(&n.store);
    n.shim = std::make_unique<Shim>(*n.counter, &n.store);
    n.replica = std::make_unique<Replica>(opt_, i, *n.shim, *crypto_[i], kKeySeed + i);
    n.replica->set_wall_clock_ns(1'000'000);
    n.up = true;
  }

  void flush(NodeId i) {
    Node& n = nodes_[i];
    Effects e = n.replica->take_effects();
    for (PersistRecord& r : e.persist) n.records.push_back(std::move(r));
    for (Send& s : e.sends) {
      if (s.to == kAllReplicas) {
        for (NodeId j = 0; j < kReplicas; ++j) {
          if (j != i) net_.push_back(Packet{i, j, s.message});
        }
      } else {
        net_.push_back(Packet{i, s.to, std::move(s.message)});
      }
    }
    n.replica->check_invariants();
  }

  std::optional<Bytes> accepted(NodeId client, std::uint64_t request_id) const {
    auto it = replies_.find(client);
    if (it == replies_.end()) return std::nullopt;
    std::map<Digest, std::map<NodeId, bool>> committed_by;  // digest -> sender -> a committed reply seen
    std::map<Digest, Bytes> full;
    for (const auto& [from, rep] : it->second) {
      if (rep.request_id != request_id) continue;
      const bool committed = (rep.flags & (kReplyTentative | kReplyReadOnly)) == 0;
      committed_by[rep.result_digest][from] |= committed;
      if ((rep.flags & kReplyHasResult) != 0) full[rep.result_digest] = rep.result;
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
  LogLevel level_;
  std::vector<std::unique_ptr<Crypto>> crypto_;
  std::vector<Node> nodes_;
  std::deque<Packet> net_;
  std::map<NodeId, std::vector<std::pair<NodeId, Reply>>> replies_;
};

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
    const Bytes bytes = c.submit(id, ++rid, deps, counter_increment_op(token));
    ShimResult res;
    REQUIRE(decode_result(bytes, res));
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
  c.drop = [](const Packet& p) { return p.to == 3 || p.from == 3; };
  for (int k = 0; k < 6; ++k) CHECK(value_of(a.increment(c)) == static_cast<std::uint64_t>(k + 1));
  b.increment(c);
  // b speculated on a wrong reply: every correct replica turns its request into a no-op.
  const ShimResult wrong = b.increment(c, bogus_digest());
  CHECK(wrong.status == ShimStatus::kRetryPredicateFailed);
  b.last.reset();  // the client resubmits without the failed speculation
  CHECK(value_of(b.increment(c)) == 8);
  for (int k = 0; k < 6; ++k) a.increment(c);
  REQUIRE(c.node(0).replica->stable_checkpoint() >= 12);
  REQUIRE(c.node(3).replica->last_executed() == 0);

  // Replica 3 catches up by state transfer: the logs come with the checkpoint.
  c.drop = nullptr;
  const std::uint64_t target = c.node(0).replica->last_committed();
  REQUIRE(c.tick_until([&] { return c.node(3).replica->last_committed() == target; }));
  CHECK(c.node(3).replica->stats().state_transfers >= 1);
  for (std::uint64_t rid = 1; rid <= a.rid; ++rid) {
    CHECK(c.node(3).shim->logged_digest(a.id, rid) == c.node(0).shim->logged_digest(a.id, rid));
  }
  CHECK(c.node(3).shim->logged_digest(b.id, 2) == c.node(0).shim->logged_digest(b.id, 2));

  // Without replica 0, progress needs replica 3, whose log must hold a's last reply for the predicate to hold.
  c.drop = [](const Packet& p) { return p.to == 0 || p.from == 0; };
  const ShimResult via3 = a.increment(c);
  CHECK(via3.status == ShimStatus::kExecuted);
  c.drop = nullptr;

  // Replica 1 restarts from its records and store; then, without replica 2, it is needed again.
  c.crash(1);
  c.restart(1);
  const std::uint64_t now = c.node(0).replica->last_committed();
  REQUIRE(c.tick_until([&] { return c.node(1).replica->last_committed() >= now; }));
  c.drop = [](const Packet& p) { return p.to == 2 || p.from == 2; };
  CHECK(a.increment(c).status == ShimStatus::kExecuted);
  // And a stale prediction is still caught after all of that.
  CHECK(b.increment(c, bogus_digest()).status == ShimStatus::kRetryPredicateFailed);
  CHECK(c.new_errors() == 0);
}
