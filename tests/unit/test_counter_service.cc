// The PBFT-CS counter service: tokens, determinism, rollback, durable checkpoints and install.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "common/crypto.h"
#include "services/checkpoint_keeper_internal.h"
#include "services/counter_service.h"
#include "services/null_service.h"

using namespace bftfs;

namespace {

CounterResult run(Service& s, std::uint64_t seq, NodeId client, const Bytes& op) {
  ExecContext ctx;
  ctx.seq = seq;
  ctx.client = client;
  ctx.request_id = seq;
  CounterResult r;
  const Bytes out = s.execute(ctx, op);
  REQUIRE(parse_counter_result(out, r));
  return r;
}

// A client that follows its tokens.
struct TokenClient {
  NodeId id;
  std::uint64_t token;
  explicit TokenClient(NodeId c) : id(c), token(counter_initial_token(c)) {}
  CounterResult increment(Service& s, std::uint64_t seq) {
    CounterResult r = run(s, seq, id, counter_increment_op(token));
    if (r.status == 0) token = r.next_token;
    return r;
  }
};

}  // namespace

TEST_CASE("counter increments with the right token and hands out the next one") {
  CounterService s(nullptr);
  TokenClient c(5);
  CounterResult r = c.increment(s, 1);
  CHECK(r.status == 0);
  CHECK(r.value == 1);
  CHECK(r.next_token != counter_initial_token(5));
  r = c.increment(s, 2);
  CHECK(r.status == 0);
  CHECK(r.value == 2);
  CHECK(s.value() == 2);
}

TEST_CASE("counter tokens do not follow from the value alone") {
  // Two clients reaching the same value get different tokens, and a client's token depends on its history.
  CounterService a(nullptr);
  CounterService b(nullptr);
  const CounterResult ra = run(a, 1, 5, counter_increment_op(counter_initial_token(5)));
  const CounterResult rb = run(b, 1, 6, counter_increment_op(counter_initial_token(6)));
  CHECK(ra.value == rb.value);
  CHECK(ra.next_token != rb.next_token);
  CHECK(counter_initial_token(5) != counter_initial_token(6));
}

TEST_CASE("counter bad token does not increment and tells the expected token") {
  CounterService s(nullptr);
  TokenClient c(7);
  c.increment(s, 1);
  const CounterResult bad = run(s, 2, 7, counter_increment_op(12345));
  CHECK(bad.status == 1);
  CHECK(bad.value == 1);
  CHECK(bad.next_token == c.token);
  CHECK(s.value() == 1);
  // Another client's token is not this client's.
  const CounterResult other = run(s, 3, 8, counter_increment_op(c.token));
  CHECK(other.status == 1);
  // Resynchronized, the client continues.
  CHECK(c.increment(s, 4).value == 2);
}

TEST_CASE("counter malformed ops change nothing and say so") {
  CounterService s(nullptr);
  for (const Bytes& op : {Bytes{}, Bytes{9}, Bytes{1, 2, 3}, Bytes{2, 0}, Bytes(10, 1)}) {
    const CounterResult r = run(s, 1, 5, op);
    CHECK(r.status == 2);
    CHECK(r.value == 0);
  }
  CHECK(s.value() == 0);
  CounterResult parsed;
  CHECK_FALSE(parse_counter_result(Bytes(16, 0), parsed));
  CHECK_FALSE(parse_counter_result(Bytes(18, 0), parsed));
  Bytes bad_status(17, 0);
  bad_status[0] = 3;
  CHECK_FALSE(parse_counter_result(bad_status, parsed));
}

TEST_CASE("counter read is read-only; increment is not") {
  CounterService s(nullptr);
  TokenClient c(5);
  c.increment(s, 1);
  Bytes out;
  REQUIRE(s.execute_read_only(5, counter_read_op(), out));
  CounterResult r;
  REQUIRE(parse_counter_result(out, r));
  CHECK(r.status == 0);
  CHECK(r.value == 1);
  CHECK(r.next_token == c.token);
  CHECK_FALSE(s.execute_read_only(5, counter_increment_op(c.token), out));
  CHECK_FALSE(s.execute_read_only(5, Bytes{}, out));
  CHECK(s.value() == 1);
  // An ordered read returns the same and changes nothing either.
  CHECK(run(s, 2, 5, counter_read_op()).value == 1);
  CHECK(s.value() == 1);
}

TEST_CASE("counter is deterministic: same ops, same results and checkpoint digests") {
  CounterService a(nullptr);
  CounterService b(nullptr);
  std::vector<TokenClient> ca, cb;
  for (NodeId c = 4; c < 4 + 300; c += 7) {  // enough clients to spread over many token slices
    ca.emplace_back(c);
    cb.emplace_back(c);
  }
  for (std::uint64_t seq = 1; seq <= 40; ++seq) {
    const std::size_t k = (seq * 13) % ca.size();
    const CounterResult ra = ca[k].increment(a, seq);
    const CounterResult rb = cb[k].increment(b, seq);
    CHECK(ra.status == rb.status);
    CHECK(ra.value == rb.value);
    CHECK(ra.next_token == rb.next_token);
    if (seq % 10 == 0) {
      const CheckpointId ia = a.checkpoint(seq);
      const CheckpointId ib = b.checkpoint(seq);
      CHECK(ia.seq == seq);
      CHECK(ia.digest == ib.digest);
    }
  }
  CHECK(a.checkpoint_tree(40).root() == b.checkpoint_tree(40).root());
  CHECK(a.checkpoint_tree(10).root() != a.checkpoint_tree(40).root());
}

TEST_CASE("counter rollback restores the value and tokens exactly") {
  CounterService s(nullptr);
  CounterService reference(nullptr);
  TokenClient c1(5), c2(6), r1(5);
  c1.increment(s, 1);
  r1.increment(reference, 1);
  s.commit_through(1);
  const std::uint64_t committed_token = c1.token;

  // Tentative executions at seq 2 and 3, by a client with a token entry and one without.
  c1.increment(s, 2);
  c2.increment(s, 2);
  c1.increment(s, 3);
  CHECK(s.value() == 4);
  s.rollback_to(2);
  CHECK(s.value() == 3);
  s.rollback_to(1);
  CHECK(s.value() == 1);

  // The state is byte-for-byte the committed one: same checkpoint digest as a replica that never speculated.
  CHECK(s.checkpoint(1).digest == reference.checkpoint(1).digest);
  // Tokens are back too: the committed token works again, c2's initial token works again.
  CHECK(run(s, 2, 5, counter_increment_op(committed_token)).status == 0);
  CHECK(run(s, 2, 6, counter_increment_op(counter_initial_token(6))).status == 0);
  CHECK(s.value() == 3);
}

TEST_CASE("counter checkpoints survive a restart from the snapshot store") {
  MemorySnapshotStore store;
  CheckpointId id;
  TokenClient c(9);
  {
    CounterService s(&store);
    CHECK(s.recovered_checkpoint().seq == 0);
    for (std::uint64_t seq = 1; seq <= 5; ++seq) c.increment(s, seq);
    id = s.checkpoint(5);
    // Executed after the checkpoint and lost in the crash: the engine replays it from its log.
    TokenClient(10).increment(s, 6);
  }
  CounterService restarted(&store);
  CHECK(restarted.recovered_checkpoint().seq == 5);
  CHECK(restarted.recovered_checkpoint().digest == id.digest);
  CHECK(restarted.value() == 5);
  CHECK(restarted.checkpoint_tree(5).root() == id.digest);
  // The token table came back too.
  CHECK(c.increment(restarted, 6).status == 0);
  CHECK(restarted.value() == 6);
}

TEST_CASE("counter without a snapshot recovers to seq 0 and the initial state's digest") {
  CounterService a(nullptr);
  MemorySnapshotStore empty;
  CounterService b(&empty);
  CHECK(a.recovered_checkpoint().seq == 0);
  CHECK(a.recovered_checkpoint().digest == b.recovered_checkpoint().digest);
  CHECK(a.recovered_checkpoint().digest == a.checkpoint_tree(0).root());
  CHECK(a.checkpoint(0).digest == a.recovered_checkpoint().digest);
}

TEST_CASE("snapshot blobs are validated: corruption, truncation and wrong shape are reported") {
  using namespace services_internal;
  std::vector<PartitionBytes> parts = {std::make_shared<const Bytes>(Bytes{1, 2, 3}),
                                       std::make_shared<const Bytes>(Bytes{})};
  const Bytes engine_state{7, 8, 9, 10};
  const Bytes blob = encode_snapshot_blob(42, parts, engine_state);
  std::uint64_t seq = 0;
  std::vector<Bytes> out;
  Bytes state_out;
  REQUIRE(decode_snapshot_blob(blob, 2, seq, out, state_out).empty());
  CHECK(seq == 42);
  CHECK(out == std::vector<Bytes>{Bytes{1, 2, 3}, Bytes{}});
  CHECK(state_out == engine_state);

  for (std::size_t i = 0; i < blob.size(); ++i) {
    Bytes flipped = blob;
    flipped[i] ^= 0x01;
    CHECK_FALSE(decode_snapshot_blob(flipped, 2, seq, out, state_out).empty());
  }
  for (std::size_t len = 0; len < blob.size(); ++len) {
    CHECK_FALSE(decode_snapshot_blob(std::span(blob).first(len), 2, seq, out, state_out).empty());
  }
  CHECK_FALSE(decode_snapshot_blob(blob, 3, seq, out, state_out).empty());
}

TEST_CASE("a snapshot blob of the format before engine states (BFTSNAP1) loads with an empty engine state") {
  using namespace services_internal;
  // BFTSNAP1: magic || u64 seq || u64 count || per partition u32 size || bytes || digest; no engine state.
  Bytes old(kSnapshotMagicV1, kSnapshotMagicV1 + sizeof(kSnapshotMagicV1));
  put_u64(old, 42);
  put_u64(old, 1);
  put_u32(old, 3);
  old.insert(old.end(), {1, 2, 3});
  const Digest d = digest_of(old);
  old.insert(old.end(), d.bytes.begin(), d.bytes.end());
  std::uint64_t seq = 0;
  std::vector<Bytes> out;
  Bytes state_out{5};
  REQUIRE(decode_snapshot_blob(old, 1, seq, out, state_out).empty());
  CHECK(seq == 42);
  CHECK(out == std::vector<Bytes>{Bytes{1, 2, 3}});
  CHECK(state_out.empty());
}

TEST_CASE("the counter keeps the engine state of its newest checkpoint, atomically with it, across a restart") {
  MemorySnapshotStore store;
  const Bytes engine_state{1, 2, 3, 4, 5};
  {
    CounterService a(&store);
    CHECK(a.recovered_engine_state().empty());  // the initial state has none
    TokenClient c(7);
    c.increment(a, 1);
    a.checkpoint(1, engine_state);
  }
  CounterService b(&store);
  CHECK(b.recovered_checkpoint().seq == 1);
  CHECK(b.recovered_engine_state() == engine_state);
}

TEST_CASE("counter install from another instance's partitions yields the same root") {
  CounterService source(nullptr);
  std::vector<TokenClient> clients;
  for (NodeId c = 4; c < 20; ++c) clients.emplace_back(c);
  for (std::uint64_t seq = 1; seq <= 30; ++seq) clients[seq % clients.size()].increment(source, seq);
  const CheckpointId id = source.checkpoint(30);

  MemorySnapshotStore store;
  CounterService target(&store);
  TokenClient(4).increment(target, 1);  // some local state that the install replaces
  target.begin_install(30);
  for (std::uint64_t i = 0; i < kCounterPartitions; ++i) target.install_partition(i, source.read_partition(30, i));
  const CheckpointId installed = target.finish_install(30);
  CHECK(installed.seq == 30);
  CHECK(installed.digest == id.digest);
  CHECK(target.value() == 30);
  CHECK(target.checkpoint_tree(30).root() == id.digest);
  // It continues from there, tokens included, and the install was durable.
  CHECK(clients[0].increment(target, 31).value == 31);
  CounterService restarted(&store);
  CHECK(restarted.recovered_checkpoint().seq == 30);
  CHECK(restarted.recovered_checkpoint().digest == id.digest);
}

TEST_CASE("counter install of only the differing partitions starts from the newest checkpoint") {
  CounterService source(nullptr);
  CounterService target(nullptr);
  TokenClient s1(5), t1(5);
  s1.increment(source, 1);
  t1.increment(target, 1);
  source.checkpoint(1);
  const CheckpointId base = target.checkpoint(1);
  s1.increment(source, 2);
  TokenClient(300).increment(source, 3);
  const CheckpointId id = source.checkpoint(3);
  // The target executed past its checkpoint before falling behind; the install discards that.
  TokenClient(77).increment(target, 2);

  target.begin_install(3);
  std::size_t installed = 0;
  for (std::uint64_t i = 0; i < kCounterPartitions; ++i) {
    if (source.checkpoint_tree(3).leaf(i) != target.checkpoint_tree(base.seq).leaf(i)) {
      target.install_partition(i, source.read_partition(3, i));
      ++installed;
    }
  }
  CHECK(installed == 3);  // the value, client 5's slice and client 300's slice
  CHECK(target.finish_install(3).digest == id.digest);
  CHECK(target.value() == 3);
}

TEST_CASE("counter install of undecodable bytes fails with a digest that cannot match and keeps the state") {
  CounterService s(nullptr);
  TokenClient c(5);
  c.increment(s, 1);
  const CheckpointId before = s.checkpoint(1);

  s.begin_install(10);
  s.install_partition(0, Bytes{1, 2, 3});  // not a u64
  CheckpointId id = s.finish_install(10);
  CHECK(id.digest.is_zero());
  CHECK(s.value() == 1);

  // A slice holding a client of another slice is not canonical either.
  Bytes wrong_slice;
  services_internal::put_u32(wrong_slice, 1);
  services_internal::put_u32(wrong_slice, 6);  // client 6 belongs to partition 7, not 1
  services_internal::put_u64(wrong_slice, 99);
  s.begin_install(10);
  s.install_partition(1, wrong_slice);
  CHECK(s.finish_install(10).digest.is_zero());

  s.begin_install(10);
  s.install_partition(kCounterPartitions, Bytes(8, 0));  // out of range
  CHECK(s.finish_install(10).digest.is_zero());

  // Still usable, unchanged.
  CHECK(c.increment(s, 2).value == 2);
  CHECK(s.checkpoint_tree(1).root() == before.digest);
}

TEST_CASE("counter retained checkpoints stay readable until discarded") {
  CounterService s(nullptr);
  TokenClient c(5);
  c.increment(s, 1);
  const CheckpointId one = s.checkpoint(1);
  const Bytes value_at_one = s.read_partition(1, 0);
  c.increment(s, 2);
  const CheckpointId two = s.checkpoint(2);
  CHECK(one.digest != two.digest);
  // The older checkpoint still reads as it was (copy-on-write keeps its bytes).
  CHECK(s.read_partition(1, 0) == value_at_one);
  CHECK(s.read_partition(2, 0) != value_at_one);
  CHECK(s.checkpoint_tree(1).root() == one.digest);
  CHECK(PartitionTree::leaf_digest(0, s.read_partition(1, 0)) == s.checkpoint_tree(1).leaf(0));
  s.discard_checkpoints_below(2);
  CHECK(s.checkpoint_tree(2).root() == two.digest);
}
