// The PBFT client state machine against replicas faked in the test: the test builds Reply messages directly.
#include <catch2/catch.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "common/crypto.h"
#include "protocol/client.h"

using namespace bftfs;

namespace {

constexpr std::uint32_t kN = 4;
constexpr std::uint32_t kF = 1;
constexpr NodeId kSelf = 4;

struct Keys {
  std::map<NodeId, PublicKeys> pub;
  std::map<NodeId, SecretKeys> sec;
  Keys() {
    for (NodeId id = 0; id <= kSelf + 1; ++id) generate_keys_from_seed(99, id, pub[id], sec[id]);
  }
};

const Keys& keys() {
  static const Keys k;
  return k;
}

struct Fixture {
  explicit Fixture(ClientOptions o = {}) : crypto(kSelf, keys().sec.at(kSelf), keys().pub), options(o) {
    options.n = kN;
    options.f = kF;
    client = std::make_unique<Client>(options, kSelf, crypto, 1234);
  }

  Crypto crypto;
  ClientOptions options;
  std::unique_ptr<Client> client;

  std::vector<Send> sends() { return client->take_effects().sends; }

  static const Request& request_of(const Send& s) { return std::get<Request>(s.message); }

  void reply(NodeId from, std::uint64_t id, const Bytes& result, std::uint8_t flags, bool full = true,
             std::uint64_t view = 0, NodeId client_id = kSelf) {
    Reply r;
    r.view = view;
    r.client = client_id;
    r.request_id = id;
    r.flags = flags;
    r.result_digest = digest_of(result);
    if (full) {
      r.flags |= kReplyHasResult;
      r.result = result;
    }
    client->on_message(from, Message{r});
  }
};

const Bytes kResult = {'o', 'k'};
const Bytes kLie = {'n', 'o'};

}  // namespace

TEST_CASE("client sends a new request to the primary only, with a valid authenticator") {
  Fixture fx;
  const std::uint64_t id = fx.client->submit(Bytes{1, 2, 3});
  CHECK(id == fx.options.first_request_id);
  auto sends = fx.sends();
  REQUIRE(sends.size() == 1);
  CHECK(sends[0].to == 0);  // view 0: replica 0 is the primary
  const Request& r = Fixture::request_of(sends[0]);
  CHECK(r.client == kSelf);
  CHECK(r.request_id == id);
  CHECK_FALSE(r.read_only());
  CHECK(r.replier == 1);  // reply digests: a backup (the primary's successor) sends the full result
  CHECK(r.op == Bytes{1, 2, 3});
  REQUIRE(r.authenticator.size() == kN);
  for (NodeId i = 0; i < kN; ++i) {
    Crypto replica(i, keys().sec.at(i), keys().pub);
    CHECK(replica.verify_mac(kSelf, r.digest().bytes, r.authenticator[i]));
  }
  // Ids increase by one.
  CHECK(fx.client->submit(Bytes{4}) == id + 1);
}

TEST_CASE("client without reply digests asks every replica for the full result") {
  ClientOptions o;
  o.use_reply_digests = false;
  Fixture fx(o);
  fx.client->submit(Bytes{1});
  auto sends = fx.sends();
  REQUIRE(sends.size() == 1);
  CHECK(Fixture::request_of(sends[0]).replier == kReplierAll);
}

TEST_CASE("client completes on f+1 matching committed replies, not on f") {
  Fixture fx;
  const std::uint64_t id = fx.client->submit(Bytes{1});
  fx.reply(0, id, kResult, 0);
  CHECK(fx.client->take_completions().empty());  // f = 1 reply is not enough
  fx.reply(2, id, kResult, 0, /*full=*/false);
  auto done = fx.client->take_completions();
  REQUIRE(done.size() == 1);
  CHECK(done[0].request_id == id);
  CHECK(done[0].result == kResult);
  CHECK_FALSE(done[0].read_only);
  CHECK(fx.client->in_flight() == 0);
  CHECK(fx.client->stats().completed == 1);
  // Late replies to a completed request are ignored and not counted as rejected.
  fx.reply(3, id, kResult, 0);
  CHECK(fx.client->take_completions().empty());
  CHECK(fx.client->stats().replies_rejected == 0);
}

TEST_CASE("client needs 2f+1 matching replies when they are tentative") {
  Fixture fx;
  const std::uint64_t id = fx.client->submit(Bytes{1});
  fx.reply(0, id, kResult, kReplyTentative);
  fx.reply(1, id, kResult, kReplyTentative, false);
  CHECK(fx.client->take_completions().empty());  // f+1 tentative are not enough
  fx.reply(2, id, kResult, kReplyTentative, false);
  auto done = fx.client->take_completions();
  REQUIRE(done.size() == 1);
  CHECK(done[0].result == kResult);
}

TEST_CASE("client counts one vote per replica, and a committed reply supersedes a tentative one") {
  Fixture fx;
  const std::uint64_t id = fx.client->submit(Bytes{1});
  fx.reply(0, id, kResult, kReplyTentative);
  fx.reply(0, id, kResult, kReplyTentative);
  fx.reply(0, id, kResult, 0);
  fx.reply(0, id, kResult, 0);
  CHECK(fx.client->take_completions().empty());  // still one replica
  fx.reply(1, id, kResult, kReplyTentative, false);
  CHECK(fx.client->take_completions().empty());  // 1 committed + 1 tentative: neither rule holds
  fx.reply(1, id, kResult, 0, false);            // replica 1 commits too: f+1 committed
  CHECK(fx.client->take_completions().size() == 1);
}

TEST_CASE("client is not fooled by a lying replica") {
  Fixture fx;
  const std::uint64_t id = fx.client->submit(Bytes{1});
  fx.reply(0, id, kLie, 0);     // the faulty primary, full (false) result
  fx.reply(1, id, kResult, 0);  // a correct replica
  CHECK(fx.client->take_completions().empty());
  fx.reply(0, id, kLie, kReplyTentative);  // repeating itself does not help it
  CHECK(fx.client->take_completions().empty());
  fx.reply(2, id, kResult, 0, false);
  auto done = fx.client->take_completions();
  REQUIRE(done.size() == 1);
  CHECK(done[0].result == kResult);
}

TEST_CASE("client with digest-only replies waits for a full result that matches the certificate") {
  Fixture fx;
  const std::uint64_t id = fx.client->submit(Bytes{1});
  fx.reply(1, id, kResult, 0, false);
  fx.reply(2, id, kResult, 0, false);
  fx.reply(3, id, kLie, 0, true);  // a full result, but not the certified one
  CHECK(fx.client->take_completions().empty());
  fx.reply(0, id, kResult, 0, true);  // the designated replier
  auto done = fx.client->take_completions();
  REQUIRE(done.size() == 1);
  CHECK(done[0].result == kResult);
}

TEST_CASE("client retransmits to all replicas after the timeout, with backoff") {
  ClientOptions o;
  o.retransmit_ticks = 100;
  o.retransmit_ticks_max = 400;
  Fixture fx(o);
  const std::uint64_t id = fx.client->submit(Bytes{1});
  fx.sends();
  // Tick one at a time and note when each retransmission leaves.
  std::vector<std::uint64_t> at;
  for (std::uint64_t t = 1; t <= 1500 && at.size() < 4; ++t) {
    fx.client->on_tick();
    auto sends = fx.sends();
    if (sends.empty()) continue;
    REQUIRE(sends.size() == 1);
    CHECK(sends[0].to == kAllReplicas);
    CHECK(Fixture::request_of(sends[0]).request_id == id);
    CHECK(Fixture::request_of(sends[0]).replier == kReplierAll);  // the replier may be the silent one
    at.push_back(t);
  }
  REQUIRE(at.size() == 4);
  CHECK(fx.client->stats().retransmissions == 4);
  // 100 ± 1/8, then doubled to 200, then capped at 400.
  CHECK(at[0] >= 88);
  CHECK(at[0] <= 112);
  CHECK(at[1] - at[0] >= 175);
  CHECK(at[1] - at[0] <= 225);
  CHECK(at[2] - at[1] >= 350);
  CHECK(at[2] - at[1] <= 450);
  CHECK(at[3] - at[2] >= 350);
  CHECK(at[3] - at[2] <= 450);
}

TEST_CASE("client learns the view from accepted replies and sends to the new primary") {
  Fixture fx;
  const std::uint64_t id = fx.client->submit(Bytes{1});
  fx.sends();
  fx.reply(1, id, kResult, 0, true, 5);
  fx.reply(2, id, kResult, 0, false, 5);
  REQUIRE(fx.client->take_completions().size() == 1);
  CHECK(fx.client->view() == 5);
  fx.client->submit(Bytes{2});
  auto sends = fx.sends();
  REQUIRE(sends.size() == 1);
  CHECK(sends[0].to == 1);  // 5 % 4
  CHECK(Fixture::request_of(sends[0]).replier == 2);  // the new primary's successor
}

TEST_CASE("client moves the designated replier of ordered requests to the next backup after a retransmission") {
  ClientOptions o;
  o.retransmit_ticks = 10;
  Fixture fx(o);
  std::vector<NodeId> repliers;
  for (int round = 0; round < 4; ++round) {
    const std::uint64_t id = fx.client->submit(Bytes{1});
    auto sends = fx.sends();
    REQUIRE(sends.size() == 1);
    repliers.push_back(Fixture::request_of(sends[0]).replier);
    // The replier stays silent: the request times out once, then the other replicas answer in full.
    for (int t = 0; t < 20 && fx.client->stats().retransmissions == static_cast<std::uint64_t>(round); ++t) {
      fx.client->on_tick();
    }
    REQUIRE(fx.client->stats().retransmissions == static_cast<std::uint64_t>(round + 1));
    fx.sends();
    for (NodeId r = 0; r < 3; ++r) fx.reply(r, id, kResult, kReplyTentative);
    REQUIRE(fx.client->take_completions().size() == 1);
  }
  // Never the primary (0); every backup in turn, then around again.
  CHECK(repliers == std::vector<NodeId>{1, 2, 3, 1});
  // A request answered without a retransmission keeps the choice.
  const std::uint64_t id = fx.client->submit(Bytes{2});
  CHECK(Fixture::request_of(fx.sends().at(0)).replier == 2);
  for (NodeId r = 1; r < 4; ++r) fx.reply(r, id, kResult, kReplyTentative);
  REQUIRE(fx.client->take_completions().size() == 1);
  fx.client->submit(Bytes{3});
  CHECK(Fixture::request_of(fx.sends().at(0)).replier == 2);
}

TEST_CASE("client replies from different views do not match") {
  Fixture fx;
  const std::uint64_t id = fx.client->submit(Bytes{1});
  fx.reply(1, id, kResult, 0, true, 5);
  fx.reply(2, id, kResult, 0, false, 6);
  CHECK(fx.client->take_completions().empty());
  CHECK(fx.client->view() == 0);  // one replica's claim of a view is not believed
  fx.reply(3, id, kResult, 0, false, 6);
  auto done = fx.client->take_completions();
  REQUIRE(done.size() == 1);
  CHECK(done[0].view == 6);
  CHECK(fx.client->view() == 6);
}

TEST_CASE("client pipelines up to its window and queues the rest in id order") {
  ClientOptions o;
  o.window = 3;
  Fixture fx(o);
  std::vector<std::uint64_t> ids;
  for (int i = 0; i < 6; ++i) ids.push_back(fx.client->submit(Bytes{static_cast<std::uint8_t>(i)}));
  CHECK(fx.client->in_flight() == 6);
  auto sends = fx.sends();
  REQUIRE(sends.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) CHECK(Fixture::request_of(sends[i]).request_id == ids[i]);
  // Completing the second (out of order) frees a slot, but the fourth id is `window` ahead of the oldest
  // unfinished request: the replicas would call the oldest stale once the fourth executed (sim finding F1).
  fx.reply(0, ids[1], kResult, 0);
  fx.reply(1, ids[1], kResult, 0, false);
  auto done = fx.client->take_completions();
  REQUIRE(done.size() == 1);
  CHECK(done[0].request_id == ids[1]);
  CHECK(fx.sends().empty());
  // Completing the oldest lets the fourth and fifth go, in id order; the sixth is still too far ahead.
  fx.reply(0, ids[0], kResult, 0);
  fx.reply(1, ids[0], kResult, 0, false);
  REQUIRE(fx.client->take_completions().size() == 1);
  sends = fx.sends();
  REQUIRE(sends.size() == 2);
  CHECK(Fixture::request_of(sends[0]).request_id == ids[3]);
  CHECK(Fixture::request_of(sends[1]).request_id == ids[4]);
  // A reply to a queued (unsent) request cannot be genuine.
  fx.reply(0, ids[5], kResult, 0);
  CHECK(fx.client->stats().replies_rejected == 1);
  fx.reply(0, ids[2], kResult, 0);
  fx.reply(1, ids[2], kResult, 0, false);
  sends = fx.sends();
  REQUIRE(sends.size() == 1);
  CHECK(Fixture::request_of(sends[0]).request_id == ids[5]);
  for (std::uint64_t id : {ids[3], ids[4], ids[5]}) {
    fx.reply(0, id, kResult, 0);
    fx.reply(1, id, kResult, 0, false);
  }
  CHECK(fx.client->take_completions().size() == 4);
  CHECK(fx.client->in_flight() == 0);
}

namespace {
// The replicas a batch of sends of one request went to.
std::set<NodeId> destinations(const std::vector<Send>& sends) {
  std::set<NodeId> to;
  for (const Send& s : sends) to.insert(s.to);
  return to;
}
}  // namespace

TEST_CASE("client sends read-only requests to 2f+1 replicas other than the primary and accepts 2f+1 matching") {
  Fixture fx;
  const std::uint64_t id = fx.client->submit(Bytes{7}, /*read_only=*/true);
  auto sends = fx.sends();
  REQUIRE(sends.size() == 2 * kF + 1);
  CHECK(destinations(sends) == std::set<NodeId>{1, 2, 3});  // view 0: replica 0, the primary, is left out
  const Request r = Fixture::request_of(sends[0]);  // a copy: `sends` is reused below
  for (const Send& s : sends) CHECK(Fixture::request_of(s) == r);
  CHECK(r.read_only());
  CHECK(r.replier >= 1);  // the designated replier is one of the replicas asked
  CHECK(r.replier < kN);
  const NodeId a = r.replier;
  const NodeId b = a % 3 + 1;
  const NodeId c = b % 3 + 1;
  fx.reply(a, id, kResult, kReplyReadOnly, true);
  fx.reply(b, id, kResult, kReplyReadOnly, false);
  CHECK(fx.client->take_completions().empty());  // f+1 is not enough for a read
  // An ordered-style reply to a read-only request is not a vote.
  fx.reply(c, id, kResult, 0, false);
  CHECK(fx.client->stats().replies_rejected == 1);
  CHECK(fx.client->take_completions().empty());
  fx.reply(c, id, kResult, kReplyReadOnly, false);
  auto done = fx.client->take_completions();
  REQUIRE(done.size() == 1);
  CHECK(done[0].request_id == id);
  CHECK(done[0].read_only);
  CHECK(done[0].result == kResult);
  // The next read-only request designates another replier, again among the replicas asked.
  fx.client->submit(Bytes{7}, true);
  sends = fx.sends();
  REQUIRE(sends.size() == 2 * kF + 1);
  CHECK(Fixture::request_of(sends[0]).replier != r.replier);
  CHECK(destinations(sends).count(Fixture::request_of(sends[0]).replier) == 1);
}

TEST_CASE("client leaves a replica that failed a read-only request out of the next ones") {
  SECTION("silent: the read times out") {
    Fixture fx;
    const std::uint64_t id = fx.client->submit(Bytes{7}, true);
    CHECK(destinations(fx.sends()) == std::set<NodeId>{1, 2, 3});
    fx.reply(1, id, kResult, kReplyReadOnly);
    fx.reply(3, id, kResult, kReplyReadOnly, false);
    for (int t = 0; t < 200 && fx.client->stats().read_only_fallbacks == 0; ++t) fx.client->on_tick();
    CHECK(fx.client->stats().read_only_fallbacks == 1);
    fx.sends();  // the ordered fallback
    fx.client->submit(Bytes{8}, true);
    CHECK(destinations(fx.sends()) == std::set<NodeId>{0, 1, 3});  // replica 2 was silent
  }
  SECTION("lying: its reply is in the minority") {
    Fixture fx;
    const std::uint64_t id = fx.client->submit(Bytes{7}, true);
    fx.sends();
    fx.reply(1, id, kResult, kReplyReadOnly);
    fx.reply(3, id, kResult, kReplyReadOnly, false);
    CHECK(fx.client->stats().read_only_fallbacks == 0);
    CHECK(fx.client->take_completions().empty());  // 2 < 2f+1
    fx.reply(2, id, kLie, kReplyReadOnly, false);
    // 2 vs 1 among those asked: the replica left out (the primary) is asked too, for the full result.
    CHECK(fx.client->stats().read_only_fallbacks == 0);
    CHECK(fx.client->stats().read_only_widened == 1);
    auto sends = fx.sends();
    REQUIRE(sends.size() == 1);
    CHECK(sends[0].to == 0);
    CHECK(Fixture::request_of(sends[0]).replier == kReplierAll);
    fx.reply(0, id, kResult, kReplyReadOnly);
    auto done = fx.client->take_completions();
    REQUIRE(done.size() == 1);
    CHECK(done[0].result == kResult);
    CHECK(done[0].read_only);
    fx.client->submit(Bytes{8}, true);
    CHECK(destinations(fx.sends()) == std::set<NodeId>{0, 1, 3});
  }
  SECTION("lying, and the replica left out does not agree either: ordering") {
    Fixture fx;
    const std::uint64_t id = fx.client->submit(Bytes{7}, true);
    fx.sends();
    fx.reply(1, id, kResult, kReplyReadOnly);
    fx.reply(2, id, kLie, kReplyReadOnly, false);
    // 1 vs 1 and one silent cannot make 2f+1 among those asked: replica 0 is asked at once.
    CHECK(fx.sends().size() == 1);
    CHECK(fx.client->stats().read_only_widened == 1);
    fx.reply(3, id, kResult, kReplyReadOnly, false);
    CHECK(fx.client->stats().read_only_fallbacks == 0);  // 2 + replica 0 may still make it
    fx.reply(0, id, kLie, kReplyReadOnly);
    CHECK(fx.client->stats().read_only_fallbacks == 1);
    CHECK(fx.client->take_completions().empty());
    auto sends = fx.sends();
    REQUIRE(sends.size() == 1);
    CHECK_FALSE(Fixture::request_of(sends[0]).read_only());
  }
}

TEST_CASE("client falls back to an ordered request when read-only replies disagree") {
  Fixture fx;
  const std::uint64_t id = fx.client->submit(Bytes{7}, true);
  fx.sends();
  fx.reply(0, id, kResult, kReplyReadOnly);
  fx.reply(1, id, kResult, kReplyReadOnly);
  fx.reply(2, id, kLie, kReplyReadOnly);
  CHECK(fx.client->take_completions().empty());
  CHECK(fx.sends().empty());  // 2 + 1 silent could still make 2f+1
  fx.reply(3, id, kLie, kReplyReadOnly);
  // 2 vs 2 with everyone heard: no value can reach 2f+1; re-sent through ordering with a new id.
  CHECK(fx.client->stats().read_only_fallbacks == 1);
  auto sends = fx.sends();
  REQUIRE(sends.size() == 1);
  CHECK(sends[0].to == 0);
  const Request& r = Fixture::request_of(sends[0]);
  CHECK_FALSE(r.read_only());
  CHECK(r.request_id > id);
  CHECK(r.op == Bytes{7});
  // Late read-only replies to the old id change nothing.
  fx.reply(0, id, kResult, kReplyReadOnly);
  CHECK(fx.client->take_completions().empty());
  CHECK(fx.client->stats().replies_rejected == 0);

  fx.reply(0, r.request_id, kResult, 0);
  fx.reply(3, r.request_id, kResult, 0, false);
  auto done = fx.client->take_completions();
  REQUIRE(done.size() == 1);
  CHECK(done[0].request_id == id);  // the caller's id
  CHECK_FALSE(done[0].read_only);
  CHECK(done[0].result == kResult);
  CHECK(fx.client->in_flight() == 0);
}

TEST_CASE("client falls back to an ordered request when a read-only request times out") {
  ClientOptions o;
  o.window = 1;
  Fixture fx(o);
  const std::uint64_t ro = fx.client->submit(Bytes{7}, true);
  const std::uint64_t next = fx.client->submit(Bytes{8});  // queued behind it
  CHECK(fx.sends().size() == 2 * kF + 1);
  fx.reply(0, ro, kResult, kReplyReadOnly);
  for (int t = 0; t < 200 && fx.client->stats().read_only_fallbacks == 0; ++t) fx.client->on_tick();
  CHECK(fx.client->stats().read_only_fallbacks == 1);
  // The fallback goes behind the queued request, so requests still leave in increasing id order.
  auto sends = fx.sends();
  REQUIRE(sends.size() == 1);
  CHECK(Fixture::request_of(sends[0]).request_id == next);
  fx.reply(0, next, kResult, 0);
  fx.reply(1, next, kResult, 0, false);
  sends = fx.sends();
  REQUIRE(sends.size() == 1);
  const Request& fallback = Fixture::request_of(sends[0]);
  CHECK(fallback.request_id > next);
  CHECK_FALSE(fallback.read_only());
  fx.reply(0, fallback.request_id, kLie, 0);
  fx.reply(1, fallback.request_id, kLie, 0, false);
  auto done = fx.client->take_completions();
  REQUIRE(done.size() == 2);
  CHECK(done[0].request_id == next);
  CHECK(done[1].request_id == ro);
  CHECK(done[1].result == kLie);
}

TEST_CASE("client counts invalid replies as rejected and ignores speculative ones for certificates") {
  Fixture fx;
  const std::uint64_t id = fx.client->submit(Bytes{1});
  fx.reply(0, id, kResult, 0, true, 0, /*client_id=*/kSelf + 1);  // someone else's
  fx.reply(0, id + 100, kResult, 0);                              // an id never issued
  fx.reply(9, id, kResult, 0);                                    // not a replica
  Reply bad;
  bad.client = kSelf;
  bad.request_id = id;
  bad.flags = kReplyHasResult;
  bad.result = kResult;
  bad.result_digest = digest_of(kLie);  // result does not hash to its digest
  fx.client->on_message(1, Message{bad});
  fx.client->on_message(1, Message{Prepare{}});
  CHECK(fx.client->stats().replies_rejected == 5);

  // PBFT-CS early replies are predictions, not votes.
  fx.reply(0, id, kResult, kReplySpeculative);
  fx.reply(1, id, kResult, kReplySpeculative, false);
  fx.reply(2, id, kResult, kReplySpeculative, false);
  CHECK(fx.client->take_completions().empty());
  // But the speculative full result can serve once a certificate forms.
  fx.reply(1, id, kResult, 0, false);
  fx.reply(2, id, kResult, 0, false);
  CHECK(fx.client->take_completions().size() == 1);
}

TEST_CASE("client wants replies to pending requests only, and keeps unknown ids to be checked") {
  Fixture fx;
  const std::uint64_t id = fx.client->submit(Bytes{1});
  (void)fx.sends();
  CHECK(fx.client->wants_reply(id));
  CHECK(fx.client->wants_reply(id + 1));   // never issued: authenticated and counted as a rejection
  CHECK(fx.client->wants_reply(id - 1));   // below the first id: the same
  for (NodeId r = 0; r <= kF; ++r) fx.reply(r, id, kResult, 0);  // f+1 committed replies: complete
  REQUIRE(fx.client->take_completions().size() == 1);
  CHECK_FALSE(fx.client->wants_reply(id));  // the late replies of the slower replicas are dropped unread
  const std::uint64_t rejected = fx.client->stats().replies_rejected;
  fx.reply(3, id, kResult, 0);  // and would be ignored anyway, without counting as a rejection
  CHECK(fx.client->stats().replies_rejected == rejected);
  CHECK(fx.client->take_completions().empty());
}

TEST_CASE("client names the ordered request issued before each request as its predecessor", "[client][order]") {
  ClientOptions o;
  o.window = 8;
  Fixture fx(o);
  const std::uint64_t a = fx.client->submit(Bytes{1});
  const std::uint64_t read = fx.client->submit(Bytes{2}, true);
  const std::uint64_t b = fx.client->submit(Bytes{3});
  std::map<std::uint64_t, Request> sent;
  for (const Send& s : fx.sends()) {
    const Request& r = Fixture::request_of(s);
    sent[r.request_id] = r;
    // The authenticator covers the predecessor (it is part of the digest).
    REQUIRE(r.authenticator.size() == kN);
    CHECK(fx.crypto.verify_mac(0, r.digest().bytes, r.authenticator[0]));
  }
  REQUIRE(sent.size() == 3);
  CHECK(sent.at(a).prev_request_id == 0);  // the first request of this incarnation
  CHECK(sent.at(read).prev_request_id == a);  // a read waits for the write before it
  CHECK(sent.at(b).prev_request_id == a);     // ids have a gap: the read is never ordered
  // The read falls back to ordering with a new id, after everything issued so far.
  fx.reply(0, read, kResult, kReplyReadOnly);
  fx.reply(1, read, kLie, kReplyReadOnly);
  fx.reply(2, read, {'x'}, kReplyReadOnly);
  fx.reply(3, read, {'y'}, kReplyReadOnly);
  REQUIRE(fx.client->stats().read_only_fallbacks == 1);
  auto sends = fx.sends();
  REQUIRE(sends.size() == 1);
  const Request again = Fixture::request_of(sends[0]);  // a copy: `sends` is reassigned below
  CHECK(again.request_id > b);
  CHECK(again.prev_request_id == b);
  const std::uint64_t c = fx.client->submit(Bytes{4});
  sends = fx.sends();
  REQUIRE(sends.size() == 1);
  CHECK(Fixture::request_of(sends[0]).request_id == c);
  CHECK(Fixture::request_of(sends[0]).prev_request_id == again.request_id);
}

// Retransmission under load (client.h, "Retransmission"): the replicas execute a client's ordered requests in
// issue order, so only the oldest in flight can be late; the others' timers start when they become the oldest.
TEST_CASE("client runs the retransmission timer of its oldest ordered request only", "[client][retransmit]") {
  ClientOptions o;
  o.window = 8;
  o.retransmit_ticks = 100;
  o.retransmit_ticks_max = 400;
  Fixture fx(o);
  std::vector<std::uint64_t> ids;
  for (int i = 0; i < 4; ++i) ids.push_back(fx.client->submit(Bytes{static_cast<std::uint8_t>(i)}));
  const std::uint64_t read = fx.client->submit(Bytes{9}, true);  // waits for ids[3] at the replicas
  REQUIRE(fx.sends().size() == 4 + 2 * kF + 1);
  // Nobody answers for 1000 ticks: only the oldest is sent again, with backoff (after 100, 200, 400 ± 1/8).
  std::vector<std::uint64_t> resent;
  for (int t = 0; t < 1000; ++t) {
    fx.client->on_tick();
    for (const Send& s : fx.sends()) {
      CHECK(s.to == kAllReplicas);
      resent.push_back(Fixture::request_of(s).request_id);
    }
  }
  CHECK(resent == std::vector<std::uint64_t>{ids[0], ids[0], ids[0]});
  CHECK(fx.client->stats().read_only_fallbacks == 0);  // the read is not late either: its predecessor is
  // The oldest completes: the next one's timer starts now, at the first timeout again (not 100 ticks ago).
  fx.reply(0, ids[0], kResult, 0);
  fx.reply(1, ids[0], kResult, 0, false);
  REQUIRE(fx.client->take_completions().size() == 1);
  int waited = 0;
  while (fx.client->stats().retransmissions == 3 && waited < 1000) {
    fx.client->on_tick();
    ++waited;
  }
  CHECK(waited >= 88);
  CHECK(waited <= 113);
  auto sends = fx.sends();
  REQUIRE(sends.size() == 1);
  CHECK(Fixture::request_of(sends[0]).request_id == ids[1]);
  // Once every ordered request completed, the read's own timer runs (and its timeout makes it fall back).
  for (std::size_t i = 1; i < ids.size(); ++i) {
    fx.reply(0, ids[i], kResult, 0);
    fx.reply(1, ids[i], kResult, 0, false);
  }
  REQUIRE(fx.client->take_completions().size() == 3);
  for (int t = 0; t < 150 && fx.client->stats().read_only_fallbacks == 0; ++t) fx.client->on_tick();
  CHECK(fx.client->stats().read_only_fallbacks == 1);
  (void)read;
}

TEST_CASE("client sends its ordered requests in flight to the primary of a new view it learns",
          "[client][retransmit]") {
  ClientOptions o;
  o.window = 8;
  Fixture fx(o);
  const std::uint64_t a = fx.client->submit(Bytes{1});
  const std::uint64_t b = fx.client->submit(Bytes{2});
  const std::uint64_t c = fx.client->submit(Bytes{3});
  for (const Send& s : fx.sends()) CHECK(s.to == 0);
  // a completes in view 1 (a certificate: the old primary's queue is gone): b and c go to replica 1 at once.
  fx.reply(2, a, kResult, 0, true, 1);
  fx.reply(3, a, kResult, 0, false, 1);
  REQUIRE(fx.client->take_completions().size() == 1);
  auto sends = fx.sends();
  REQUIRE(sends.size() == 2);
  CHECK(sends[0].to == 1);
  CHECK(Fixture::request_of(sends[0]).request_id == b);
  CHECK(sends[1].to == 1);
  CHECK(Fixture::request_of(sends[1]).request_id == c);
  CHECK(fx.client->stats().resent_new_view == 2);
  CHECK(fx.client->stats().retransmissions == 0);
  // One replica's word for a view is not a certificate: nothing moves.
  fx.reply(3, b, kResult, 0, true, 2);
  CHECK(fx.sends().empty());
}
