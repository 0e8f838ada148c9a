// An in-process cluster for the engine tests (tests/unit/test_*_engine.cc): four replicas, each running the real
// PBFT engine (protocol/replica.h) over the PBFT-CS shim over an inner service, wired by delivering their effects
// in order through one packet queue. Clients are node ids from kReplicas on; their replies are collected per
// client and accepted by the speculating client's rule. The cluster owns the log level (ERROR only, restored on
// destruction) and counts the ERROR lines logged while it lives.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <variant>
#include <vector>

#include "common/crypto.h"
#include "common/log.h"
#include "protocol/replica.h"
#include "services/null_service.h"
#include "shim/shim.h"

namespace bftfs::testing {

// One message in flight between two nodes (replicas or clients).
struct Packet {
  NodeId from = 0;
  NodeId to = 0;
  Message message;
};

// One replica's process: its durable state (store, records) survives a crash; the objects do not.
template <typename Inner>
struct EngineNode {
  MemorySnapshotStore store;
  std::vector<PersistRecord> records;
  std::unique_ptr<Inner> inner;
  std::unique_ptr<shim::Shim> shim;
  std::unique_ptr<Replica> replica;
  bool up = false;
};

// Four replicas (f = 1) with a short checkpoint interval and log window, so a few requests are enough to garbage-
// collect the log and force state transfer. `make_inner` builds a node's inner service over its snapshot store, at
// boot and at every restart; `clients` is how many client ids (kReplicas, kReplicas + 1, ...) get keys.
template <typename Inner>
class EngineCluster {
 public:
  static constexpr NodeId kReplicas = 4;
  using Node = EngineNode<Inner>;
  using Factory = std::function<std::unique_ptr<Inner>(SnapshotStore*)>;
  using Replies = std::vector<std::pair<NodeId, Reply>>;  // (sender, reply) in arrival order

  EngineCluster(std::uint64_t key_seed, NodeId clients, Factory make_inner)
      : key_seed_(key_seed),
        make_inner_(std::move(make_inner)),
        errors_at_start_(log_error_count()),
        level_(log_level()) {
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
    for (NodeId id = 0; id < kReplicas + clients; ++id) generate_keys_from_seed(key_seed_, id, pub[id], sec[id]);
    for (NodeId id = 0; id < kReplicas + clients; ++id) crypto_.push_back(std::make_unique<Crypto>(id, sec[id], pub));
    nodes_.resize(kReplicas);
    for (NodeId i = 0; i < kReplicas; ++i) boot(i);
  }
  ~EngineCluster() { log_set_level(level_); }
  EngineCluster(const EngineCluster&) = delete;
  EngineCluster& operator=(const EngineCluster&) = delete;

  // ERROR lines logged since the cluster was built.
  std::uint64_t new_errors() const { return log_error_count() - errors_at_start_; }
  Node& node(NodeId i) { return nodes_[i]; }

  // Destroys replica i's objects; its store and records stay.
  void crash(NodeId i) {
    Node& n = nodes_[i];
    n.replica.reset();  // in dependency order: the engine uses the shim, the shim the inner service
    n.shim.reset();
    n.inner.reset();
    n.up = false;
  }
  // Builds replica i again and recovers it from its records (its store is what the inner service and shim reopen).
  void restart(NodeId i) {
    boot(i);
    nodes_[i].replica->recover(nodes_[i].records);
    flush(i);
  }

  // Delivers queued messages until none are left; a packet for a client is kept as that client's reply.
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
  // One tick on every replica that is up, then delivery of everything it caused.
  void tick() {
    for (NodeId i = 0; i < kReplicas; ++i) {
      if (!nodes_[i].up) continue;
      nodes_[i].replica->on_tick();
      flush(i);
    }
    run();
  }
  // Ticks until `done` holds or ticks_max ticks passed; returns whether it holds.
  bool tick_until(const std::function<bool()>& done, int ticks_max = 3000) {
    for (int t = 0; t < ticks_max; ++t) {
      if (done()) return true;
      tick();
    }
    return done();
  }

  // Sends request `request_id` of `client` with operation `op` (already a shim envelope), authenticated for every
  // replica, to every replica, and delivers what follows.
  void send_request(NodeId client, std::uint64_t request_id, const Bytes& op) {
    Request req;
    req.client = client;
    req.request_id = request_id;
    req.op = op;
    const Digest d = req.digest();
    for (NodeId i = 0; i < kReplicas; ++i) req.authenticator.push_back(crypto_[client]->mac(i, d.bytes));
    for (NodeId i = 0; i < kReplicas; ++i) net_.push_back(Packet{client, i, req});
    run();
  }

  // Sends a request and ticks until the client accepts a result; returns the accepted bytes.
  Bytes order(NodeId client, std::uint64_t request_id, const Bytes& op) {
    send_request(client, request_id, op);
    std::optional<Bytes> result;
    REQUIRE(tick_until([&] { return (result = accepted(client, request_id)).has_value(); }));
    return *result;
  }

  // Every reply `client` received so far.
  const Replies& replies(NodeId client) { return replies_[client]; }

  // The client's acceptance rule: f+1 matching committed replies or 2f+1 matching ones, one of which carries the
  // full result; nullopt while no result meets it.
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

  std::function<bool(const Packet&)> drop;  // true: the packet is lost

 private:
  void boot(NodeId i) {
    Node& n = nodes_[i];
    n.inner = make_inner_(&n.store);
    n.shim = std::make_unique<shim::Shim>(*n.inner, &n.store);
    n.replica = std::make_unique<Replica>(opt_, i, *n.shim, *crypto_[i], key_seed_ + i);
    n.replica->set_wall_clock_ns(1'000'000);
    n.up = true;
  }

  // Takes replica i's effects: records to its durable list, sends to the queue; then checks its invariants.
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

  std::uint64_t key_seed_;
  Factory make_inner_;
  std::uint64_t errors_at_start_;
  LogLevel level_;
  ReplicaOptions opt_;
  std::vector<std::unique_ptr<Crypto>> crypto_;
  std::vector<Node> nodes_;
  std::deque<Packet> net_;
  std::map<NodeId, Replies> replies_;
};

}  // namespace bftfs::testing
