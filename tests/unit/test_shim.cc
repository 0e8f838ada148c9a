// The PBFT-CS shim: the predicated-request envelope (shim/envelope.h) and the Service wrapper (shim/shim.h)
// over the real counter service.
#include <catch2/catch.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "common/codec.h"
#include "common/crypto.h"
#include "common/log.h"
#include "common/prng.h"
#include "services/counter_service.h"
#include "services/null_service.h"
#include "shim/envelope.h"
#include "shim/shim.h"

using namespace bftfs;
using namespace bftfs::shim;

namespace {

Digest digest_with(std::uint8_t b) {
  Digest d;
  d.bytes.fill(b);
  return d;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Envelope
// ---------------------------------------------------------------------------------------------------------------

TEST_CASE("envelope request round-trips with and without dependencies", "[shim]") {
  for (std::size_t deps : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{kDependenciesMax}}) {
    for (const Bytes& op : {Bytes{}, Bytes{1}, Bytes{2, 3, 4, 5, 6, 7, 8, 9, 10}}) {
      ShimRequest req;
      for (std::size_t i = 0; i < deps; ++i) {
        req.deps.push_back(Dependency{0x0102030405060708ull + i, digest_with(static_cast<std::uint8_t>(i))});
      }
      req.op = op;
      const Bytes bytes = encode_envelope(req);
      CHECK(bytes.size() == kRequestHeaderBytes + deps * kDependencyBytes + op.size());
      ShimRequest back;
      REQUIRE(decode_envelope(bytes, back) == EnvelopeError::kOk);
      CHECK(back == req);
      // The span form gives the same and views the op in place.
      std::vector<Dependency> dv;
      std::span<const std::uint8_t> view;
      REQUIRE(decode_envelope(bytes, dv, view) == EnvelopeError::kOk);
      CHECK(dv == req.deps);
      CHECK(Bytes(view.begin(), view.end()) == op);
      if (!op.empty()) CHECK(view.data() == bytes.data() + bytes.size() - op.size());
      // Both encoders agree.
      CHECK(encode_envelope(req.deps, req.op) == bytes);
    }
  }
}

TEST_CASE("envelope request wire form is little-endian with the documented layout", "[shim]") {
  const Bytes bytes = encode_envelope(std::vector<Dependency>{{0x1122334455667788ull, digest_with(0xAB)}}, Bytes{0xEE});
  REQUIRE(bytes.size() == 4 + 40 + 1);
  CHECK(bytes[0] == kEnvelopeVersion);
  CHECK(bytes[1] == 0);     // flags
  CHECK(bytes[2] == 1);     // dep_count, low byte first
  CHECK(bytes[3] == 0);
  CHECK(bytes[4] == 0x88);  // request id, low byte first
  CHECK(bytes[11] == 0x11);
  CHECK(bytes[12] == 0xAB);  // digest
  CHECK(bytes[43] == 0xAB);
  CHECK(bytes[44] == 0xEE);  // the inner op
}

TEST_CASE("envelope decode reports every error precisely", "[shim]") {
  const Bytes good = encode_envelope(std::vector<Dependency>{{7, digest_with(1)}, {9, digest_with(2)}}, Bytes{1, 2});
  ShimRequest out;
  REQUIRE(decode_envelope(good, out) == EnvelopeError::kOk);

  SECTION("shorter than the header") {
    for (std::size_t len = 0; len < kRequestHeaderBytes; ++len) {
      CHECK(decode_envelope(std::span(good).first(len), out) == EnvelopeError::kTooShort);
    }
  }
  SECTION("a version other than 1") {
    for (std::uint8_t v : {std::uint8_t{0}, std::uint8_t{2}, std::uint8_t{255}}) {
      Bytes bad = good;
      bad[0] = v;
      CHECK(decode_envelope(bad, out) == EnvelopeError::kBadVersion);
    }
  }
  SECTION("any flag bit set") {
    for (int bit = 0; bit < 8; ++bit) {
      Bytes bad = good;
      bad[1] = static_cast<std::uint8_t>(1u << bit);
      CHECK(decode_envelope(bad, out) == EnvelopeError::kBadFlags);
    }
  }
  SECTION("more dependencies than kDependenciesMax, even with the bytes present") {
    Bytes bad = Bytes{kEnvelopeVersion, 0, 0, 0};
    const auto count = static_cast<std::uint16_t>(kDependenciesMax + 1);
    bad[2] = static_cast<std::uint8_t>(count & 0xFF);
    bad[3] = static_cast<std::uint8_t>(count >> 8);
    bad.resize(bad.size() + count * kDependencyBytes, 0);
    CHECK(decode_envelope(bad, out) == EnvelopeError::kTooManyDependencies);
    bad[2] = 0xFF;
    bad[3] = 0xFF;
    CHECK(decode_envelope(bad, out) == EnvelopeError::kTooManyDependencies);
  }
  SECTION("a dependency list that runs past the end") {
    // Every cut inside the two dependencies; cuts in the op are valid requests with a shorter op.
    for (std::size_t len = kRequestHeaderBytes; len < kRequestHeaderBytes + 2 * kDependencyBytes; ++len) {
      CHECK(decode_envelope(std::span(good).first(len), out) == EnvelopeError::kTruncatedDependencies);
    }
    CHECK(decode_envelope(std::span(good).first(kRequestHeaderBytes + 2 * kDependencyBytes), out) == EnvelopeError::kOk);
    CHECK(out.op.empty());
  }
  SECTION("the checks run in header order: version before flags before count") {
    Bytes bad = good;
    bad[0] = 9;
    bad[1] = 1;
    bad[2] = 0xFF;
    CHECK(decode_envelope(bad, out) == EnvelopeError::kBadVersion);
    bad[0] = kEnvelopeVersion;
    CHECK(decode_envelope(bad, out) == EnvelopeError::kBadFlags);
  }
}

TEST_CASE("envelope decode errors and statuses have names", "[shim]") {
  for (EnvelopeError e : {EnvelopeError::kOk, EnvelopeError::kTooShort, EnvelopeError::kBadVersion, EnvelopeError::kBadFlags,
                        EnvelopeError::kTooManyDependencies, EnvelopeError::kTruncatedDependencies}) {
    CHECK_FALSE(to_string(e).empty());
    CHECK(to_string(e) != to_string(static_cast<EnvelopeError>(200)));
  }
  for (std::uint8_t s = 0; s <= kShimStatusMax; ++s) {
    CHECK(to_string(static_cast<ShimStatus>(s)) != to_string(static_cast<ShimStatus>(kShimStatusMax + 1)));
  }
  CHECK(is_retry(ShimStatus::kRetryPredicateFailed));
  CHECK(is_retry(ShimStatus::kRetryDependencyUnknown));
  CHECK_FALSE(is_retry(ShimStatus::kExecuted));
  CHECK_FALSE(is_retry(ShimStatus::kMalformed));
}

TEST_CASE("envelope result round-trips and rejects what no shim returns", "[shim]") {
  ShimResult r;
  const Bytes executed = encode_envelope_result(ShimStatus::kExecuted, Bytes{4, 5, 6});
  CHECK(executed == Bytes{0, 4, 5, 6});
  REQUIRE(decode_envelope_result(executed, r));
  CHECK(r == ShimResult{ShimStatus::kExecuted, Bytes{4, 5, 6}});
  REQUIRE(decode_envelope_result(encode_envelope_result(ShimStatus::kExecuted, {}), r));
  CHECK(r == ShimResult{ShimStatus::kExecuted, {}});
  for (ShimStatus s : {ShimStatus::kRetryPredicateFailed, ShimStatus::kRetryDependencyUnknown, ShimStatus::kMalformed}) {
    const Bytes bytes = encode_envelope_result(s, {});
    CHECK(bytes.size() == kResultHeaderBytes);
    REQUIRE(decode_envelope_result(bytes, r));
    CHECK(r == ShimResult{s, {}});
    Bytes trailing = bytes;
    trailing.push_back(0);
    CHECK_FALSE(decode_envelope_result(trailing, r));
  }
  CHECK_FALSE(decode_envelope_result(Bytes{}, r));
  CHECK_FALSE(decode_envelope_result(Bytes{kShimStatusMax + 1}, r));
  CHECK_FALSE(decode_envelope_result(Bytes{0xFF, 1}, r));
}

TEST_CASE("envelope decode never fails other than by an error on arbitrary bytes", "[shim]") {
  // A small deterministic sweep (the fuzz target does the rest): prefixes of valid requests with every byte
  // position flipped, decoded without crashing, and an accepted one re-encodes to the same bytes.
  const Bytes good = encode_envelope(std::vector<Dependency>{{1, digest_with(3)}, {2, digest_with(4)}}, Bytes{9, 8, 7});
  for (std::size_t i = 0; i < good.size(); ++i) {
    for (std::uint8_t flip : {std::uint8_t{0x01}, std::uint8_t{0x80}, std::uint8_t{0xFF}}) {
      Bytes mutated = good;
      mutated[i] ^= flip;
      ShimRequest out;
      if (decode_envelope(mutated, out) == EnvelopeError::kOk) CHECK(encode_envelope(out) == mutated);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Shim over the counter
// ---------------------------------------------------------------------------------------------------------------

namespace {

// A counter behind a shim, as a replica holds them (the counter is constructed first and outlives the shim).
struct Rig {
  CounterService counter;
  Shim shim;
  explicit Rig(SnapshotStore* store = nullptr, ShimOptions opt = {}) : counter(store), shim(counter, store, opt) {}
};

struct Outcome {
  Bytes bytes;  // what the shim returned (the client's Reply::result)
  ShimResult result;
  CounterResult counter;  // parsed when executed
  Digest digest() const { return digest_of(bytes); }
  ShimStatus status() const { return result.status; }
};

Outcome run(Shim& s, std::uint64_t seq, NodeId client, std::uint64_t request_id, std::vector<Dependency> deps,
            const Bytes& op) {
  const ExecContext ctx{seq, client, request_id, 1000 + seq};
  Outcome o;
  o.bytes = s.execute(ctx, encode_envelope(deps, op));
  REQUIRE(decode_envelope_result(o.bytes, o.result));
  if (o.result.status == ShimStatus::kExecuted) REQUIRE(parse_counter_result(o.result.inner, o.counter));
  return o;
}

// A speculating counter client: each increment depends on the previous reply (its token), so with
// speculation it names the previous request and the digest of the reply it used (NSDI'09 §6.1).
struct SpecClient {
  NodeId id;
  std::uint64_t token;
  std::uint64_t next_rid = 1;
  std::optional<Dependency> last;  // the request the next increment depends on, and the predicted digest
  explicit SpecClient(NodeId c) : id(c), token(counter_initial_token(c)) {}

  Outcome increment(Shim& s, std::uint64_t seq) {
    std::vector<Dependency> deps;
    if (last) deps.push_back(*last);
    const std::uint64_t rid = next_rid++;
    Outcome o = run(s, seq, id, rid, deps, counter_increment_op(token));
    if (o.status() == ShimStatus::kExecuted && o.counter.status == 0) token = o.counter.next_token;
    last = Dependency{rid, o.digest()};
    return o;
  }
};

Digest wrong_digest() { return digest_with(0x5A); }

// Silences the WARN lines a test provokes on purpose (rejected installs); an ERROR would still show.
class ExpectWarnings {
 public:
  ExpectWarnings() : level_(log_level()) { log_set_level(LogLevel::kError); }
  ~ExpectWarnings() { log_set_level(level_); }
  ExpectWarnings(const ExpectWarnings&) = delete;
  ExpectWarnings& operator=(const ExpectWarnings&) = delete;

 private:
  LogLevel level_;
};

// Every logged entry of `clients` for ids 1..max_rid: the observable log, for comparing states.
std::map<std::pair<NodeId, std::uint64_t>, Digest> dump(const Shim& s, std::vector<NodeId> clients,
                                                         std::uint64_t max_rid) {
  std::map<std::pair<NodeId, std::uint64_t>, Digest> out;
  for (NodeId c : clients) {
    for (std::uint64_t r = 1; r <= max_rid; ++r) {
      if (auto d = s.logged_digest(c, r)) out[{c, r}] = *d;
    }
  }
  return out;
}

void install_all(Service& from, std::uint64_t seq, Service& to) {
  to.begin_install(seq);
  for (std::uint64_t i = 0; i < from.partition_count(); ++i) to.install_partition(i, from.read_partition(seq, i));
}

}  // namespace

TEST_CASE("shim exposes the inner partitions followed by 64 shim partitions", "[shim]") {
  Rig r;
  CHECK(r.shim.partition_count() == kCounterPartitions + kShimPartitions);
  const CheckpointId id = r.shim.checkpoint(0);
  CHECK(id.digest == r.shim.recovered_checkpoint().digest);
  const PartitionTree& tree = r.shim.checkpoint_tree(0);
  CHECK(tree.leaves() == r.shim.partition_count());
  CHECK(tree.root() == id.digest);
  // Every leaf, inner or shim, is the leaf digest of the bytes read_partition serves under its own index.
  for (std::uint64_t i = 0; i < r.shim.partition_count(); ++i) {
    CHECK(tree.leaf(i) == PartitionTree::leaf_digest(i, r.shim.read_partition(0, i)));
  }
  CHECK(r.shim.read_partition(0, 0) == r.counter.read_partition(0, 0));
  // The shim's digest covers more than the counter's.
  CHECK(id.digest != r.counter.checkpoint_tree(0).root());
}

TEST_CASE("shim executes a request whose predicates hold and logs the digest of what it returned", "[shim]") {
  Rig r;
  SpecClient c(5);
  const Outcome o1 = c.increment(r.shim, 1);
  CHECK(o1.status() == ShimStatus::kExecuted);
  CHECK(o1.counter.status == 0);
  CHECK(o1.counter.value == 1);
  CHECK(r.shim.logged_digest(5, 1) == o1.digest());
  const Outcome o2 = c.increment(r.shim, 2);  // depends on request 1 with the digest it saw
  CHECK(o2.status() == ShimStatus::kExecuted);
  CHECK(o2.counter.value == 2);
  CHECK(r.counter.value() == 2);
  CHECK(r.shim.logged_digest(5, 2) == o2.digest());
  CHECK(r.shim.logged_entries(5) == 2);
  CHECK(r.shim.logged_clients() == 1);
  // The inner result is passed through unchanged behind the one-byte status.
  CHECK(o2.bytes.size() == kResultHeaderBytes + o2.result.inner.size());
}

TEST_CASE("shim turns a request with a wrong predicted digest into a retry and leaves the counter alone",
          "[shim]") {
  Rig r;
  SpecClient c(5);
  c.increment(r.shim, 1);
  // The client predicted another reply for request 1 (e.g. a faulty primary's early reply).
  c.last->result_digest = wrong_digest();
  const Outcome o = c.increment(r.shim, 2);
  CHECK(o.status() == ShimStatus::kRetryPredicateFailed);
  CHECK(o.result.inner.empty());
  CHECK(r.counter.value() == 1);  // the increment, with a valid token, was not executed
  CHECK(r.shim.logged_digest(5, 2) == o.digest());  // the retry result is logged like any other
  // Resubmitted without the failed speculation, it executes.
  c.last.reset();
  CHECK(c.increment(r.shim, 3).counter.value == 2);
}

TEST_CASE("shim answers a dependency it never logged with kRetryDependencyUnknown", "[shim]") {
  Rig r;
  SECTION("a client that never executed anything") {
    const Outcome o = run(r.shim, 1, 5, 2, {{1, wrong_digest()}}, counter_increment_op(counter_initial_token(5)));
    CHECK(o.status() == ShimStatus::kRetryDependencyUnknown);
  }
  SECTION("a request id of a known client that was never executed") {
    SpecClient c(5);
    c.increment(r.shim, 1);
    const Outcome o = run(r.shim, 2, 5, 3, {{1, *r.shim.logged_digest(5, 1)}, {2, wrong_digest()}},
                          counter_increment_op(c.token));
    CHECK(o.status() == ShimStatus::kRetryDependencyUnknown);
  }
  SECTION("another client's request id (dependencies are per client)") {
    SpecClient c(5);
    const Outcome o1 = c.increment(r.shim, 1);
    const Outcome o = run(r.shim, 2, 6, 2, {{1, o1.digest()}}, counter_increment_op(counter_initial_token(6)));
    CHECK(o.status() == ShimStatus::kRetryDependencyUnknown);
  }
  SECTION("the first failing dependency in list order decides between unknown and failed") {
    SpecClient c(5);
    c.increment(r.shim, 1);
    const Bytes op = counter_increment_op(c.token);
    CHECK(run(r.shim, 2, 5, 10, {{1, wrong_digest()}, {7, wrong_digest()}}, op).status() ==
          ShimStatus::kRetryPredicateFailed);
    CHECK(run(r.shim, 2, 5, 11, {{7, wrong_digest()}, {1, wrong_digest()}}, op).status() ==
          ShimStatus::kRetryDependencyUnknown);
  }
  CHECK(r.counter.value() <= 1);
}

TEST_CASE("shim truncates each client's log to its N highest request ids", "[shim]") {
  ShimOptions opt;
  opt.log_entries_per_client = kLogEntriesPerClientMin;
  Rig r(nullptr, opt);
  const Bytes read = counter_read_op();
  for (std::uint64_t rid = 1; rid <= 70; ++rid) run(r.shim, rid, 5, rid, {}, read);
  CHECK(r.shim.logged_entries(5) == 64);
  for (std::uint64_t rid = 1; rid <= 6; ++rid) CHECK_FALSE(r.shim.logged_digest(5, rid).has_value());
  for (std::uint64_t rid = 7; rid <= 70; ++rid) CHECK(r.shim.logged_digest(5, rid).has_value());
  // A truncated dependency is unknown; the oldest one kept still holds.
  const Digest kept = *r.shim.logged_digest(5, 7);
  CHECK(run(r.shim, 71, 5, 100, {{6, kept}}, read).status() == ShimStatus::kRetryDependencyUnknown);
  CHECK(run(r.shim, 71, 5, 101, {{8, wrong_digest()}}, read).status() == ShimStatus::kRetryPredicateFailed);
  // Request 100 and 101 pushed out 7 and 8 in turn (N highest ids).
  CHECK_FALSE(r.shim.logged_digest(5, 7).has_value());
  CHECK(run(r.shim, 71, 5, 102, {{9, *r.shim.logged_digest(5, 9)}}, read).status() == ShimStatus::kExecuted);
  // An id lower than every id kept is dropped at once (it is not among the N highest).
  run(r.shim, 72, 5, 3, {}, read);
  CHECK_FALSE(r.shim.logged_digest(5, 3).has_value());
  CHECK(r.shim.logged_entries(5) == 64);
  // Other clients are unaffected.
  run(r.shim, 72, 6, 1, {}, read);
  CHECK(r.shim.logged_entries(6) == 1);
}

TEST_CASE("shim propagates a failed speculation through the log: t1 mispredicted, t2 and t3 retry", "[shim]") {
  Rig r;
  SpecClient c(5);
  const Outcome t1 = c.increment(r.shim, 1);
  REQUIRE(t1.status() == ShimStatus::kExecuted);
  // The client speculated on a wrong reply for t1 and issued t2 on it, then t3 predicting t2's success (the
  // digest of the executed reply it speculated on). Only direct dependencies are listed.
  const Bytes predicted_t2 = encode_envelope_result(ShimStatus::kExecuted, Bytes(17, 0x42));
  const Outcome t2 = run(r.shim, 2, 5, 2, {{1, wrong_digest()}}, counter_increment_op(12345));
  CHECK(t2.status() == ShimStatus::kRetryPredicateFailed);
  const Outcome t3 = run(r.shim, 3, 5, 3, {{2, digest_of(predicted_t2)}}, counter_increment_op(67890));
  CHECK(t3.status() == ShimStatus::kRetryPredicateFailed);
  CHECK(r.counter.value() == 1);
  // Whoever predicted t2's actual (retry) reply is consistent with the log, so its predicate holds.
  const Outcome t4 = run(r.shim, 4, 5, 4, {{2, t2.digest()}}, counter_read_op());
  CHECK(t4.status() == ShimStatus::kExecuted);
  CHECK(t4.counter.value == 1);
}

TEST_CASE("shim rollback restores the log exactly and re-execution sees the pre-rollback log", "[shim]") {
  ShimOptions opt;
  opt.log_entries_per_client = kLogEntriesPerClientMin;
  Rig r(nullptr, opt);
  Rig reference(nullptr, opt);  // never speculates
  const Bytes read = counter_read_op();
  // Committed: client 5 has a full log (ids 1..64), so the next id evicts id 1.
  for (std::uint64_t rid = 1; rid <= 64; ++rid) {
    run(r.shim, 1, 5, rid, {}, read);
    run(reference.shim, 1, 5, rid, {}, read);
  }
  r.shim.commit_through(1);
  reference.shim.commit_through(1);
  const auto before = dump(r.shim, {5, 6, 70}, 200);
  const std::uint64_t token = counter_initial_token(6);

  // Tentative: id 65 evicts id 1; id 64 is re-executed (overwritten with another result); a new client 6
  // increments and a dependent request of it executes; client 70 (same shim partition as 6) appears.
  run(r.shim, 2, 5, 65, {}, read);
  const Outcome a = run(r.shim, 2, 6, 1, {}, counter_increment_op(token));
  REQUIRE(a.status() == ShimStatus::kExecuted);
  run(r.shim, 3, 5, 64, {{65, *r.shim.logged_digest(5, 65)}}, counter_increment_op(counter_initial_token(5)));
  const Outcome b = run(r.shim, 3, 6, 2, {{1, a.digest()}}, counter_increment_op(a.counter.next_token));
  REQUIRE(b.status() == ShimStatus::kExecuted);
  run(r.shim, 3, 70, 1, {}, read);
  CHECK(r.counter.value() == 3);
  CHECK(r.shim.logged_clients() == 3);
  CHECK_FALSE(r.shim.logged_digest(5, 1).has_value());

  r.shim.rollback_to(2);  // undoes seq 3 only
  CHECK(r.shim.logged_clients() == 2);
  CHECK(r.shim.logged_digest(6, 1) == a.digest());
  CHECK_FALSE(r.shim.logged_digest(6, 2).has_value());
  r.shim.rollback_to(1);
  CHECK(dump(r.shim, {5, 6, 70}, 200) == before);
  CHECK(r.shim.logged_clients() == 1);
  CHECK(r.counter.value() == 0);
  // Byte for byte: the same checkpoint digest as the replica that never speculated.
  CHECK(r.shim.checkpoint(1).digest == reference.shim.checkpoint(1).digest);

  // Re-executed after the rollback, client 6's dependent request finds no entry for its dependency.
  CHECK(run(r.shim, 2, 6, 2, {{1, a.digest()}}, counter_increment_op(a.counter.next_token)).status() ==
        ShimStatus::kRetryDependencyUnknown);
  // And a request depending on id 1 of client 5 (restored by the rollback) holds again.
  CHECK(run(r.shim, 2, 5, 66, {{1, before.at({5, 1})}}, read).status() == ShimStatus::kExecuted);
}

TEST_CASE("shim commit_through makes executions final: rollback does not undo them", "[shim]") {
  Rig r;
  SpecClient c(5);
  c.increment(r.shim, 1);
  c.increment(r.shim, 2);
  r.shim.commit_through(2);
  c.increment(r.shim, 3);
  r.shim.rollback_to(2);
  CHECK(r.shim.logged_entries(5) == 2);
  CHECK(r.counter.value() == 2);
}

TEST_CASE("shim malformed ops are deterministic no-ops that are logged", "[shim]") {
  Rig a;
  Rig b;
  SpecClient c(5);
  c.increment(a.shim, 1);
  const Digest before = a.shim.checkpoint(1).digest;
  const Bytes malformed = encode_envelope_result(ShimStatus::kMalformed, {});
  std::uint64_t rid = 10;
  const std::vector<Bytes> ops = {Bytes{}, Bytes{1, 0, 0}, Bytes{2, 0, 0, 0}, Bytes{1, 1, 0, 0},
                                  Bytes{1, 0, 1, 0}, Bytes{1, 0, 0xFF, 0xFF}};
  for (const Bytes& op : ops) {
    const ExecContext ctx{2, 5, rid, 0};
    const Bytes out_a = a.shim.execute(ctx, op);
    const Bytes out_b = b.shim.execute(ctx, op);
    CHECK(out_a == malformed);
    CHECK(out_b == out_a);
    CHECK(a.shim.logged_digest(5, rid) == digest_of(malformed));
    ++rid;
  }
  CHECK(a.counter.value() == 1);
  // A predicate naming a malformed request's (logged) reply holds; one expecting anything else fails.
  CHECK(run(a.shim, 3, 5, 20, {{10, digest_of(malformed)}}, counter_read_op()).status() == ShimStatus::kExecuted);
  CHECK(run(a.shim, 3, 5, 21, {{11, wrong_digest()}}, counter_read_op()).status() ==
        ShimStatus::kRetryPredicateFailed);
  // The log changed, so the state did; the counter's partitions did not.
  const CheckpointId after = a.shim.checkpoint(3);
  CHECK(after.digest != before);
  for (std::uint64_t i = 0; i < kCounterPartitions; ++i) CHECK(a.shim.read_partition(3, i) == a.shim.read_partition(1, i));
}

TEST_CASE("shim read-only: only a request without dependencies is optimized, and it is never logged",
          "[shim]") {
  Rig r;
  SpecClient c(5);
  const Outcome o1 = c.increment(r.shim, 1);
  Bytes out;
  REQUIRE(r.shim.execute_read_only(5, encode_envelope({}, counter_read_op()), out));
  ShimResult res;
  REQUIRE(decode_envelope_result(out, res));
  CHECK(res.status == ShimStatus::kExecuted);
  CounterResult cr;
  REQUIRE(parse_counter_result(res.inner, cr));
  CHECK(cr.value == 1);
  // With a dependency (even one that holds), never optimized: §3.3.
  CHECK_FALSE(r.shim.execute_read_only(5, encode_envelope(std::vector<Dependency>{{1, o1.digest()}}, counter_read_op()), out));
  // Not read-only for the counter, or not an envelope: the client falls back to ordering.
  CHECK_FALSE(r.shim.execute_read_only(5, encode_envelope({}, counter_increment_op(c.token)), out));
  CHECK_FALSE(r.shim.execute_read_only(5, counter_read_op(), out));
  CHECK_FALSE(r.shim.execute_read_only(5, Bytes{}, out));
  CHECK(r.shim.logged_entries(5) == 1);
  CHECK(r.counter.value() == 1);
}

TEST_CASE("shim checkpoint installed into a fresh shim and counter gives the same digest and decisions",
          "[shim]") {
  Rig source;
  std::vector<SpecClient> clients;
  for (NodeId id = 4; id < 4 + 70; id += 3) clients.emplace_back(id);  // several per shim partition
  for (std::uint64_t seq = 1; seq <= 30; ++seq) clients[seq % clients.size()].increment(source.shim, seq);
  const CheckpointId id = source.shim.checkpoint(30);

  MemorySnapshotStore store;
  Rig target(&store);
  SpecClient(4).increment(target.shim, 1);  // local state that the install replaces
  install_all(source.shim, 30, target.shim);
  const CheckpointId installed = target.shim.finish_install(30);
  CHECK(installed.seq == 30);
  CHECK(installed.digest == id.digest);
  CHECK(target.shim.checkpoint_tree(30).root() == id.digest);
  CHECK(target.counter.value() == 30);
  std::vector<NodeId> ids;
  for (const SpecClient& c : clients) ids.push_back(c.id);
  CHECK(dump(target.shim, ids, 40) == dump(source.shim, ids, 40));
  for (std::uint64_t i = 0; i < source.shim.partition_count(); ++i) {
    CHECK(target.shim.read_partition(30, i) == source.shim.read_partition(30, i));
  }

  // The same requests get the same answers on both: a holding predicate, a failing one, an unknown one.
  std::vector<SpecClient> twin = clients;
  for (std::size_t k = 0; k < 6; ++k) {
    const Outcome a = clients[k].increment(source.shim, 31);
    const Outcome b = twin[k].increment(target.shim, 31);
    CHECK(a.bytes == b.bytes);
    CHECK(a.status() == ShimStatus::kExecuted);
  }
  const Bytes op = counter_read_op();
  CHECK(run(source.shim, 32, 7, 90, {{1, wrong_digest()}}, op).bytes ==
        run(target.shim, 32, 7, 90, {{1, wrong_digest()}}, op).bytes);
  CHECK(run(source.shim, 32, 7, 91, {{89, wrong_digest()}}, op).bytes ==
        run(target.shim, 32, 7, 91, {{89, wrong_digest()}}, op).bytes);
  CHECK(source.shim.checkpoint(32).digest == target.shim.checkpoint(32).digest);

  // The install was durable: a restart recovers it.
  Rig restarted(&store);
  CHECK(restarted.shim.recovered_checkpoint().seq == 32);
  CHECK(restarted.shim.recovered_checkpoint().digest == source.shim.checkpoint_tree(32).root());
}

TEST_CASE("shim install of only the differing partitions starts from the newest checkpoint", "[shim]") {
  Rig source;
  Rig target;
  SpecClient s1(5), t1(5);
  s1.increment(source.shim, 1);
  t1.increment(target.shim, 1);
  source.shim.checkpoint(1);
  const CheckpointId base = target.shim.checkpoint(1);
  s1.increment(source.shim, 2);
  SpecClient(300).increment(source.shim, 3);
  const CheckpointId id = source.shim.checkpoint(3);
  SpecClient(77).increment(target.shim, 2);  // executed past the checkpoint; the install discards it

  target.shim.begin_install(3);
  std::uint64_t installed = 0;
  for (std::uint64_t i = 0; i < source.shim.partition_count(); ++i) {
    if (source.shim.checkpoint_tree(3).leaf(i) != target.shim.checkpoint_tree(base.seq).leaf(i)) {
      target.shim.install_partition(i, source.shim.read_partition(3, i));
      ++installed;
    }
  }
  // Counter: the value and the token slices of 5 and 300; shim: the log partitions of 5 and 300.
  CHECK(installed == 5);
  CHECK(target.shim.finish_install(3).digest == id.digest);
  CHECK(target.counter.value() == 3);
  CHECK(target.shim.logged_entries(77) == 0);
  CHECK(target.shim.logged_entries(300) == 1);
}

TEST_CASE("shim install of bad shim partitions is rejected and leaves shim and counter unchanged", "[shim]") {
  const ExpectWarnings quiet;
  const std::uint64_t errors = log_error_count();
  MemorySnapshotStore store;
  Rig source;
  SpecClient(5).increment(source.shim, 1);
  SpecClient(6).increment(source.shim, 2);
  source.shim.checkpoint(2);

  Rig r(&store);
  SpecClient c(5);
  c.increment(r.shim, 1);
  const CheckpointId before = r.shim.checkpoint(1);
  const std::uint64_t first_shim = kCounterPartitions;

  auto expect_rejected = [&](const char* what, auto&& stage) {
    INFO(what);
    install_all(source.shim, 2, r.shim);
    stage();
    const CheckpointId id = r.shim.finish_install(2);
    CHECK(id.digest.is_zero());
    CHECK(r.counter.value() == 1);  // the counter's good partitions were never installed
    CHECK(r.shim.logged_entries(6) == 0);
    CHECK(r.shim.checkpoint_tree(1).root() == before.digest);
  };
  Bytes wrong_client;  // client 6 in the partition of client 5
  {
    ByteWriter w(wrong_client);
    w.u32(1);
    w.u32(6);
    w.u32(1);
    w.u64(1);
    w.digest(wrong_digest());
  }
  Bytes empty_log;  // a client present with no entries is not canonical
  {
    ByteWriter w(empty_log);
    w.u32(1);
    w.u32(5);
    w.u32(0);
  }
  Bytes unsorted;  // request ids must increase
  {
    ByteWriter w(unsorted);
    w.u32(1);
    w.u32(5);
    w.u32(2);
    w.u64(2);
    w.digest(wrong_digest());
    w.u64(1);
    w.digest(wrong_digest());
  }
  Bytes too_long;  // more entries than log_entries_per_client
  {
    ByteWriter w(too_long);
    w.u32(1);
    w.u32(5);
    w.u32(1025);
    for (std::uint64_t i = 1; i <= 1025; ++i) {
      w.u64(i);
      w.digest(wrong_digest());
    }
  }
  expect_rejected("truncated", [&] { r.shim.install_partition(first_shim + 5, Bytes{1, 0}); });
  expect_rejected("trailing", [&] { r.shim.install_partition(first_shim + 5, Bytes{0, 0, 0, 0, 0}); });
  expect_rejected("wrong client", [&] { r.shim.install_partition(first_shim + 5, wrong_client); });
  expect_rejected("empty log", [&] { r.shim.install_partition(first_shim + 5, empty_log); });
  expect_rejected("unsorted", [&] { r.shim.install_partition(first_shim + 5, unsorted); });
  expect_rejected("too long", [&] { r.shim.install_partition(first_shim + 5, too_long); });
  expect_rejected("out of range", [&] { r.shim.install_partition(first_shim + kShimPartitions, Bytes{0, 0, 0, 0}); });
  expect_rejected("counter rejects", [&] { r.shim.install_partition(0, Bytes{1, 2, 3}); });

  // Still usable, and a restart still recovers checkpoint 1 (the rejected installs left it durable).
  CHECK(c.increment(r.shim, 2).counter.value == 2);
  Rig restarted(&store);
  CHECK(restarted.shim.recovered_checkpoint().seq == 1);
  CHECK(restarted.shim.recovered_checkpoint().digest == before.digest);
  CHECK(log_error_count() == errors);
}

TEST_CASE("shim recovered_checkpoint after a restart equals the checkpoint id, log included", "[shim]") {
  MemorySnapshotStore store;
  CheckpointId id;
  SpecClient c(9);
  std::optional<Outcome> last;
  {
    Rig r(&store);
    CHECK(r.shim.recovered_checkpoint().seq == 0);
    for (std::uint64_t seq = 1; seq <= 5; ++seq) last = c.increment(r.shim, seq);
    r.shim.commit_through(5);
    id = r.shim.checkpoint(5);
    // Executed after the checkpoint and lost in the crash: the engine replays it from its log.
    SpecClient(10).increment(r.shim, 6);
  }
  Rig restarted(&store);
  CHECK(restarted.shim.recovered_checkpoint().seq == 5);
  CHECK(restarted.shim.recovered_checkpoint().digest == id.digest);
  CHECK(restarted.shim.checkpoint_tree(5).root() == id.digest);
  CHECK(restarted.counter.value() == 5);
  CHECK(restarted.shim.logged_entries(9) == 5);
  CHECK(restarted.shim.logged_entries(10) == 0);
  // The client's speculation continues where it was: its predicate on request 5 holds after the restart.
  const Outcome o = c.increment(restarted.shim, 6);
  CHECK(o.status() == ShimStatus::kExecuted);
  CHECK(o.counter.value == 6);
}

TEST_CASE("shim recovers the previous checkpoint when the crash fell between its write and the counter's",
          "[shim]") {
  MemorySnapshotStore store;
  CheckpointId first;
  MemorySnapshotStore before_second;
  Bytes shim_blob_of_second;
  {
    Rig r(&store);
    SpecClient c(5);
    c.increment(r.shim, 1);
    first = r.shim.checkpoint(1);
    before_second = store;
    c.increment(r.shim, 2);
    r.shim.checkpoint(2);
    REQUIRE(store.get("shim.ckpt", shim_blob_of_second));
  }
  // The shim's blob for checkpoint 2 reached the disk, the counter's did not.
  MemorySnapshotStore crashed = before_second;
  crashed.put("shim.ckpt", shim_blob_of_second);
  Rig restarted(&crashed);
  CHECK(restarted.shim.recovered_checkpoint().seq == 1);
  CHECK(restarted.shim.recovered_checkpoint().digest == first.digest);
  CHECK(restarted.shim.logged_entries(5) == 1);
}

TEST_CASE("shim logs no more clients than its limits allow, and an unlogged client still executes", "[shim]") {
  SECTION("clients_max") {
    ShimOptions opt;
    opt.clients_max = 2;
    Rig r(nullptr, opt);
    SpecClient a(4), b(5), c(6);
    a.increment(r.shim, 1);
    b.increment(r.shim, 2);
    const Outcome c1 = c.increment(r.shim, 3);
    CHECK(c1.status() == ShimStatus::kExecuted);
    CHECK(r.shim.logged_clients() == 2);
    CHECK(r.shim.logged_entries(6) == 0);
    // Its dependent request cannot be checked: retry; without the dependency it executes.
    CHECK(c.increment(r.shim, 4).status() == ShimStatus::kRetryDependencyUnknown);
    c.last.reset();
    CHECK(c.increment(r.shim, 5).counter.value == 4);
  }
  SECTION("clients per partition") {
    ShimOptions opt;
    opt.log_entries_per_client = kLogEntriesPerClientMax;
    CHECK(clients_per_partition_max(opt) == 1);
    Rig r(nullptr, opt);
    run(r.shim, 1, 5, 1, {}, counter_read_op());
    run(r.shim, 1, 5 + kShimPartitions, 1, {}, counter_read_op());  // same partition
    run(r.shim, 1, 6, 1, {}, counter_read_op());
    CHECK(r.shim.logged_clients() == 2);
    CHECK(r.shim.logged_entries(5 + kShimPartitions) == 0);
  }
  ShimOptions defaults;
  CHECK(clients_per_partition_max(defaults) == (kPartitionBytesMax - 4) / (8 + 1024 * 40));
}

TEST_CASE("two shims executing the same sequence produce identical results and checkpoint digests", "[shim]") {
  Rig a;
  Rig b;
  Prng prng(0x5EED);
  std::vector<SpecClient> ca, cb;
  for (NodeId id = 4; id < 4 + 150; id += 11) {
    ca.emplace_back(id);
    cb.emplace_back(id);
  }
  std::uint64_t retries = 0;
  for (std::uint64_t seq = 1; seq <= 200; ++seq) {
    const std::size_t k = prng.below(ca.size());
    const std::uint64_t what = prng.below(10);
    if (what == 0 && ca[k].last) {  // a misprediction
      ca[k].last->result_digest = wrong_digest();
      cb[k].last->result_digest = wrong_digest();
    }
    if (what == 1) {  // a garbage op
      const ExecContext ctx{seq, ca[k].id, ca[k].next_rid++, seq};
      cb[k].next_rid++;
      const Bytes garbage = {static_cast<std::uint8_t>(prng.below(256)), 7};
      CHECK(a.shim.execute(ctx, garbage) == b.shim.execute(ctx, garbage));
      continue;
    }
    const Outcome oa = ca[k].increment(a.shim, seq);
    const Outcome ob = cb[k].increment(b.shim, seq);
    CHECK(oa.bytes == ob.bytes);
    if (is_retry(oa.status())) {
      ++retries;
      ca[k].last.reset();  // resubmitted without the failed speculation
      cb[k].last.reset();
    }
    if (seq % 25 == 0) {
      a.shim.commit_through(seq);
      b.shim.commit_through(seq);
      CHECK(a.shim.checkpoint(seq).digest == b.shim.checkpoint(seq).digest);
    }
  }
  CHECK(retries > 0);
  CHECK(a.counter.value() == b.counter.value());
  CHECK(a.shim.checkpoint_tree(200).root() == b.shim.checkpoint_tree(200).root());
}

TEST_CASE("shim retained checkpoints stay readable until discarded; the newest always stays", "[shim]") {
  Rig r;
  SpecClient c(5);
  c.increment(r.shim, 1);
  const CheckpointId one = r.shim.checkpoint(1);
  const Bytes log_at_one = r.shim.read_partition(1, kCounterPartitions + 5);
  c.increment(r.shim, 2);
  const CheckpointId two = r.shim.checkpoint(2);
  CHECK(one.digest != two.digest);
  CHECK(r.shim.read_partition(1, kCounterPartitions + 5) == log_at_one);
  CHECK(r.shim.read_partition(2, kCounterPartitions + 5) != log_at_one);
  CHECK(r.shim.checkpoint_tree(1).root() == one.digest);
  r.shim.discard_checkpoints_below(3);
  CHECK(r.shim.checkpoint_tree(2).root() == two.digest);
}

TEST_CASE("shim over the null service: any inner service with its own partition count", "[shim]") {
  NullService null(nullptr);
  Shim s(null, nullptr);
  CHECK(s.partition_count() == null.partition_count() + kShimPartitions);
  const ExecContext ctx{1, 5, 1, 0};
  const Bytes out = s.execute(ctx, encode_envelope({}, null_op(8, 3)));
  ShimResult res;
  REQUIRE(decode_envelope_result(out, res));
  CHECK(res.status == ShimStatus::kExecuted);
  CHECK(res.inner == Bytes(3, 0));
  const CheckpointId id = s.checkpoint(1);
  CHECK(id.digest == s.checkpoint_tree(1).root());
}

TEST_CASE("shim over the null service: a client asking for the largest result never trips the shim", "[shim]") {
  // The wire allows a result of kResultBytesMax; the shim adds a status byte. The null service caps what a
  // client may ask for below that (kNullResultBytesMax), so the wrapped result always fits.
  NullService null(nullptr);
  Shim s(null, nullptr);
  Bytes too_big;
  ByteWriter w(too_big);
  w.u32(kResultBytesMax);
  const Bytes out = s.execute(ExecContext{1, 5, 1, 0}, encode_envelope({}, too_big));
  ShimResult res;
  REQUIRE(decode_envelope_result(out, res));
  CHECK(res.status == ShimStatus::kExecuted);
  CHECK(res.inner.empty());  // the null service's answer to a malformed op
  const Bytes largest = s.execute(ExecContext{2, 5, 2, 0}, encode_envelope({}, null_op(8, kNullResultBytesMax)));
  CHECK(largest.size() == kNullResultBytesMax + kResultHeaderBytes);
  CHECK(largest.size() <= kResultBytesMax);
}
