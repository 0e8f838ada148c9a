// The PBFT replica core on a small in-process cluster: four replicas (f = 1) running the counter service, wired
// together by delivering their Effects in order. The harness can drop messages by rule, crash a replica and
// restart it from the records it persisted, and tick time; it checks every replica's invariants after every
// delivery. (The randomized whole-cluster simulator lives in sim/; this harness stays small on purpose.)
#include <catch2/catch.hpp>

#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "common/crypto.h"
#include "common/log.h"
#include "protocol/replica.h"
#include "services/counter_service.h"
#include "services/null_service.h"

using namespace bftfs;

namespace {

constexpr std::uint64_t kSeed = 20261122;

struct Envelope {
  NodeId from = 0;
  NodeId to = 0;
  Message message;
};

template <typename T>
bool is(const Envelope& e) {
  return std::holds_alternative<T>(e.message);
}

// Quiets INFO/WARN lines of the replicas under test and remembers the ERROR count, which must not grow.
class LogQuiet {
 public:
  LogQuiet() : level_(log_level()), errors_(log_error_count()) {
    // BFTFS_TEST_VERBOSE=1 shows the replicas' INFO lines when a test needs debugging.
    log_set_level(std::getenv("BFTFS_TEST_VERBOSE") != nullptr ? LogLevel::kInfo : LogLevel::kError);
  }
  ~LogQuiet() { log_set_level(level_); }
  std::uint64_t new_errors() const { return log_error_count() - errors_; }

 private:
  LogLevel level_;
  std::uint64_t errors_;
};

class Cluster {
 public:
  explicit Cluster(ReplicaOptions options, std::uint32_t clients = 2) : opt(options), n(options.n) {
    for (NodeId i = 0; i < n + clients; i++) {
      PublicKeys pub;
      SecretKeys sec;
      generate_keys_from_seed(kSeed, i, pub, sec);
      pubs[i] = pub;
      secs[i] = sec;
      if (i >= n) client_ids.push_back(i);
    }
    for (NodeId i = 0; i < n + clients; i++) cryptos.push_back(std::make_unique<Crypto>(i, secs[i], pubs));
    for (NodeId i = 0; i < n; i++) {
      stores.push_back(std::make_unique<MemorySnapshotStore>());
      services.emplace_back();
      replicas.emplace_back();
      wal.emplace_back();
      up.push_back(true);
      start(i);
    }
    for (NodeId c : client_ids) token[c] = counter_initial_token(c);
  }

  Replica& r(NodeId i) { return *replicas[i]; }
  CounterService& service(NodeId i) { return *services[i]; }

  // ---- lifecycle ----
  void crash(NodeId i) {
    replicas[i].reset();
    services[i].reset();
    up[i] = false;
  }
  void restart(NodeId i) {
    up[i] = true;
    start(i);
    replicas[i]->recover(wal[i]);
    drain(i);
    replicas[i]->check_invariants();
  }

  // ---- message flow ----
  void drain(NodeId i) {
    Effects e = replicas[i]->take_effects();
    for (auto& p : e.persist) wal[i].push_back(std::move(p));
    for (auto& s : e.sends) {
      if (s.to == kAllReplicas) {
        for (NodeId j = 0; j < n; j++) {
          if (j != i) queue.push_back(Envelope{i, j, s.message});
        }
      } else {
        queue.push_back(Envelope{i, s.to, std::move(s.message)});
      }
    }
  }
  void step() {
    Envelope env = std::move(queue.front());
    queue.pop_front();
    if (drop && drop(env)) return;
    if (env.to >= n) {
      if (auto* rep = std::get_if<Reply>(&env.message)) inbox[env.to].emplace_back(env.from, *rep);
      return;
    }
    if (!up[env.to]) return;
    delivered.push_back(Envelope{env.from, env.to, env.message});
    replicas[env.to]->on_message(env.from, env.message);
    drain(env.to);
    replicas[env.to]->check_invariants();
  }
  void run(std::size_t max_steps = 1000000) {
    while (!queue.empty() && max_steps-- > 0) step();
    REQUIRE(queue.empty());
  }
  void tick(std::uint64_t ticks = 1) {
    for (std::uint64_t t = 0; t < ticks; t++) {
      for (NodeId i = 0; i < n; i++) {
        if (!up[i]) continue;
        replicas[i]->on_tick();
        drain(i);
        replicas[i]->check_invariants();
      }
      run();
    }
  }
  // Ticks until `done` holds (checked after every tick); false after `max_ticks`.
  bool tick_until(const std::function<bool()>& done, std::uint64_t max_ticks = 20000) {
    for (std::uint64_t t = 0; t < max_ticks; t++) {
      if (done()) return true;
      tick();
    }
    return done();
  }

  // ---- clients ----
  Request make_request(NodeId client, std::uint64_t id, Bytes op, bool read_only = false,
                       NodeId replier = kReplierAll) {
    Request req;
    req.client = client;
    req.request_id = id;
    req.flags = read_only ? kRequestReadOnly : 0;
    req.replier = replier;
    req.op = std::move(op);
    const Digest d = req.digest();
    for (NodeId i = 0; i < n; i++) req.authenticator.push_back(cryptos[client]->mac(i, d.bytes));
    return req;
  }
  // The next increment of `client` with the token it holds.
  Request increment(NodeId client) {
    Request req = make_request(client, ++next_id[client], counter_increment_op(token[client]));
    sent[{client, req.request_id}] = req;
    return req;
  }
  void send(const Request& req, NodeId to) { queue.push_back(Envelope{req.client, to, req}); }
  void send_all(const Request& req) {
    for (NodeId i = 0; i < n; i++) send(req, i);
  }
  // The client's acceptance rule (protocol/client.h): f+1 matching non-tentative replies, or 2f+1 matching. A
  // speculative reply (an early or quiet primary's) gives the result but is no vote.
  std::optional<Bytes> accepted(NodeId client, std::uint64_t id) {
    std::map<Digest, std::map<NodeId, bool>> tentative_by_digest;
    std::map<Digest, Bytes> full;
    for (const auto& [from, rep] : inbox[client]) {
      if (rep.request_id != id) continue;
      if ((rep.flags & kReplySpeculative) != 0) {
        if ((rep.flags & kReplyHasResult) != 0) full[rep.result_digest] = rep.result;
        continue;
      }
      const bool weak = (rep.flags & (kReplyTentative | kReplyReadOnly)) != 0;
      auto& senders = tentative_by_digest[rep.result_digest];
      auto it = senders.find(from);
      senders[from] = it == senders.end() ? weak : (it->second && weak);
      if ((rep.flags & kReplyHasResult) != 0) {
        REQUIRE(digest_of(rep.result) == rep.result_digest);
        full[rep.result_digest] = rep.result;
      }
    }
    for (const auto& [d, senders] : tentative_by_digest) {
      std::size_t strong = 0;
      for (const auto& [from, weak] : senders) strong += weak ? 0 : 1;
      if ((strong >= opt.f + 1 || senders.size() >= 2 * opt.f + 1) && full.count(d) != 0) return full[d];
    }
    return std::nullopt;
  }
  // Runs and ticks until the request is accepted; updates the client's token from a counter result.
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
    send(req, static_cast<NodeId>(view % n));
    run();
    if (!accepted(client, req.request_id)) send_all(req);
    return await(client, req.request_id);
  }

  std::size_t count_delivered(const std::function<bool(const Envelope&)>& pred) const {
    std::size_t c = 0;
    for (const auto& e : delivered) c += pred(e) ? 1 : 0;
    return c;
  }

  ReplicaOptions opt;
  std::uint32_t n;
  std::vector<NodeId> client_ids;
  std::map<NodeId, PublicKeys> pubs;
  std::map<NodeId, SecretKeys> secs;
  std::vector<std::unique_ptr<Crypto>> cryptos;  // index = node id
  std::vector<std::unique_ptr<MemorySnapshotStore>> stores;
  std::vector<std::unique_ptr<CounterService>> services;
  std::vector<std::unique_ptr<Replica>> replicas;
  std::vector<std::vector<PersistRecord>> wal;  // what each replica made durable, in order
  std::vector<bool> up;
  std::deque<Envelope> queue;
  std::vector<Envelope> delivered;
  std::function<bool(const Envelope&)> drop;  // true: the message is lost
  std::map<NodeId, std::vector<std::pair<NodeId, Reply>>> inbox;
  std::map<NodeId, std::uint64_t> token;
  std::map<NodeId, std::uint64_t> next_id;
  std::map<std::pair<NodeId, std::uint64_t>, Request> sent;

 private:
  void start(NodeId i) {
    services[i] = std::make_unique<CounterService>(stores[i].get());
    replicas[i] = std::make_unique<Replica>(opt, i, *services[i], *cryptos[i], kSeed + i);
    replicas[i]->set_wall_clock_ns(1'000'000);
  }
};

ReplicaOptions small_options() {
  ReplicaOptions o;
  o.checkpoint_interval = 4;
  o.log_window = 8;
  o.client_window = 8;
  o.view_change_timeout_ticks = 100;
  o.view_change_timeout_ticks_max = 1000;
  o.status_interval_ticks = 20;
  o.fetch_retry_ticks = 10;
  // The classic message flow (each COMMIT at once), which these step-by-step tests follow; the piggybacked
  // commits have their own tests below ("piggybacked commits ...").
  o.piggyback_commits = false;
  // Likewise each batch leaves as soon as the window allows (the batch hold has its own tests, "batch hold: ...").
  o.batch_hold = false;
  // And the primary votes like every replica (the quiet primary has its own tests, "quiet primary: ...").
  o.quiet_primary = false;
  return o;
}

// Every seq committed by two of `which` has the same digest at both (histories may start at different seqs
// after a restart or a state transfer), and each history is increasing.
void require_agreement(Cluster& c, const std::vector<NodeId>& which) {
  std::map<std::uint64_t, Digest> seen;
  for (NodeId i : which) {
    std::uint64_t previous = 0;
    for (const ExecutedBatch& b : c.r(i).committed_history()) {
      REQUIRE(b.seq > previous);
      previous = b.seq;
      auto [it, inserted] = seen.emplace(b.seq, b.digest);
      REQUIRE(it->second == b.digest);
    }
  }
}

}  // namespace

TEST_CASE("four replicas commit a request and the client gets f+1 matching replies", "[replica]") {
  LogQuiet quiet;
  ReplicaOptions o = small_options();
  o.tentative_execution = false;
  Cluster c(o);
  const NodeId client = c.client_ids[0];
  const Request req = c.increment(client);
  c.send(req, 0);
  c.run();
  const auto result = c.accepted(client, req.request_id);
  REQUIRE(result);
  CounterResult res;
  REQUIRE(parse_counter_result(*result, res));
  CHECK(res.status == 0);
  CHECK(res.value == 1);
  for (NodeId i = 0; i < 4; i++) {
    CHECK(c.r(i).last_committed() == 1);
    CHECK(c.r(i).last_executed() == 1);
    CHECK(c.service(i).value() == 1);
    CHECK(c.r(i).stats().requests_executed == 1);
    CHECK(c.r(i).stats().batches_committed == 1);
  }
  // Without tentative execution every reply is final.
  for (const auto& [from, rep] : c.inbox[client]) CHECK((rep.flags & kReplyTentative) == 0);
  CHECK(c.inbox[client].size() == 4);
  require_agreement(c, {0, 1, 2, 3});
  CHECK(quiet.new_errors() == 0);
}

TEST_CASE("with tentative execution the client gets 2f+1 tentative replies and the batch still commits", "[replica]") {
  LogQuiet quiet;
  Cluster c(small_options());
  const NodeId client = c.client_ids[0];
  for (int k = 0; k < 3; k++) {
    const CounterResult res = c.do_increment(client);
    CHECK(res.value == static_cast<std::uint64_t>(k + 1));
  }
  std::size_t tentative = 0;
  for (const auto& [from, rep] : c.inbox[client]) tentative += (rep.flags & kReplyTentative) != 0 ? 1 : 0;
  CHECK(tentative >= 3);
  for (NodeId i = 0; i < 4; i++) {
    CHECK(c.r(i).last_committed() == 3);
    CHECK(c.service(i).value() == 3);
  }
  CHECK(quiet.new_errors() == 0);
}

TEST_CASE("a pre-prepare with a forged authenticator entry is rejected", "[replica]") {
  LogQuiet quiet;
  Cluster c(small_options());
  Request req = c.increment(c.client_ids[0]);
  req.authenticator[1].bytes[0] ^= 0xFF;  // the entry for replica 1 no longer verifies
  PrePrepare pp;
  pp.view = 0;
  pp.seq = 1;
  pp.batch.timestamp_ns = 5;
  pp.batch.requests.push_back(req);
  c.r(1).on_message(0, pp);
  const Effects e = c.r(1).take_effects();
  CHECK(e.sends.empty());
  CHECK(e.persist.empty());
  CHECK(c.r(1).stats().rejected_bad_authenticator == 1);
  // Replica 2's entry is intact: it accepts the same pre-prepare and prepares.
  c.r(2).on_message(0, pp);
  const Effects e2 = c.r(2).take_effects();
  REQUIRE(e2.sends.size() == 1);
  CHECK(std::holds_alternative<Prepare>(e2.sends[0].message));
  REQUIRE(e2.persist.size() == 1);
  CHECK(std::holds_alternative<PrePrepareRecord>(e2.persist[0]));
}

TEST_CASE("a pre-prepare from a replica that is not the primary is rejected", "[replica]") {
  LogQuiet quiet;
  Cluster c(small_options());
  PrePrepare pp;
  pp.view = 0;
  pp.seq = 1;
  pp.batch.timestamp_ns = 5;
  pp.batch.requests.push_back(c.increment(c.client_ids[0]));
  c.r(1).on_message(2, pp);
  CHECK(c.r(1).take_effects().empty());
  CHECK(c.r(1).stats().rejected_invalid == 1);
}

TEST_CASE("an equivocating second pre-prepare for the same seq is rejected", "[replica]") {
  LogQuiet quiet;
  Cluster c(small_options());
  PrePrepare a;
  a.view = 0;
  a.seq = 1;
  a.batch.timestamp_ns = 5;
  a.batch.requests.push_back(c.increment(c.client_ids[0]));
  PrePrepare b = a;
  b.batch.requests[0] = c.increment(c.client_ids[1]);
  c.r(1).on_message(0, a);
  const Effects ea = c.r(1).take_effects();
  REQUIRE(ea.sends.size() == 1);
  const Prepare prepare = std::get<Prepare>(ea.sends[0].message);
  CHECK(prepare.digest == a.batch.digest());
  c.r(1).on_message(0, b);
  CHECK(c.r(1).take_effects().empty());
  CHECK(c.r(1).stats().rejected_conflict == 1);
  // A plain retransmission of the first is neither a conflict nor a second prepare.
  c.r(1).on_message(0, a);
  CHECK(c.r(1).take_effects().empty());
  CHECK(c.r(1).stats().rejected_conflict == 1);
}

TEST_CASE("a pre-prepare above the high watermark is dropped", "[replica]") {
  LogQuiet quiet;
  Cluster c(small_options());
  PrePrepare pp;
  pp.view = 0;
  pp.seq = 9;  // h = 0, L = 8
  pp.batch.timestamp_ns = 5;
  pp.batch.requests.push_back(c.increment(c.client_ids[0]));
  c.r(1).on_message(0, pp);
  CHECK(c.r(1).take_effects().empty());
  CHECK(c.r(1).stats().rejected_out_of_window == 1);
}

TEST_CASE("prepares from distinct backups are counted once each and the primary's prepare is invalid", "[replica]") {
  LogQuiet quiet;
  Cluster c(small_options());
  PrePrepare pp;
  pp.view = 0;
  pp.seq = 1;
  pp.batch.timestamp_ns = 5;
  pp.batch.requests.push_back(c.increment(c.client_ids[0]));
  const Digest d = pp.batch.digest();
  c.r(1).on_message(0, pp);
  (void)c.r(1).take_effects();
  c.r(1).on_message(0, Prepare{0, 1, d});  // the primary never prepares
  CHECK(c.r(1).stats().rejected_invalid == 1);
  c.r(1).on_message(2, Prepare{0, 1, d});
  Effects e = c.r(1).take_effects();
  // Own prepare + replica 2's = 2f: prepared, so a PreparedRecord and a COMMIT (durable before sent).
  REQUIRE(e.persist.size() == 1);
  CHECK(std::holds_alternative<PreparedRecord>(e.persist[0]));
  REQUIRE(e.sends.size() >= 1);
  CHECK(std::holds_alternative<Commit>(e.sends[0].message));
  c.r(1).on_message(3, Prepare{0, 1, Digest{}});  // a different digest from a third backup: just a vote
  c.r(1).on_message(3, Prepare{0, 1, d});         // and then a second vote by the same backup: equivocation
  CHECK(c.r(1).stats().rejected_conflict == 1);
}

TEST_CASE("checkpoint becomes stable after 2f+1 matching messages and the log is truncated", "[replica]") {
  LogQuiet quiet;
  Cluster c(small_options());
  // Replica 3 hears nothing: the other three are exactly 2f+1.
  c.drop = [](const Envelope& e) { return e.to == 3 || e.from == 3; };
  const NodeId client = c.client_ids[0];
  for (int k = 0; k < 5; k++) c.do_increment(client);
  for (NodeId i = 0; i < 3; i++) {
    CHECK(c.r(i).last_committed() == 5);
    CHECK(c.r(i).stable_checkpoint() == 4);
  }
  CHECK(c.r(3).stable_checkpoint() == 0);
  // Seq 1 was garbage collected: nobody answers a FETCH-BATCH for it any more, while seq 5 is still served.
  const ExecutedBatch first = c.r(0).committed_history()[0];
  const ExecutedBatch fifth = c.r(0).committed_history()[4];
  c.drop = nullptr;
  c.r(0).on_message(1, FetchBatch{first.seq, first.digest});
  CHECK(c.r(0).take_effects().sends.empty());
  c.r(0).on_message(1, FetchBatch{fifth.seq, fifth.digest});
  const Effects e = c.r(0).take_effects();
  REQUIRE(e.sends.size() == 1);
  CHECK(std::get<BatchData>(e.sends[0].message).batch.digest() == fifth.digest);
  // The checkpoint record and the stable record are in the log of every participant.
  for (NodeId i = 0; i < 3; i++) {
    bool checkpoint = false, stable = false;
    for (const auto& rec : c.wal[i]) {
      if (auto* cr = std::get_if<CheckpointRecord>(&rec)) checkpoint |= cr->seq == 4;
      if (auto* sr = std::get_if<StableRecord>(&rec)) stable |= sr->seq == 4;
    }
    CHECK(checkpoint);
    CHECK(stable);
  }
  CHECK(quiet.new_errors() == 0);
}

TEST_CASE("duplicate request gets the cached reply without executing again", "[replica]") {
  LogQuiet quiet;
  Cluster c(small_options());
  const NodeId client = c.client_ids[0];
  const Request req = c.increment(client);
  c.send(req, 0);
  const CounterResult first = c.await(client, req.request_id);
  c.tick(1);
  c.inbox[client].clear();
  c.send_all(req);
  c.run();
  REQUIRE(c.inbox[client].size() == 4);
  for (const auto& [from, rep] : c.inbox[client]) {
    CHECK((rep.flags & kReplyHasResult) != 0);
    CHECK(rep.request_id == req.request_id);
  }
  const auto again = c.accepted(client, req.request_id);
  REQUIRE(again);
  CounterResult res;
  REQUIRE(parse_counter_result(*again, res));
  CHECK(res.value == first.value);
  for (NodeId i = 0; i < 4; i++) {
    CHECK(c.r(i).stats().requests_executed == 1);
    CHECK(c.service(i).value() == 1);
  }
}

TEST_CASE("a request id below the client's window is stale and dropped", "[replica]") {
  LogQuiet quiet;
  ReplicaOptions o = small_options();
  o.client_window = 2;
  Cluster c(o);
  const NodeId client = c.client_ids[0];
  const Request old = c.increment(client);
  c.send(old, 0);
  c.await(client, old.request_id);
  c.do_increment(client);
  c.do_increment(client);  // window is now (1, 3]
  c.inbox[client].clear();
  c.send(old, 1);
  c.run();
  CHECK(c.inbox[client].empty());
  CHECK(c.r(1).stats().rejected_out_of_window == 1);
}

TEST_CASE("read-only request executes without ordering", "[replica]") {
  LogQuiet quiet;
  Cluster c(small_options());
  const NodeId client = c.client_ids[0];
  c.do_increment(client);
  c.do_increment(client);
  c.tick(1);
  const std::size_t pre_prepares = c.count_delivered(is<PrePrepare>);
  const Request ro = c.make_request(client, 100, counter_read_op(), /*read_only=*/true, /*replier=*/2);
  c.send_all(ro);
  c.run();
  CHECK(c.count_delivered(is<PrePrepare>) == pre_prepares);
  std::size_t with_result = 0;
  std::size_t replies = 0;
  for (const auto& [from, rep] : c.inbox[client]) {
    if (rep.request_id != ro.request_id) continue;
    replies++;
    CHECK((rep.flags & kReplyReadOnly) != 0);
    with_result += (rep.flags & kReplyHasResult) != 0 ? 1 : 0;
  }
  CHECK(replies == 4);
  CHECK(with_result == 1);  // only the designated replier sends the full result (TOCS §5.1.1)
  const auto result = c.accepted(client, ro.request_id);
  REQUIRE(result);
  CounterResult res;
  REQUIRE(parse_counter_result(*result, res));
  CHECK(res.value == 2);
  for (NodeId i = 0; i < 4; i++) {
    CHECK(c.r(i).stats().read_only_executed == 1);
    CHECK(c.r(i).last_executed() == 2);
  }
}

TEST_CASE("read-only request waits while tentative state exists", "[replica]") {
  LogQuiet quiet;
  Cluster c(small_options());
  const NodeId client = c.client_ids[0];
  // Commits are lost: every replica prepares and executes tentatively, nothing commits.
  c.drop = [](const Envelope& e) { return is<Commit>(e); };
  c.send(c.increment(client), 0);
  c.run();
  REQUIRE(c.r(1).last_executed() == 1);
  REQUIRE(c.r(1).last_committed() == 0);
  const Request ro = c.make_request(client, 100, counter_read_op(), true);
  c.send(ro, 1);
  c.run();
  CHECK(c.r(1).stats().read_only_executed == 0);
  // Commits get through (retransmitted after STATUS): the read runs then.
  c.drop = nullptr;
  REQUIRE(c.tick_until([&] { return c.r(1).stats().read_only_executed == 1; }, 500));
  CHECK(c.r(1).last_committed() == 1);
}

TEST_CASE("the primary batches requests that arrive while a batch is in flight", "[replica]") {
  LogQuiet quiet;
  ReplicaOptions o = small_options();
  o.batch_window = 1;
  Cluster c(o, 5);
  for (NodeId client : c.client_ids) c.send(c.increment(client), 0);
  c.run();
  // The first request went out alone at once; the other four waited for it to commit and left together.
  for (NodeId i = 0; i < 4; i++) {
    CHECK(c.r(i).last_committed() == 2);
    CHECK(c.r(i).stats().requests_executed == 5);
  }
  for (NodeId client : c.client_ids) CHECK(c.accepted(client, 1).has_value());

  SECTION("batch_window 0 orders one request per pre-prepare") {
    ReplicaOptions o0 = small_options();
    o0.batch_window = 0;
    Cluster c0(o0, 5);
    for (NodeId client : c0.client_ids) c0.send(c0.increment(client), 0);
    c0.run();
    for (NodeId i = 0; i < 4; i++) CHECK(c0.r(i).last_committed() == 5);
  }
}

TEST_CASE("view change after the primary is silent preserves a prepared request", "[replica][view_change]") {
  LogQuiet quiet;
  Cluster c(small_options());
  const NodeId client = c.client_ids[0];
  // Every commit of view 0 is lost (retransmissions too): the request prepares everywhere but cannot commit.
  c.drop = [](const Envelope& e) { return is<Commit>(e) && std::get<Commit>(e.message).view == 0; };
  const Request req = c.increment(client);
  c.send_all(req);  // every backup knows the request and waits for it
  c.run();
  for (NodeId i = 1; i < 4; i++) REQUIRE(c.r(i).last_committed() == 0);
  c.crash(0);
  REQUIRE(c.tick_until([&] {
    for (NodeId i = 1; i < 4; i++) {
      if (c.r(i).view() != 1 || c.r(i).in_view_change() || c.r(i).last_committed() < 1) return false;
    }
    return true;
  }));
  for (NodeId i = 1; i < 4; i++) {
    CHECK(c.r(i).stats().new_views_installed == 1);
    CHECK(c.r(i).stats().rollbacks == 0);
    CHECK(c.service(i).value() == 1);
    CHECK(c.r(i).stats().requests_executed == 1);
  }
  CHECK(c.r(1).is_primary());
  require_agreement(c, {1, 2, 3});
  const CounterResult res = c.await(client, req.request_id);
  CHECK(res.value == 1);
  // The new primary orders new requests.
  CHECK(c.do_increment(client, 1).value == 2);
  CHECK(quiet.new_errors() == 0);
}

TEST_CASE("a new primary fetches a chosen batch it never saw before sending the new view", "[replica][view_change]") {
  LogQuiet quiet;
  Cluster c(small_options());
  // Replica 1 (the next primary) never gets the pre-prepare; 2 and 3 prepare it; no commit of view 0 arrives.
  c.drop = [](const Envelope& e) {
    if (const auto* pp = std::get_if<PrePrepare>(&e.message)) return pp->view == 0 && e.to == 1;
    if (const auto* cm = std::get_if<Commit>(&e.message)) return cm->view == 0;
    return false;
  };
  const NodeId client = c.client_ids[0];
  const Request req = c.increment(client);
  c.send_all(req);
  c.run();
  REQUIRE(c.r(2).last_executed() == 1);
  REQUIRE(c.r(1).last_executed() == 0);
  const Digest original = [&] {
    for (const auto& rec : c.wal[2]) {
      if (const auto* pp = std::get_if<PrePrepareRecord>(&rec)) return pp->batch.digest();
    }
    return Digest{};
  }();
  c.crash(0);
  REQUIRE(c.tick_until([&] {
    for (NodeId i = 1; i < 4; i++) {
      if (c.r(i).view() != 1 || c.r(i).in_view_change() || c.r(i).last_committed() < 1) return false;
    }
    return true;
  }));
  // The re-proposed batch is the original one (same digest), executed once everywhere.
  for (NodeId i = 1; i < 4; i++) {
    REQUIRE(!c.r(i).committed_history().empty());
    CHECK(c.r(i).committed_history()[0].digest == original);
    CHECK(c.service(i).value() == 1);
  }
  CHECK(c.count_delivered([](const Envelope& e) { return is<BatchData>(e) && e.to == 1; }) >= 1);
  CHECK(c.await(client, req.request_id).value == 1);
  CHECK(quiet.new_errors() == 0);
}

TEST_CASE("a tentatively executed batch that the new view drops is rolled back", "[replica][view_change]") {
  LogQuiet quiet;
  Cluster c(small_options());
  const NodeId client = c.client_ids[0];
  // In view 0 only replica 2 prepares (it sees replica 1's prepare, nobody sees its own), so only it executes;
  // retransmissions of view-0 messages are lost the same way.
  const auto view0 = [](const Envelope& e) {
    if (const auto* pp = std::get_if<PrePrepare>(&e.message)) return pp->view == 0 && e.to == 3;
    if (const auto* p = std::get_if<Prepare>(&e.message)) return p->view == 0 && (e.to == 0 || (e.from == 2 && e.to == 1));
    if (const auto* cm = std::get_if<Commit>(&e.message)) return cm->view == 0;
    return false;
  };
  c.drop = view0;
  const Request req = c.increment(client);
  c.send(req, 0);
  c.run();
  REQUIRE(c.r(2).last_executed() == 1);
  REQUIRE(c.service(2).value() == 1);
  for (NodeId i : {0u, 1u, 3u}) REQUIRE(c.r(i).last_executed() == 0);
  // The client retransmits to everyone; replicas 1 and 3 time out. The new primary (1) does not hear replica
  // 2's view change, so its decision rests on three messages without a prepared entry: seq 1 is dropped.
  c.drop = [view0](const Envelope& e) { return view0(e) || (is<ViewChange>(e) && e.from == 2 && e.to == 1); };
  c.send_all(req);
  REQUIRE(c.tick_until([&] {
    for (NodeId i = 0; i < 4; i++) {
      if (c.r(i).view() != 1 || c.r(i).in_view_change() || c.r(i).last_committed() < 1) return false;
    }
    return true;
  }));
  CHECK(c.r(2).stats().rollbacks == 1);
  for (NodeId i = 0; i < 4; i++) {
    CHECK(c.service(i).value() == 1);
    CHECK(c.r(i).stats().rollbacks == (i == 2 ? 1u : 0u));
  }
  require_agreement(c, {0, 1, 2, 3});
  CHECK(quiet.new_errors() == 0);
}

TEST_CASE("a replica joins a view change when f+1 others ask for a higher view", "[replica][view_change]") {
  LogQuiet quiet;
  Cluster c(small_options());
  // Replicas 1 and 2 time out (they hold a request the primary never orders); 0 and 3 have no reason to.
  c.drop = [](const Envelope& e) { return e.from == 0 && !is<ViewChange>(e) && !is<Status>(e); };
  const NodeId client = c.client_ids[0];
  const Request req = c.increment(client);
  c.send(req, 1);
  c.send(req, 2);
  REQUIRE(c.tick_until([&] { return c.r(0).view() == 1 && c.r(3).view() == 1; }));
  CHECK(c.r(3).stats().view_changes_started == 1);
  c.drop = nullptr;
  REQUIRE(c.tick_until([&] { return c.r(3).last_committed() == 1 && !c.r(3).in_view_change(); }));
  CHECK(c.service(3).value() == 1);
}

TEST_CASE("a replica alone in a view change learns committed batches from commit certificates", "[replica][view_change]") {
  LogQuiet quiet;
  Cluster c(small_options());
  // Replica 3 is cut off from the replicas, holding a request nobody else sees: it times out and changes views
  // alone.
  c.drop = [](const Envelope& e) { return (e.to == 3 && e.from < 4) || (e.from == 3 && e.to < 4); };
  c.send(c.increment(c.client_ids[1]), 3);
  c.run();
  REQUIRE(c.tick_until([&] { return c.r(3).in_view_change(); }, 1000));
  c.drop = nullptr;
  const NodeId client = c.client_ids[0];
  for (int k = 0; k < 3; k++) c.do_increment(client);
  // The others stay in view 0 (one view change is not f+1); replica 3 stays in its view change but catches up.
  REQUIRE(c.tick_until([&] { return c.r(3).last_committed() == c.r(0).last_committed(); }, 1000));
  CHECK(c.r(0).view() == 0);
  CHECK(c.r(3).in_view_change());
  CHECK(c.r(3).view() == 1);
  CHECK(c.service(3).value() == 3);
  require_agreement(c, {0, 1, 2, 3});
  // When the others do change views (the primary fails with a request outstanding), it is already there.
  c.crash(0);
  const Request req = c.increment(client);
  c.send_all(req);
  REQUIRE(c.tick_until([&] { return c.r(1).view() == 1 && !c.r(1).in_view_change() && !c.r(3).in_view_change(); }));
  CHECK(c.await(client, req.request_id).value == 4);
  CHECK(c.r(3).stats().view_changes_started == 1);
  CHECK(quiet.new_errors() == 0);
}

TEST_CASE("a new-view relayed by a backup is accepted", "[replica][view_change]") {
  LogQuiet quiet;
  Cluster c(small_options());
  // Replica 3 never hears the new primary's NEW-VIEW directly; replica 2 relays its copy after a STATUS.
  c.drop = [](const Envelope& e) { return is<NewView>(e) && e.from == 1 && e.to == 3; };
  c.crash(0);
  const NodeId client = c.client_ids[0];
  const Request req = c.increment(client);
  c.send_all(req);
  REQUIRE(c.tick_until([&] { return c.r(3).view() == 1 && !c.r(3).in_view_change() && c.r(3).last_committed() == 1; }));
  CHECK(c.count_delivered([](const Envelope& e) { return is<NewView>(e) && e.from == 2 && e.to == 3; }) >= 1);
  CHECK(c.r(3).stats().new_views_installed == 1);
  CHECK(c.await(client, req.request_id).value == 1);
}

TEST_CASE("view change messages and new-view messages with bad signatures are rejected", "[replica][view_change]") {
  LogQuiet quiet;
  Cluster c(small_options());
  ViewChange vc;
  vc.new_view = 1;
  vc.replica = 2;
  vc.stable_seq = 0;
  vc.checkpoints.push_back(CheckpointClaim{0, Digest{}});
  c.r(1).on_message(2, vc);  // unsigned
  CHECK(c.r(1).stats().rejected_bad_signature == 1);
  CHECK(c.r(1).take_effects().empty());
  NewView nv;
  nv.view = 1;
  c.r(2).on_message(1, nv);
  CHECK(c.r(2).stats().rejected_bad_signature == 1);
  CHECK(c.r(2).view() == 0);
  // A view change whose signer is not the sender is invalid.
  c.r(1).on_message(3, vc);
  CHECK(c.r(1).stats().rejected_invalid == 1);
}

TEST_CASE("a replica restarted from its records re-executes committed batches and reaches the same counter value",
          "[replica][recovery]") {
  LogQuiet quiet;
  Cluster c(small_options());
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
  Cluster c(o);
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
  for (const auto& e : c.delivered) {
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
  Cluster c(o);
  const NodeId client = c.client_ids[0];
  c.do_increment(client);
  c.crash(3);
  c.restart(3);
  CHECK(c.r(3).view() == 0);
  CHECK(!c.r(3).in_view_change());
  const std::size_t before = c.delivered.size();
  for (int k = 0; k < 2; k++) c.do_increment(client);
  REQUIRE(c.tick_until([&] { return c.r(3).last_committed() >= 3; }, 500));
  for (std::size_t i = before; i < c.delivered.size(); i++) {
    const auto& e = c.delivered[i];
    if (const auto* p = std::get_if<Prepare>(&e.message); p != nullptr) CHECK(e.from != 3);
  }
  CHECK(c.service(3).value() == 3);
  require_agreement(c, {0, 1, 2, 3});
}

TEST_CASE("a restarted replica still counts the commit it sent before the crash", "[replica][recovery]") {
  LogQuiet quiet;
  Cluster c(small_options());
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
  Cluster c(small_options());
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
  c.inbox[client].clear();
  c.send(c.sent.at({client, c.next_id[client]}), 3);
  c.run();
  REQUIRE(c.inbox[client].size() == 1);
  CHECK((c.inbox[client][0].second.flags & kReplyHasResult) != 0);
  // And it takes part in ordering again: with replica 0 silent, progress needs replica 3.
  c.drop = [](const Envelope& e) { return e.from == 2 || e.to == 2; };
  CHECK(c.do_increment(client).value == 21);
  REQUIRE(c.tick_until([&] { return c.r(3).last_committed() == 21; }, 500));
  CHECK(quiet.new_errors() == 0);
}

TEST_CASE("a replica whose tentative executions never commit catches up by state transfer", "[replica][state_transfer]") {
  LogQuiet quiet;
  Cluster c(small_options());
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
  Cluster c(small_options());
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

TEST_CASE("the effects filter sees every outgoing effect and can drop it", "[replica]") {
  LogQuiet quiet;
  Cluster c(small_options());
  std::size_t seen = 0;
  c.r(0).set_effects_filter([&](Effects& e) {
    seen += e.sends.size();
    std::erase_if(e.sends, [](const Send& s) { return std::holds_alternative<PrePrepare>(s.message); });
  });
  const NodeId client = c.client_ids[0];
  c.send(c.increment(client), 0);
  c.run();
  CHECK(seen >= 1);
  CHECK(c.count_delivered(is<PrePrepare>) == 0);
  for (NodeId i = 1; i < 4; i++) CHECK(c.r(i).last_executed() == 0);
}

// ---- per-client order of pipelined requests (TOCS §5.1.4; ClientTable::predecessor_done) ----

namespace {

// A request of `client` with id `id` that names `prev` as the ordered request issued before it.
Request after(Cluster& c, NodeId client, std::uint64_t id, std::uint64_t prev, Bytes op, bool read_only = false) {
  Request r = c.make_request(client, id, std::move(op), read_only);
  r.prev_request_id = prev;
  const Digest d = r.digest();
  r.authenticator.clear();
  for (NodeId i = 0; i < c.n; i++) r.authenticator.push_back(c.cryptos[client]->mac(i, d.bytes));
  return r;
}

CounterResult counter_of(const std::optional<Bytes>& result) {
  REQUIRE(result.has_value());
  CounterResult res;
  REQUIRE(parse_counter_result(*result, res));
  return res;
}

}  // namespace

TEST_CASE("a request waits for the one its client issued before it, and its wait starts no view change",
          "[replica][order]") {
  LogQuiet quiet;
  Cluster c(small_options());
  const NodeId client = c.client_ids[0];
  const std::uint64_t token = c.token[client];
  // Both increments present the same token: whichever runs first succeeds, the other gets "bad token".
  const Request first = after(c, client, 1, 0, counter_increment_op(token));
  const Request second = after(c, client, 2, 1, counter_increment_op(token));
  c.send_all(second);  // the first one is late (lost, or still on its way)
  c.run();
  c.tick(3 * c.opt.view_change_timeout_ticks);
  for (NodeId i = 0; i < 4; i++) {
    CHECK(c.r(i).stats().requests_executed == 0);
    CHECK(c.r(i).stats().view_changes_started == 0);  // nothing the primary could order: not its fault
  }
  c.send(first, 0);
  c.run();
  CHECK(counter_of(c.accepted(client, 1)).status == 0);
  REQUIRE(c.tick_until([&] { return c.accepted(client, 2).has_value(); }, 2000));
  CHECK(counter_of(c.accepted(client, 2)).status == 1);  // ran second: its token was used up
  for (NodeId i = 0; i < 4; i++) {
    CHECK(c.r(i).stats().requests_executed == 2);
    CHECK(c.r(i).view() == 0);
  }
}

TEST_CASE("a batch that orders a request before its predecessor: every replica skips it alike, then runs it in order",
          "[replica][order]") {
  LogQuiet quiet;
  Cluster c(small_options());
  const NodeId client = c.client_ids[0];
  const std::uint64_t token = c.token[client];
  const Request first = after(c, client, 1, 0, counter_increment_op(token));
  const Request second = after(c, client, 2, 1, counter_increment_op(token));
  // A faulty primary pre-prepares the client's requests in the wrong order, the same batch to every backup, and
  // then falls silent (replica 0 stands for it: its own core never proposed this, so it is taken down).
  c.crash(0);
  PrePrepare pp;
  pp.view = 0;
  pp.seq = 1;
  pp.batch.timestamp_ns = 2'000'000;
  pp.batch.requests = {second, first};
  for (NodeId j = 1; j < 4; j++) c.queue.push_back(Envelope{0, j, pp});
  c.run();
  for (NodeId j = 1; j < 4; j++) {
    CHECK(c.r(j).last_committed() == 1);
    CHECK(c.r(j).stats().requests_executed == 1);
    CHECK(c.r(j).stats().requests_deferred_order == 1);
  }
  CHECK(counter_of(c.accepted(client, 1)).status == 0);
  CHECK_FALSE(c.accepted(client, 2).has_value());  // skipped without a record: nothing was answered
  // The skipped request waits at the backups, ready now; the primary never orders it (it sent none of this),
  // so they change views and the next primary orders it.
  REQUIRE(c.tick_until([&] { return c.accepted(client, 2).has_value(); }, 5000));
  CHECK(counter_of(c.accepted(client, 2)).status == 1);  // after the first: its token was used up
  for (NodeId j = 1; j < 4; j++) CHECK(c.r(j).view() >= 1);
  require_agreement(c, {1, 2, 3});
}

TEST_CASE("a read-only request is answered only after its client's previous ordered request executed",
          "[replica][order]") {
  LogQuiet quiet;
  Cluster c(small_options());
  const NodeId client = c.client_ids[0];
  const Request write = after(c, client, 1, 0, counter_increment_op(c.token[client]));
  const Request read = after(c, client, 2, 1, counter_read_op(), /*read_only=*/true);
  c.send_all(read);  // overtakes the write
  c.run();
  for (NodeId i = 0; i < 4; i++) CHECK(c.r(i).stats().read_only_executed == 0);
  c.send(write, 0);
  c.run();
  REQUIRE(c.tick_until([&] { return c.accepted(client, 2).has_value(); }, 500));
  CHECK(counter_of(c.accepted(client, 2)).value == 1);  // the read sees the write issued before it
}

// ---- STATUS only when it helps, and Replica::idle (the runtime's tick pacing) ----

TEST_CASE("an idle replica sends STATUS only as a heartbeat, every 10th status interval", "[replica][status]") {
  LogQuiet quiet;
  Cluster c(small_options());
  c.do_increment(c.client_ids[0]);
  c.tick(c.opt.status_interval_ticks * 2);  // settle: every replica has heard every other's position
  for (NodeId i = 0; i < c.n; i++) CHECK(c.r(i).idle());
  c.delivered.clear();
  c.tick(c.opt.status_interval_ticks * 20);
  // 20 intervals, a heartbeat every 10: two STATUS per replica to each of its 3 peers, no more.
  for (NodeId i = 0; i < c.n; i++) {
    CHECK(c.count_delivered([&](const Envelope& e) { return e.from == i && is<Status>(e); }) == 2 * (c.n - 1));
  }
  CHECK(quiet.new_errors() == 0);
}

TEST_CASE("a replica waiting for a request without progress sends STATUS every interval", "[replica][status]") {
  LogQuiet quiet;
  Cluster c(small_options());
  c.do_increment(c.client_ids[0]);
  c.tick(c.opt.status_interval_ticks * 2);
  // Replica 3 hears of a request the primary never gets: it waits (and its view-change timer runs).
  c.drop = [](const Envelope& e) { return e.to == 0 && is<Request>(e); };
  const Request req = c.increment(c.client_ids[0]);
  c.send(req, 3);
  c.run();
  CHECK_FALSE(c.r(3).idle());
  c.delivered.clear();
  c.tick(c.opt.status_interval_ticks * 3);
  CHECK(c.count_delivered([](const Envelope& e) { return e.from == 3 && is<Status>(e); }) >= 2 * (c.n - 1));
  CHECK(quiet.new_errors() == 0);
}

TEST_CASE("a replica that missed batches learns it from the answer to its STATUS and catches up",
          "[replica][status]") {
  LogQuiet quiet;
  Cluster c(small_options());
  // Replica 3 misses everything about the second increment but STATUS frames.
  c.do_increment(c.client_ids[0]);
  c.drop = [](const Envelope& e) { return e.to == 3 && !is<Status>(e); };
  c.do_increment(c.client_ids[0]);
  c.drop = nullptr;
  CHECK(c.r(3).last_committed() + 1 == c.r(0).last_committed());
  // Its heartbeat reaches the others, who answer with their position; then it asks until it has caught up.
  REQUIRE(c.tick_until([&] { return c.r(3).last_committed() == c.r(0).last_committed(); },
                       c.opt.status_interval_ticks * 30));
  CHECK(c.r(3).last_executed() == c.r(0).last_executed());
  require_agreement(c, {0, 1, 2, 3});
  CHECK(quiet.new_errors() == 0);
}

// ---- piggybacked commits (Replica::Impl::defer_commit) ----

namespace {
ReplicaOptions piggyback_options() {
  ReplicaOptions o = small_options();
  o.piggyback_commits = true;
  o.checkpoint_interval = 16;  // no checkpoint boundary in these short runs (boundary commits are not deferred)
  o.log_window = 32;
  return o;
}
}  // namespace

TEST_CASE("piggybacked commits: a COMMIT waits for the next PREPARE and leaves just before it", "[replica]") {
  LogQuiet quiet;
  Cluster c(piggyback_options());
  const NodeId client = c.client_ids[0];
  CHECK(c.do_increment(client).value == 1);
  // The client accepted 2f+1 tentative replies, yet no replica sent a COMMIT: seq 1 is prepared, not committed.
  CHECK(c.count_delivered(is<Commit>) == 0);
  for (NodeId i = 0; i < 4; i++) {
    CHECK(c.r(i).last_executed() == 1);
    CHECK(c.r(i).last_committed() == 0);
    CHECK_FALSE(c.r(i).idle());  // so that the runtime keeps ticking for the flush
  }
  // The next request's PRE-PREPARE and PREPAREs carry them: every COMMIT for seq 1 precedes, from its sender,
  // that sender's vote for seq 2, and seq 1 commits without a tick.
  const Request req = c.increment(client);
  c.send(req, 0);
  c.run();
  CHECK(c.count_delivered(is<Commit>) == 4 * 3);
  for (NodeId i = 0; i < 4; i++) CHECK(c.r(i).last_committed() == 1);
  for (NodeId from = 0; from < 4; from++) {
    for (NodeId to = 0; to < 4; to++) {
      if (from == to) continue;
      std::size_t commit_at = SIZE_MAX, vote_at = SIZE_MAX;
      for (std::size_t k = 0; k < c.delivered.size(); k++) {
        const Envelope& e = c.delivered[k];
        if (e.from != from || e.to != to) continue;
        if (const auto* cm = std::get_if<Commit>(&e.message); cm && cm->seq == 1) commit_at = std::min(commit_at, k);
        if (const auto* pp = std::get_if<PrePrepare>(&e.message); pp && pp->seq == 2) vote_at = std::min(vote_at, k);
        if (const auto* pr = std::get_if<Prepare>(&e.message); pr && pr->seq == 2) vote_at = std::min(vote_at, k);
      }
      CHECK(commit_at < vote_at);
    }
  }
  CHECK(c.await(client, req.request_id).value == 2);
  require_agreement(c, {0, 1, 2, 3});
  CHECK(quiet.new_errors() == 0);
}

TEST_CASE("piggybacked commits: a lone batch commits at the next tick", "[replica]") {
  LogQuiet quiet;
  Cluster c(piggyback_options());
  c.do_increment(c.client_ids[0]);
  for (NodeId i = 0; i < 4; i++) CHECK(c.r(i).last_committed() == 0);
  c.tick(1);
  for (NodeId i = 0; i < 4; i++) {
    CHECK(c.r(i).last_committed() == 1);
    CHECK(c.r(i).stats().batches_committed == 1);
    CHECK(c.r(i).idle());
  }
  CHECK(c.count_delivered(is<Commit>) == 4 * 3);
}

TEST_CASE("piggybacked commits: a read-only request sends them at once, and reads the committed state", "[replica]") {
  LogQuiet quiet;
  Cluster c(piggyback_options());
  const NodeId client = c.client_ids[0];
  c.do_increment(client);
  c.do_increment(client);
  CHECK(c.r(0).last_committed() == 1);  // seq 2's commits wait
  const Request ro = c.make_request(client, 100, counter_read_op(), /*read_only=*/true);
  c.send_all(ro);
  c.run();  // no tick
  const auto result = c.accepted(client, ro.request_id);
  REQUIRE(result);
  CounterResult res;
  REQUIRE(parse_counter_result(*result, res));
  CHECK(res.value == 2);
  for (NodeId i = 0; i < 4; i++) {
    CHECK(c.r(i).last_committed() == 2);
    CHECK(c.r(i).stats().read_only_executed == 1);
  }
}

TEST_CASE("piggybacked commits: a checkpoint seq's COMMIT is not deferred", "[replica]") {
  LogQuiet quiet;
  ReplicaOptions o = piggyback_options();
  o.checkpoint_interval = 2;
  o.log_window = 4;
  Cluster c(o);
  const NodeId client = c.client_ids[0];
  c.do_increment(client);
  c.do_increment(client);  // seq 2 is a checkpoint: it commits at once, and with it seq 1
  for (NodeId i = 0; i < 4; i++) {
    CHECK(c.r(i).last_committed() == 2);
    CHECK(c.r(i).stable_checkpoint() == 2);
  }
  // Execution past the boundary waits for that commit; it did not need a tick.
  CHECK(c.do_increment(client).value == 3);
  require_agreement(c, {0, 1, 2, 3});
}

// ---- batch hold (ReplicaOptions::batch_hold, Replica::Impl::hold_for_returning) ----

ReplicaOptions hold_options() {
  ReplicaOptions o = small_options();
  o.batch_hold = true;
  o.batch_window = 1;
  return o;
}

// Client a (the first) is answered with nothing else of it queued; then client b's request reaches the primary,
// which holds it back for a. Returns b's request.
Request hold_b_for_a(Cluster& c) {
  c.do_increment(c.client_ids[0]);
  const Request b1 = c.increment(c.client_ids[1]);
  c.send(b1, 0);
  c.run();
  REQUIRE(c.r(0).batch_held());
  return b1;
}

// Every replica executed `seqs` batches holding `requests` requests in all.
void check_executed(Cluster& c, std::uint64_t seqs, std::uint64_t requests) {
  for (NodeId i = 0; i < 4; i++) {
    CHECK(c.r(i).last_executed() == seqs);
    CHECK(c.r(i).stats().requests_executed == requests);
  }
}

TEST_CASE("batch hold: the next batch waits for the client just answered and takes its next request along", "[replica]") {
  LogQuiet quiet;
  Cluster c(hold_options(), 2);
  const NodeId a = c.client_ids[0];
  const NodeId b = c.client_ids[1];
  const Request b1 = hold_b_for_a(c);  // a was answered and has nothing queued: the primary expects it back
  check_executed(c, 1, 1);
  for (NodeId i = 1; i < 4; i++) CHECK_FALSE(c.r(i).batch_held());  // only a primary holds
  const Request a2 = c.increment(a);
  c.send(a2, 0);
  c.run();
  // a came back: one batch with both requests, sent without a tick.
  CHECK_FALSE(c.r(0).batch_held());
  check_executed(c, 2, 3);
  CHECK(c.accepted(b, b1.request_id).has_value());
  CHECK(c.accepted(a, a2.request_id).has_value());
  require_agreement(c, {0, 1, 2, 3});
}

TEST_CASE("batch hold: a client that does not come back costs one bounded wait", "[replica]") {
  LogQuiet quiet;
  Cluster c(hold_options(), 2);
  const NodeId b = c.client_ids[1];
  const Request b1 = hold_b_for_a(c);

  SECTION("the driver ends it") {
    c.r(0).end_batch_hold();
    c.drain(0);
    c.run();
  }
  SECTION("else the second tick ends it") {
    c.tick(1);
    CHECK(c.r(0).batch_held());
    check_executed(c, 1, 1);
    c.tick(1);
  }
  CHECK_FALSE(c.r(0).batch_held());
  check_executed(c, 2, 2);
  CHECK(c.accepted(b, b1.request_id).has_value());
  // b was answered now, a was given up on: b's next request waits for b alone, so it goes at once.
  c.tick_until([&] { return c.r(0).idle(); });
  const Request b2 = c.increment(b);
  c.send(b2, 0);
  c.run();
  CHECK_FALSE(c.r(0).batch_held());
  check_executed(c, 3, 3);
}

TEST_CASE("batch hold: a lone client, and a client with its next request already queued, never wait", "[replica]") {
  LogQuiet quiet;
  Cluster c(hold_options(), 1);
  const NodeId a = c.client_ids[0];
  for (std::uint64_t k = 1; k <= 3; k++) {
    const Request r = c.increment(a);
    c.send(r, 0);
    c.run();  // no tick: its own request ends any wait for it
    CHECK_FALSE(c.r(0).batch_held());
    check_executed(c, k, k);
    REQUIRE(c.accepted(a, r.request_id).has_value());
    c.await(a, r.request_id);  // accepted already: takes the next token without a tick
  }
}

TEST_CASE("batch hold: a view change forgets the clients waited for", "[replica]") {
  LogQuiet quiet;
  Cluster c(hold_options(), 2);
  const NodeId b = c.client_ids[1];
  const Request b1 = hold_b_for_a(c);
  // The primary goes silent; b retransmits to everyone, the backups time out and move to view 1.
  c.crash(0);
  c.send_all(b1);
  REQUIRE(c.tick_until([&] { return c.accepted(b, b1.request_id).has_value(); }, 5000));
  for (NodeId i = 1; i < 4; i++) {
    CHECK(c.r(i).view() >= 1);
    CHECK_FALSE(c.r(i).batch_held());
  }
  require_agreement(c, {1, 2, 3});
}

// ---- quiet primary (Replica::Impl::may_go_quiet) ----

namespace {
ReplicaOptions quiet_options() {
  ReplicaOptions o = small_options();
  o.quiet_primary = true;
  o.quiet_release_ticks = 12;
  o.checkpoint_interval = 16;  // no checkpoint seq in these short runs (a checkpoint seq never goes quiet)
  o.log_window = 32;
  return o;
}

std::size_t count_prepared_records(const std::vector<PersistRecord>& wal, std::uint64_t seq) {
  std::size_t count = 0;
  for (const PersistRecord& r : wal) {
    if (const auto* p = std::get_if<PreparedRecord>(&r); p != nullptr && p->seq == seq) count++;
  }
  return count;
}

bool commit_from(const Envelope& e, NodeId from, std::uint64_t seq) {
  const auto* c = std::get_if<Commit>(&e.message);
  return c != nullptr && e.from == from && c->seq == seq;
}

// Seq 1 completes with every replica; then replica 3 goes silent. The primary, going by seq 1, keeps seq 2
// quiet, and only two votes and two COMMITs come from the backups: the returned request is not accepted.
Request quiet_batch_with_a_silent_backup(Cluster& c, NodeId client) {
  c.do_increment(client);
  c.drop = [](const Envelope& e) { return e.from == 3 || e.to == 3; };
  const Request req = c.increment(client);
  c.send(req, 0);
  c.run();
  CHECK(c.r(0).stats().quiet_batches == 1);
  CHECK_FALSE(c.accepted(client, req.request_id));
  CHECK(c.r(0).last_committed() == 1);
  return req;
}
}  // namespace

TEST_CASE("quiet primary: a batch costs the primary no record, COMMIT or vote, and still commits everywhere",
          "[replica][quiet]") {
  LogQuiet quiet;
  Cluster c(quiet_options());
  const NodeId client = c.client_ids[0];
  // Seq 1: nothing tells the primary yet that all its backups answer (it prepares on the second PREPARE).
  CHECK(c.do_increment(client).value == 1);
  CHECK(c.r(0).stats().quiet_batches == 0);
  CHECK(count_prepared_records(c.wal[0], 1) == 1);
  // Seq 2: all three backups prepared seq 1, so the primary stays quiet.
  c.delivered.clear();
  const Request req = c.increment(client);
  c.send(req, 0);
  c.run();  // no tick: the backups' votes and COMMITs make both certificates
  REQUIRE(c.accepted(client, req.request_id));
  CHECK(c.await(client, req.request_id).value == 2);
  CHECK(c.r(0).stats().quiet_batches == 1);
  CHECK(c.r(0).stats().quiet_releases == 0);
  CHECK(count_prepared_records(c.wal[0], 2) == 0);
  for (NodeId i = 1; i < 4; i++) CHECK(count_prepared_records(c.wal[i], 2) == 1);
  CHECK(c.count_delivered([](const Envelope& e) { return commit_from(e, 0, 2); }) == 0);
  for (NodeId i = 1; i < 4; i++) CHECK(c.count_delivered([&](const Envelope& e) { return commit_from(e, i, 2); }) == 3);
  // The primary's reply carries the result and is flagged as no vote; every backup's is a tentative vote.
  for (const auto& [from, rep] : c.inbox[client]) {
    if (rep.request_id != req.request_id) continue;
    if (from == 0) {
      CHECK((rep.flags & kReplySpeculative) != 0);
      CHECK((rep.flags & kReplyTentative) == 0);
      CHECK((rep.flags & kReplyHasResult) != 0);
    } else {
      CHECK((rep.flags & kReplyTentative) != 0);
    }
  }
  for (NodeId i = 0; i < 4; i++) CHECK(c.r(i).last_committed() == 2);
  require_agreement(c, {0, 1, 2, 3});
  CHECK(quiet.new_errors() == 0);
}

TEST_CASE("quiet primary: with a backup silent, the release timer makes the primary's promises, then it votes",
          "[replica][quiet]") {
  LogQuiet quiet;
  Cluster c(quiet_options());
  const NodeId client = c.client_ids[0];
  const Request req = quiet_batch_with_a_silent_backup(c, client);
  c.tick(c.opt.quiet_release_ticks - 1);
  CHECK_FALSE(c.accepted(client, req.request_id));
  CHECK(count_prepared_records(c.wal[0], 2) == 0);
  c.tick(1);
  CHECK(c.r(0).stats().quiet_releases == 1);
  CHECK(count_prepared_records(c.wal[0], 2) == 1);
  REQUIRE(c.accepted(client, req.request_id));
  CHECK(c.await(client, req.request_id).value == 2);
  for (NodeId i = 0; i < 3; i++) CHECK(c.r(i).last_committed() == 2);
  // Nothing goes quiet for a while: the next request completes without waiting for a timer.
  const Request next = c.increment(client);
  c.send(next, 0);
  c.run();
  REQUIRE(c.accepted(client, next.request_id));
  CHECK(c.r(0).stats().quiet_batches == 1);
  CHECK(count_prepared_records(c.wal[0], 3) == 1);
  require_agreement(c, {0, 1, 2});
  CHECK(quiet.new_errors() == 0);
}

TEST_CASE("quiet primary: a client asking again gets the primary's vote at once", "[replica][quiet]") {
  LogQuiet quiet;
  Cluster c(quiet_options());
  const NodeId client = c.client_ids[0];
  const Request req = quiet_batch_with_a_silent_backup(c, client);
  c.send_all(req);  // the client's retransmission
  c.run();          // no tick
  REQUIRE(c.accepted(client, req.request_id));
  CHECK(c.r(0).stats().quiet_releases == 1);
  CHECK(count_prepared_records(c.wal[0], 2) == 1);
  CHECK(c.await(client, req.request_id).value == 2);
  CHECK(quiet.new_errors() == 0);
}

TEST_CASE("quiet primary: its VIEW-CHANGE claims a quiet batch only after the batch's record", "[replica][quiet]") {
  LogQuiet quiet;
  Cluster c(quiet_options());
  const NodeId client = c.client_ids[0];
  c.do_increment(client);
  c.do_increment(client);
  REQUIRE(c.r(0).stats().quiet_batches == 1);
  REQUIRE(count_prepared_records(c.wal[0], 2) == 0);
  // Replicas 1 and 2 time out on a request the primary never sees; the primary joins their view change.
  c.drop = [](const Envelope& e) { return e.from == 0 && !is<ViewChange>(e) && !is<Status>(e); };
  const Request req = c.increment(client);
  c.send(req, 1);
  c.send(req, 2);
  REQUIRE(c.tick_until([&] { return c.r(0).view() == 1; }));
  std::size_t prepared_at = SIZE_MAX, view_at = SIZE_MAX;
  for (std::size_t k = 0; k < c.wal[0].size(); k++) {
    if (const auto* p = std::get_if<PreparedRecord>(&c.wal[0][k]); p && p->seq == 2 && p->view == 0) prepared_at = k;
    if (const auto* v = std::get_if<ViewRecord>(&c.wal[0][k]); v && v->view == 1) view_at = std::min(view_at, k);
  }
  REQUIRE(prepared_at != SIZE_MAX);
  CHECK(prepared_at < view_at);
  bool claimed = false;
  for (const Envelope& e : c.delivered) {
    const auto* vc = std::get_if<ViewChange>(&e.message);
    if (vc == nullptr || e.from != 0) continue;
    for (const PreparedClaim& p : vc->prepared) claimed = claimed || (p.seq == 2 && p.view == 0);
  }
  CHECK(claimed);
  c.drop = nullptr;
  REQUIRE(c.tick_until([&] { return c.r(0).last_committed() == 3 && !c.r(0).in_view_change(); }));
  require_agreement(c, {0, 1, 2, 3});
  CHECK(quiet.new_errors() == 0);
}
