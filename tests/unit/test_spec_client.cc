// The PBFT-CS client library (relay/spec_client.h) against replicas faked in the test: the test builds the
// Reply messages (with shim result envelopes) directly.
#include <catch2/catch.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "common/crypto.h"
#include "relay/spec_client.h"
#include "shim/envelope.h"

using namespace bftfs;

namespace {

constexpr std::uint32_t kN = 4;
constexpr NodeId kSelf = 4;

struct Keys {
  std::map<NodeId, PublicKeys> pub;
  std::map<NodeId, SecretKeys> sec;
  Keys() {
    for (NodeId id = 0; id <= kSelf; ++id) generate_keys_from_seed(77, id, pub[id], sec[id]);
  }
};

const Keys& keys() {
  static const Keys k;
  return k;
}

Bytes executed(const Bytes& inner) { return shim::encode_envelope_result(shim::ShimStatus::kExecuted, inner); }

struct Fixture {
  explicit Fixture(SpecClientOptions o = {}) : crypto(kSelf, keys().sec.at(kSelf), keys().pub), options(o) {
    options.client.n = kN;
    options.client.f = 1;
    client = std::make_unique<SpecClient>(options, kSelf, crypto, 99);
  }

  Crypto crypto;
  SpecClientOptions options;
  std::unique_ptr<SpecClient> client;

  void reply(NodeId from, std::uint64_t id, const Bytes& result, std::uint8_t flags) {
    Reply r;
    r.client = kSelf;
    r.request_id = id;
    r.flags = static_cast<std::uint8_t>(flags | kReplyHasResult);
    r.result_digest = digest_of(result);
    r.result = result;
    client->on_message(from, Message{r});
  }
  void early(std::uint64_t id, const Bytes& result) { reply(0, id, result, kReplySpeculative); }
  // f+1 = 2 committed replies from backups: the consensus.
  void consensus(std::uint64_t id, const Bytes& result) {
    reply(1, id, result, 0);
    reply(2, id, result, 0);
  }
  // The predicates of the last request sent.
  std::vector<shim::Dependency> last_predicates() {
    std::vector<shim::Dependency> deps;
    for (const Send& s : client->take_effects().sends) {
      const auto& r = std::get<Request>(s.message);
      shim::ShimRequest sr;
      REQUIRE(shim::decode_envelope(r.op, sr) == shim::EnvelopeError::kOk);
      deps = sr.deps;
    }
    return deps;
  }
};

}  // namespace

TEST_CASE("spec client: the early reply is the first event and a matching consensus commits it", "[spec]") {
  Fixture fx;
  const std::uint64_t id = fx.client->submit(Bytes{1}, {});
  CHECK(fx.last_predicates().empty());
  fx.early(id, executed({7}));
  auto ev = fx.client->take_events();
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].kind == SpecEventKind::kFirst);
  CHECK(ev[0].result == Bytes{7});
  CHECK(ev[0].from == 0);
  CHECK(fx.client->in_flight() == 1);
  fx.consensus(id, executed({7}));
  ev = fx.client->take_events();
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].kind == SpecEventKind::kCommit);
  CHECK(ev[0].status == shim::ShimStatus::kExecuted);
  CHECK(ev[0].result == Bytes{7});
  CHECK(fx.client->in_flight() == 0);
  CHECK(fx.client->stats().commits == 1);
}

TEST_CASE("spec client: a consensus that differs from the first reply rolls back with the correct result", "[spec]") {
  Fixture fx;
  const std::uint64_t id = fx.client->submit(Bytes{1}, {});
  fx.early(id, executed({6}));  // the primary lies
  REQUIRE(fx.client->take_events().size() == 1);
  fx.consensus(id, executed({7}));
  auto ev = fx.client->take_events();
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].kind == SpecEventKind::kRollback);
  CHECK(ev[0].result == Bytes{7});
  CHECK(fx.client->stats().rollbacks == 1);
  CHECK(fx.client->stats().first_mismatches == 1);
}

TEST_CASE("spec client: the early reply alone never completes an operation", "[spec]") {
  Fixture fx;
  const std::uint64_t id = fx.client->submit(Bytes{1}, {});
  fx.early(id, executed({7}));
  fx.reply(1, id, executed({7}), 0);  // one committed reply: with the early one that is f+1 replicas, not f+1 votes
  auto ev = fx.client->take_events();
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].kind == SpecEventKind::kFirst);
  CHECK(fx.client->in_flight() == 1);
}

TEST_CASE("spec client: a dependent request predicates on the first reply, not on a final one", "[spec]") {
  Fixture fx;
  const std::uint64_t a = fx.client->submit(Bytes{1}, {});
  fx.client->take_effects();
  fx.early(a, executed({7}));
  fx.client->take_events();
  const SpecDependency on_a{a, std::nullopt};
  const std::uint64_t b = fx.client->submit(Bytes{2}, {&on_a, 1});
  auto preds = fx.last_predicates();
  REQUIRE(preds.size() == 1);
  CHECK(preds[0].request_id == a);
  CHECK(preds[0].result_digest == digest_of(executed({7})));
  // Once the caller took a's final event, a is a fact: no predicate.
  fx.consensus(a, executed({7}));
  fx.client->take_events();
  const std::uint64_t c = fx.client->submit(Bytes{3}, {&on_a, 1});
  CHECK(fx.last_predicates().empty());
  CHECK(b < c);
}

TEST_CASE("spec client: a dependency whose final event was taken is judged by its consensus, not dropped", "[spec]") {
  Fixture fx;
  const std::uint64_t a = fx.client->submit(Bytes{1}, {});
  fx.client->take_effects();
  fx.early(a, executed({6}));  // the primary lies
  fx.client->take_events();
  fx.consensus(a, executed({7}));
  auto ev = fx.client->take_events();
  REQUIRE(ev.size() == 1);
  REQUIRE(ev[0].kind == SpecEventKind::kRollback);
  // The caller acted on the first reply and, before it looked at the rollback, submits b relying on it: b can
  // never execute, so it carries the failing predicate and its first reply is withheld.
  const SpecDependency on_a{a, std::nullopt};
  const std::uint64_t b = fx.client->submit(Bytes{2}, {&on_a, 1});
  auto preds = fx.last_predicates();
  REQUIRE(preds.size() == 1);
  CHECK(preds[0].request_id == a);
  CHECK(preds[0].result_digest == digest_of(executed({6})));
  fx.early(b, executed({8}));
  CHECK(fx.client->take_events().empty());
  CHECK(fx.client->stats().first_withheld_doomed == 1);
  const Bytes retry = shim::encode_envelope_result(shim::ShimStatus::kRetryPredicateFailed, {});
  fx.consensus(b, retry);
  ev = fx.client->take_events();
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].kind == SpecEventKind::kCommit);
  CHECK(ev[0].status == shim::ShimStatus::kRetryPredicateFailed);
  // A 0-reply prediction of a settled operation is judged the same way: the consensus holds, a guess does not.
  const SpecDependency right{a, Bytes{7}};
  fx.client->submit(Bytes{3}, {&right, 1});
  CHECK(fx.last_predicates().empty());
  const SpecDependency wrong{a, Bytes{5}};
  fx.client->submit(Bytes{4}, {&wrong, 1});
  preds = fx.last_predicates();
  REQUIRE(preds.size() == 1);
  CHECK(preds[0].result_digest == digest_of(executed({5})));
}

TEST_CASE("spec client: a dependency whose consensus is known and matches needs no predicate", "[spec]") {
  Fixture fx;
  const std::uint64_t a = fx.client->submit(Bytes{1}, {});
  fx.client->take_effects();
  fx.early(a, executed({7}));
  fx.client->take_events();
  // The consensus arrives but the caller has not taken it yet when it submits b: a is already a fact, and a
  // predicate on it could only fail spuriously later (the shim's log truncation).
  fx.consensus(a, executed({7}));
  const SpecDependency on_a{a, std::nullopt};
  fx.client->submit(Bytes{2}, {&on_a, 1});
  CHECK(fx.last_predicates().empty());
  // And one that was never speculated on: the caller can only know its consensus.
  const std::uint64_t c = fx.client->submit(Bytes{3}, {});
  fx.client->take_effects();
  fx.consensus(c, executed({9}));
  fx.client->take_events();
  const SpecDependency on_c{c, std::nullopt};
  fx.client->submit(Bytes{4}, {&on_c, 1});
  CHECK(fx.last_predicates().empty());
}

TEST_CASE("spec client: the last finals_remembered settled operations are still judged", "[spec]") {
  SpecClientOptions o;
  o.finals_remembered = 2;
  o.failure_window = 0;  // keep speculating on a primary that always lies
  Fixture fx(o);
  std::vector<std::uint64_t> ids;
  for (std::uint8_t k = 0; k < 3; ++k) {
    ids.push_back(fx.client->submit(Bytes{k}, {}));
    fx.client->take_effects();
    fx.early(ids.back(), executed({6}));
    fx.consensus(ids.back(), executed({7}));
    fx.client->take_events();
  }
  // The two most recent are still judged (their first replies were wrong): failing predicates.
  for (std::size_t k = 1; k < 3; ++k) {
    const SpecDependency dep{ids[k], std::nullopt};
    fx.client->submit(Bytes{9}, {&dep, 1});
    CHECK(fx.last_predicates().size() == 1);
  }
}

TEST_CASE("spec client: a 0-reply prediction predicates on the predicted result envelope", "[spec]") {
  Fixture fx;
  const std::uint64_t a = fx.client->submit(Bytes{1}, {});
  fx.client->take_effects();
  const SpecDependency predicted{a, Bytes{0}};
  fx.client->submit(Bytes{2}, {&predicted, 1});
  auto preds = fx.last_predicates();
  REQUIRE(preds.size() == 1);
  CHECK(preds[0].result_digest == digest_of(executed({0})));
}

TEST_CASE("spec client: what relies on a mispredicted reply is doomed and gets no first reply", "[spec]") {
  Fixture fx;
  const std::uint64_t a = fx.client->submit(Bytes{1}, {});
  fx.early(a, executed({6}));
  fx.client->take_events();
  const SpecDependency on_a{a, std::nullopt};
  const std::uint64_t b = fx.client->submit(Bytes{2}, {&on_a, 1});
  fx.early(b, executed({8}));
  fx.client->take_events();  // b's first reply was delivered before anyone knew
  const SpecDependency on_b{b, std::nullopt};
  const std::uint64_t c = fx.client->submit(Bytes{3}, {&on_b, 1});
  fx.consensus(a, executed({7}));  // a was mispredicted: b and c are doomed
  auto ev = fx.client->take_events();
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].kind == SpecEventKind::kRollback);
  fx.early(c, executed({9}));
  CHECK(fx.client->take_events().empty());
  CHECK(fx.client->stats().first_withheld_doomed == 1);
  // The replicas turn b and c into no-ops: b's first reply was delivered, so it rolls back; c commits a retry.
  const Bytes retry = shim::encode_envelope_result(shim::ShimStatus::kRetryPredicateFailed, {});
  fx.consensus(b, retry);
  fx.consensus(c, retry);
  ev = fx.client->take_events();
  REQUIRE(ev.size() == 2);
  CHECK(ev[0].kind == SpecEventKind::kRollback);
  CHECK(ev[0].status == shim::ShimStatus::kRetryPredicateFailed);
  CHECK(ev[1].kind == SpecEventKind::kCommit);
  CHECK(ev[1].status == shim::ShimStatus::kRetryPredicateFailed);
  CHECK(fx.client->stats().retries == 2);
}

TEST_CASE("spec client: without speculation no first reply is delivered", "[spec]") {
  SpecClientOptions o;
  o.speculate = false;
  Fixture fx(o);
  const std::uint64_t id = fx.client->submit(Bytes{1}, {});
  fx.early(id, executed({7}));
  CHECK(fx.client->take_events().empty());
  fx.consensus(id, executed({7}));
  auto ev = fx.client->take_events();
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].kind == SpecEventKind::kCommit);
}

TEST_CASE("spec client: a primary failing more than 1% of its last n early replies is not speculated on", "[spec]") {
  SpecClientOptions o;
  o.failure_window = 100;
  o.failure_permille_max = 10;
  o.client.window = 64;
  Fixture fx(o);
  auto run = [&](bool lie) -> bool {  // returns whether the first reply was delivered
    const std::uint64_t id = fx.client->submit(Bytes{1}, {});
    fx.client->take_effects();
    fx.early(id, executed({static_cast<std::uint8_t>(lie ? 6 : 7)}));
    bool delivered = false;
    for (const auto& e : fx.client->take_events()) delivered = delivered || e.kind == SpecEventKind::kFirst;
    fx.consensus(id, executed({7}));
    fx.client->take_events();
    return delivered;
  };
  CHECK(run(true));  // one failure among the first replies seen is not "more than 1% of the last 100"
  CHECK(fx.client->trusts(0));
  for (int i = 0; i < 100; ++i) REQUIRE(run(false));
  CHECK(run(true));   // 1 failure in the last 100: exactly 1%, still trusted
  CHECK(fx.client->trusts(0));
  CHECK(run(true));   // delivered (the rate is judged before the reply), but now 2 in 100
  CHECK_FALSE(fx.client->trusts(0));
  CHECK_FALSE(run(false));  // withheld, still tracked
  CHECK(fx.client->stats().first_withheld_distrusted == 1);
  // The failures age out of the window of 100, and speculation resumes.
  int withheld = 0;
  for (int i = 0; i < 100; ++i) withheld += run(false) ? 0 : 1;
  CHECK(fx.client->trusts(0));
  CHECK(withheld > 0);
  CHECK(withheld < 100);
}

TEST_CASE("spec client: with a failure window of 0 the primary is always trusted, and every comparison counted",
          "[spec]") {
  SpecClientOptions o;
  o.failure_window = 0;
  o.client.window = 64;
  Fixture fx(o);
  for (int i = 0; i < 30; ++i) {
    const std::uint64_t id = fx.client->submit(Bytes{1}, {});
    fx.client->take_effects();
    fx.early(id, executed({6}));  // always wrong
    bool delivered = false;
    for (const auto& e : fx.client->take_events()) delivered = delivered || e.kind == SpecEventKind::kFirst;
    REQUIRE(delivered);
    fx.consensus(id, executed({7}));
    fx.client->take_events();
    REQUIRE(fx.client->trusts(0));
  }
  CHECK(fx.client->first_compared(0) == 30);
  CHECK(fx.client->first_mismatched(0) == 30);
  CHECK(fx.client->first_compared(1) == 0);
  CHECK(fx.client->first_mismatched(1) == 0);
  CHECK(fx.client->first_compared(kN) == 0);  // outside the configuration
  CHECK(fx.client->stats().first_withheld_distrusted == 0);
}

TEST_CASE("spec client: a read goes through agreement while the client's own writes are uncommitted", "[spec]") {
  Fixture fx;
  auto sent_read_only = [&] {
    bool ro = false;
    for (const Send& s : fx.client->take_effects().sends) ro = std::get<Request>(s.message).read_only();
    return ro;
  };
  fx.client->submit(Bytes{9}, {}, true);
  CHECK(sent_read_only());  // nothing uncommitted: optimized
  const std::uint64_t w = fx.client->submit(Bytes{1}, {});
  fx.client->take_effects();
  fx.client->submit(Bytes{9}, {}, true);
  CHECK_FALSE(sent_read_only());  // a write in flight: ordered, so the read sees it (§3.3)
  CHECK(fx.client->stats().reads_ordered == 1);
  fx.consensus(w, executed({7}));
  fx.client->take_events();
  fx.client->submit(Bytes{9}, {}, true);
  // The write committed, but the read sent through agreement is itself an ordered operation in flight; the
  // library does not know which ordered operations write, so it stays conservative until that one is final too.
  CHECK_FALSE(sent_read_only());
  CHECK(fx.client->stats().reads_ordered == 2);
}
