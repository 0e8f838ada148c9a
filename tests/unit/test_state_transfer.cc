// State transfer (TOCS §5.3.2): a StateFetcher against serving replicas built from real counter services.
#include <catch2/catch.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/crypto.h"
#include "protocol/state_transfer.h"
#include "services/counter_service.h"

using namespace bftfs;

namespace {

constexpr std::uint32_t kN = 4;

// Increments by `clients` at seqs first..last, with each client following its tokens. Deterministic, so
// services driven by the same calls reach the same state.
void drive(CounterService& s, std::uint64_t first, std::uint64_t last, const std::vector<NodeId>& clients) {
  for (std::uint64_t seq = first; seq <= last; ++seq) {
    const NodeId c = clients[seq % clients.size()];
    ExecContext ctx;
    ctx.seq = seq;
    ctx.client = c;
    // Ask for the expected token with a read, then increment with it.
    Bytes out;
    REQUIRE(s.execute_read_only(c, counter_read_op(), out));
    CounterResult r;
    REQUIRE(parse_counter_result(out, r));
    REQUIRE(parse_counter_result(s.execute(ctx, counter_increment_op(r.next_token)), r));
    REQUIRE(r.status == 0);
  }
}

// One serving replica: a service with retained checkpoints and a client table per checkpoint.
struct Server {
  CounterService service{nullptr};
  std::map<std::uint64_t, Bytes> client_tables;
  bool silent = false;
  // Rewrites answers before they are delivered (a Byzantine server).
  std::function<void(Message&)> corrupt;

  Digest checkpoint(std::uint64_t seq) {
    const CheckpointId id = service.checkpoint(seq);
    client_tables[seq] = Bytes{'c', 't', static_cast<std::uint8_t>(seq)};
    return checkpoint_digest(seq, id.digest, digest_of(client_tables[seq]));
  }

  std::optional<Message> serve(const FetchState& req) {
    if (silent) return std::nullopt;
    auto it = client_tables.find(req.checkpoint_seq);
    if (it == client_tables.end()) return std::nullopt;
    auto answer = serve_fetch_state(req, service, req.checkpoint_seq, it->second);
    if (answer && corrupt) corrupt(*answer);
    return answer;
  }
};

struct Harness {
  Prng prng{7};
  StateFetcher fetcher{kN, 0, 10, prng};
  std::vector<std::unique_ptr<Server>> servers;  // index = replica id; [0] is the fetcher's own service
  std::vector<std::pair<NodeId, Message>> in_flight;
  std::map<NodeId, std::uint64_t> asked;

  Harness() {
    for (NodeId r = 0; r < kN; ++r) servers.push_back(std::make_unique<Server>());
  }

  // Moves the fetcher's requests to the servers and their answers into in_flight.
  void route() {
    for (Send& s : fetcher.take_sends()) {
      REQUIRE(s.to != 0);  // never itself
      REQUIRE(s.to < kN);
      ++asked[s.to];
      const auto& req = std::get<FetchState>(s.message);
      if (auto answer = servers[s.to]->serve(req)) in_flight.emplace_back(s.to, std::move(*answer));
    }
  }

  void deliver_all() {
    auto batch = std::move(in_flight);
    in_flight.clear();
    for (auto& [from, m] : batch) deliver(from, m);
  }

  void deliver(NodeId from, const Message& m) {
    if (const auto* node = std::get_if<StateNode>(&m)) fetcher.on_state_node(from, *node);
    if (const auto* leaf = std::get_if<StateLeaf>(&m)) fetcher.on_state_leaf(from, *leaf);
  }

  // Runs until the fetcher completes (or gives up after `ticks_max` ticks).
  std::optional<FetchedState> run(std::uint64_t ticks_max = 1000) {
    for (std::uint64_t t = 0; t < ticks_max; ++t) {
      route();
      deliver_all();
      route();
      if (auto result = fetcher.take_result()) return result;
      fetcher.on_tick();
    }
    return std::nullopt;
  }
};

// Installs a fetched state into `s` and returns the checkpoint digest it now has.
Digest install(CounterService& s, const FetchedState& f) {
  s.begin_install(f.seq);
  for (const auto& [index, data] : f.partitions) s.install_partition(index, data);
  const CheckpointId id = s.finish_install(f.seq);
  return checkpoint_digest(id.seq, id.digest, digest_of(f.client_table));
}

const std::vector<NodeId> kClients = {10, 11, 12};
const std::vector<NodeId> kMoreClients = {10, 11, 12, 13, 300};

}  // namespace

TEST_CASE("serve_fetch_state answers the meta node, inner nodes, leaves and the client table") {
  Server s;
  drive(s.service, 1, 5, kClients);
  const Digest target = s.checkpoint(5);
  const PartitionTree& tree = s.service.checkpoint_tree(5);
  const Bytes& ct = s.client_tables[5];

  auto meta = serve_fetch_state(FetchState{5, 0, 0}, s.service, 5, ct);
  REQUIRE(meta);
  const auto& m = std::get<StateNode>(*meta);
  REQUIRE(m.children.size() == 2);
  CHECK(checkpoint_digest(5, m.children[0], m.children[1]) == target);

  auto root = serve_fetch_state(FetchState{5, 1, 0}, s.service, 5, ct);
  REQUIRE(root);
  CHECK(PartitionTree::combine(0, 0, std::get<StateNode>(*root).children) == m.children[0]);

  const std::uint32_t leaf_level = tree.depth() + 1;
  auto leaf = serve_fetch_state(FetchState{5, leaf_level, 0}, s.service, 5, ct);
  REQUIRE(leaf);
  CHECK(PartitionTree::leaf_digest(0, std::get<StateLeaf>(*leaf).data) == tree.leaf(0));
  auto table = serve_fetch_state(FetchState{5, leaf_level, kClientTableLeaf}, s.service, 5, ct);
  REQUIRE(table);
  CHECK(std::get<StateLeaf>(*table).data == ct);

  // Out of range or not retained: no answer.
  CHECK_FALSE(serve_fetch_state(FetchState{4, 0, 0}, s.service, 5, ct));
  CHECK_FALSE(serve_fetch_state(FetchState{5, 0, 1}, s.service, 5, ct));
  CHECK_FALSE(serve_fetch_state(FetchState{5, 1, 1}, s.service, 5, ct));
  CHECK_FALSE(serve_fetch_state(FetchState{5, leaf_level, kCounterPartitions}, s.service, 5, ct));
  CHECK_FALSE(serve_fetch_state(FetchState{5, leaf_level + 1, 0}, s.service, 5, ct));
  CHECK_FALSE(serve_fetch_state(FetchState{5, 0xFFFFFFFFu, 0}, s.service, 5, ct));
}

TEST_CASE("state fetcher transfers only the partitions that differ and installs the target") {
  Harness h;
  // Everyone executed 1..4 and checkpointed; the servers went on to 20, the fetcher did not.
  for (auto& s : h.servers) {
    drive(s->service, 1, 4, kClients);
    s->checkpoint(4);
  }
  Digest target;
  for (NodeId r = 1; r < kN; ++r) {
    drive(h.servers[r]->service, 5, 20, kMoreClients);
    target = h.servers[r]->checkpoint(20);
  }
  CounterService& local = h.servers[0]->service;
  const PartitionTree& local_tree = local.checkpoint_tree(4);
  std::size_t differing = 0;
  for (std::uint64_t i = 0; i < kCounterPartitions; ++i) {
    if (local_tree.leaf(i) != h.servers[1]->service.checkpoint_tree(20).leaf(i)) ++differing;
  }
  REQUIRE(differing == 6);  // the value and the slices of the five clients

  h.fetcher.start(20, target, &local_tree, kCounterPartitions);
  CHECK(h.fetcher.active());
  CHECK(h.fetcher.target_seq() == 20);
  auto result = h.run();
  REQUIRE(result);
  CHECK_FALSE(h.fetcher.active());
  CHECK(result->seq == 20);
  CHECK(result->checkpoint_digest == target);
  CHECK(result->partitions.size() == differing);
  CHECK(result->client_table == h.servers[1]->client_tables[20]);
  CHECK(h.fetcher.rejected() == 0);
  // Meta, root, 6 leaves, client table: nothing else was asked for.
  CHECK(h.fetcher.requests_sent() == 1 + 1 + differing + 1);
  // The requests were spread over the three peers.
  CHECK(h.asked.size() == 3);

  CHECK(install(local, *result) == target);
  CHECK(local.value() == 20);
  CHECK_FALSE(h.fetcher.take_result());  // once
}

TEST_CASE("state fetcher without a local tree fetches every partition") {
  Harness h;
  Digest target;
  for (NodeId r = 1; r < kN; ++r) {
    drive(h.servers[r]->service, 1, 3, kClients);
    target = h.servers[r]->checkpoint(3);
  }
  h.fetcher.start(3, target, nullptr, kCounterPartitions);
  auto result = h.run();
  REQUIRE(result);
  CHECK(result->partitions.size() == kCounterPartitions);
  CounterService fresh(nullptr);
  CHECK(install(fresh, *result) == target);
}

TEST_CASE("state fetcher rejects a Byzantine server's wrong leaf and completes from another") {
  Harness h;
  Digest target;
  for (NodeId r = 1; r < kN; ++r) {
    drive(h.servers[r]->service, 1, 10, kMoreClients);
    target = h.servers[r]->checkpoint(10);
  }
  // Replica 1 flips a byte of every leaf and lies about one child of every inner node.
  h.servers[1]->corrupt = [](Message& m) {
    if (auto* leaf = std::get_if<StateLeaf>(&m)) {
      if (leaf->data.empty()) leaf->data.push_back(0);
      leaf->data[0] ^= 0x01;
    }
    if (auto* node = std::get_if<StateNode>(&m); node && node->level > 0) node->children[0].bytes[0] ^= 0x01;
  };
  CounterService& local = h.servers[0]->service;
  local.checkpoint(0);
  h.fetcher.start(10, target, &local.checkpoint_tree(0), kCounterPartitions);
  auto result = h.run();
  REQUIRE(result);
  CHECK(h.fetcher.rejected() > 0);
  CHECK(install(local, *result) == target);
  CHECK(local.value() == 10);
}

TEST_CASE("state fetcher rejects a meta node that does not match the agreed digest") {
  Harness h;
  Digest target;
  for (NodeId r = 1; r < kN; ++r) {
    drive(h.servers[r]->service, 1, 2, kClients);
    target = h.servers[r]->checkpoint(2);
  }
  // Two servers lie about the meta node; one correct server suffices.
  for (NodeId r : {1u, 2u}) {
    h.servers[r]->corrupt = [](Message& m) {
      if (auto* node = std::get_if<StateNode>(&m); node && node->level == 0) node->children[1].bytes[3] ^= 0x80;
    };
  }
  h.fetcher.start(2, target, nullptr, kCounterPartitions);
  auto result = h.run();
  REQUIRE(result);
  CHECK(h.fetcher.rejected() >= 1);
  CHECK(result->client_table == h.servers[3]->client_tables[2]);
}

TEST_CASE("state fetcher retries a silent server after the retry timeout with another replica") {
  Harness h;
  Digest target;
  for (NodeId r = 1; r < kN; ++r) {
    drive(h.servers[r]->service, 1, 6, kClients);
    target = h.servers[r]->checkpoint(6);
  }
  h.servers[1]->silent = true;
  h.servers[2]->silent = true;
  h.fetcher.start(6, target, nullptr, kCounterPartitions);
  auto result = h.run();
  REQUIRE(result);
  CHECK(result->partitions.size() == kCounterPartitions);
  CHECK(h.asked[3] > 0);
  CHECK(h.fetcher.requests_sent() > kCounterPartitions + 3);  // some requests went to silent replicas first
}

TEST_CASE("state fetcher ignores unsolicited, duplicate and stale answers") {
  Harness h;
  Digest target;
  for (NodeId r = 1; r < kN; ++r) {
    drive(h.servers[r]->service, 1, 3, kClients);
    target = h.servers[r]->checkpoint(3);
  }
  // Before start: nothing is outstanding.
  h.fetcher.on_state_leaf(1, StateLeaf{3, 0, Bytes{1}});
  CHECK(h.fetcher.ignored() == 1);

  h.fetcher.start(3, target, nullptr, kCounterPartitions);
  h.route();
  REQUIRE(h.in_flight.size() == 1);  // just the meta node so far
  const auto meta = h.in_flight.front();
  h.deliver_all();
  h.deliver(meta.first, meta.second);  // duplicate
  CHECK(h.fetcher.ignored() == 2);
  h.fetcher.on_state_node(2, StateNode{3, 1, 5, {}});  // never asked
  h.fetcher.on_state_leaf(2, StateLeaf{99, 0, {}});     // another checkpoint
  CHECK(h.fetcher.ignored() == 4);
  CHECK(h.fetcher.rejected() == 0);
  REQUIRE(h.run());
}

TEST_CASE("state fetcher restarts with a newer target and ignores answers for the old one") {
  Harness h;
  Digest old_target;
  for (NodeId r = 1; r < kN; ++r) {
    drive(h.servers[r]->service, 1, 5, kClients);
    old_target = h.servers[r]->checkpoint(5);
  }
  CounterService& local = h.servers[0]->service;
  local.checkpoint(0);
  h.fetcher.start(5, old_target, &local.checkpoint_tree(0), kCounterPartitions);
  // A few rounds, not to completion.
  h.route();
  h.deliver_all();
  h.route();
  REQUIRE_FALSE(h.in_flight.empty());
  auto stale = std::move(h.in_flight);
  h.in_flight.clear();

  // Meanwhile the cluster moved on to checkpoint 9.
  Digest new_target;
  for (NodeId r = 1; r < kN; ++r) {
    drive(h.servers[r]->service, 6, 9, kMoreClients);
    new_target = h.servers[r]->checkpoint(9);
  }
  h.fetcher.start(9, new_target, &local.checkpoint_tree(0), kCounterPartitions);
  CHECK(h.fetcher.target_seq() == 9);
  const std::uint64_t ignored_before = h.fetcher.ignored();
  for (auto& [from, m] : stale) h.deliver(from, m);
  CHECK(h.fetcher.ignored() == ignored_before + stale.size());

  auto result = h.run();
  REQUIRE(result);
  CHECK(result->seq == 9);
  CHECK(install(local, *result) == new_target);
  CHECK(local.value() == 9);
}
