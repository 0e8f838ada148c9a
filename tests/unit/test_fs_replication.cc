// The file service as a replicated state machine: compound requests all or nothing, read-only execution,
// determinism across replicas, exact rollback, checkpoints, state transfer and recovery.
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "common/prng.h"
#include "shim/envelope.h"
#include "shim/shim.h"
#include "test_fs_util.h"

using namespace fstest;

TEST_CASE("fs compound: create then write through a result reference", "[fs]") {
  Harness h;
  const Result r = h.run({mkdir(kRoot, "d"), create(Handle::result_of(0), "f"),
                          write(Handle::result_of(1), 0, std::string("payload")), getattr(Handle::result_of(1))});
  REQUIRE(r.outcome == Outcome::kDone);
  REQUIRE(r.results.size() == 4);
  CHECK(r.results[3].attr.size == 7);
  const Handle f = h.ok(lookup(h.ok(lookup(kRoot, "d")).attr.handle(), "f")).attr.handle();
  CHECK(str(h.ok(read(f, 0, 100)).data) == "payload");
}

TEST_CASE("fs compound: a failing op undoes every earlier op of the request", "[fs]") {
  Harness h;
  h.make_file(kRoot, "exists");
  const Digest before = h.digest_at_checkpoint();
  const Result r = h.run({mkdir(kRoot, "d"), create(Handle::result_of(0), "f"),
                          write(Handle::result_of(1), 0, Bytes(100000, 7)), rename(kRoot, "exists", kRoot, "moved"),
                          create(kRoot, "moved", 0644, true)});
  CHECK(r.outcome == Outcome::kOpFailed);
  CHECK(r.stop == 4);
  REQUIRE(r.results.size() == 5);
  CHECK(r.results[3].err == err::kOk);
  CHECK(r.results[4].err == err::kExist);
  CHECK(h.digest_at_checkpoint() == before);
  CHECK(h.err_of(lookup(kRoot, "d")) == err::kNoEnt);
  CHECK(h.err_of(lookup(kRoot, "moved")) == err::kNoEnt);
  CHECK(h.err_of(lookup(kRoot, "exists")) == err::kOk);

  const Result r2 = h.run({mkdir(kRoot, "d2"), write(Handle::result_of(0), 0, std::string("x"))});
  CHECK(r2.outcome == Outcome::kOpFailed);
  CHECK(r2.stop == 1);
  CHECK(r2.results[1].err == err::kIsDir);
  CHECK(h.err_of(lookup(kRoot, "d2")) == err::kNoEnt);
}

TEST_CASE("fs compound: an errno predicate lets an expected failure pass and change nothing", "[fs]") {
  Harness h;
  const Result r = h.run({expecting_errno(lookup(kRoot, "f"), err::kNoEnt), create(kRoot, "f"),
                          expecting_errno(create(kRoot, "f"), err::kExist)});
  REQUIRE(r.outcome == Outcome::kDone);
  CHECK(r.results[0].err == err::kNoEnt);
  CHECK(r.results[1].err == err::kOk);
  CHECK(r.results[2].err == err::kExist);
  // The same predicate fails once the name exists: nothing of the request remains.
  const Result again = h.run({mkdir(kRoot, "d"), expecting_errno(lookup(kRoot, "f"), err::kNoEnt)});
  CHECK(again.outcome == Outcome::kPredicateFailed);
  CHECK(again.stop == 1);
  CHECK(again.results[1].err == err::kOk);  // the actual result, so the client learns the consensus value
  CHECK(h.err_of(lookup(kRoot, "d")) == err::kNoEnt);
}

TEST_CASE("fs compound: a digest predicate compares the whole result a client saw", "[fs]") {
  Harness h;
  const Handle f = h.make_file(kRoot, "f");
  h.ok(write(f, 0, std::string("v1")));
  const OpResult seen = h.ok(read(f, 0, 10));
  Result r = h.run({expecting(read(f, 0, 10), seen), write(f, 0, std::string("v2"))});
  CHECK(r.outcome == Outcome::kDone);
  // The prediction is now stale (the data and mtime changed): the dependent write does not happen.
  r = h.run({expecting(read(f, 0, 10), seen), write(f, 0, std::string("v3"))});
  CHECK(r.outcome == Outcome::kPredicateFailed);
  CHECK(r.stop == 0);
  CHECK(str(r.results[0].data) == "v2");
  CHECK(str(h.ok(read(f, 0, 10)).data) == "v2");
}

TEST_CASE("fs compound: a reference to an op that failed under its predicate is ESTALE", "[fs]") {
  Harness h;
  const Result r = h.run({expecting_errno(lookup(kRoot, "nope"), err::kNoEnt), getattr(Handle::result_of(0))});
  CHECK(r.outcome == Outcome::kOpFailed);
  CHECK(r.results[1].err == err::kStale);
}

TEST_CASE("fs malformed requests change nothing and say why", "[fs]") {
  Harness h;
  const Digest before = h.digest_at_checkpoint();
  Result r = h.run_bytes(Bytes{1, 0});
  CHECK(r.outcome == Outcome::kMalformed);
  CHECK(r.stop == static_cast<std::uint8_t>(FsDecodeError::kBadOpCount));
  r = h.run_bytes(Bytes{});
  CHECK(r.outcome == Outcome::kMalformed);
  CHECK(h.digest_at_checkpoint() == before);
}

TEST_CASE("fs read-only execution answers read-only compounds exactly as ordered execution does", "[fs]") {
  Harness h;
  const Handle f = h.make_file(kRoot, "f");
  h.ok(write(f, 0, std::string("data")));
  h.ok(symlink(kRoot, "s", "f"));
  const Bytes ro = encode_request(Request{{lookup(kRoot, "f"), read(Handle::result_of(0), 0, 4), readdir(kRoot, 0, 10),
                                           readlink(h.ok(lookup(kRoot, "s")).attr.handle()), statfs(kRoot),
                                           getattr(kRoot)}});
  Bytes fast;
  REQUIRE(h.svc.execute_read_only(7, ro, fast));
  h.run_bytes(ro);
  CHECK(fast == h.last_bytes);
  Bytes out;
  CHECK_FALSE(h.svc.execute_read_only(7, encode_request(Request{{getattr(kRoot), create(kRoot, "g")}}), out));
  CHECK_FALSE(h.svc.execute_read_only(7, encode_request(Request{{fsync(kRoot)}}), out));
  CHECK_FALSE(h.svc.execute_read_only(7, Bytes{9}, out));
}

TEST_CASE("fs two replicas executing the same requests return the same bytes and checkpoint digests", "[fs]") {
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    Harness a;
    Harness b;
    Workload w(seed);
    std::map<Outcome, int> outcomes;
    for (int i = 0; i < 400; ++i) {
      const Bytes req = encode_request(Request{w.next()});
      const Result r = a.run_bytes(req);
      w.learn(r);
      ++outcomes[r.outcome];
      b.run_bytes(req);
      REQUIRE(a.last_bytes == b.last_bytes);
      if (i % 50 == 49) REQUIRE(a.digest_at_checkpoint() == b.digest_at_checkpoint());
    }
    // The workload exercises both paths: requests that commit and requests that are undone.
    CHECK(outcomes[Outcome::kDone] > 40);
    CHECK(outcomes[Outcome::kOpFailed] > 40);
    CHECK(a.svc.object_count() > 10);
  }
}

TEST_CASE("fs rollback_to restores the exact state, digest for digest", "[fs]") {
  for (std::uint64_t seed : {11u, 12u, 13u}) {
    Harness h;
    Workload w(seed);
    for (int i = 0; i < 100; ++i) w.step(h);
    const std::uint64_t base = h.seq;
    const Digest at_base = h.digest_at_checkpoint();
    const Bytes listing = encode_request(Request{{readdir(kRoot, 0, 100)}});
    Bytes before_listing;
    REQUIRE(h.svc.execute_read_only(7, listing, before_listing));
    for (int i = 0; i < 60; ++i) w.step(h);
    // Tentative executions above `base` are undone; a checkpoint at base then has the same digest.
    h.svc.rollback_to(base);
    h.seq = base;
    CHECK(h.svc.undo_records() == 0);
    CHECK(h.svc.check_invariants() == "");
    CHECK(h.digest_at_checkpoint() == at_base);
    Bytes after_listing;
    REQUIRE(h.svc.execute_read_only(7, listing, after_listing));
    CHECK(after_listing == before_listing);
  }
}

TEST_CASE("fs rollback after commit_through undoes only the uncommitted part", "[fs]") {
  Harness h;
  h.make_file(kRoot, "committed");
  h.svc.commit_through(h.seq);
  CHECK(h.svc.undo_records() == 0);
  const std::uint64_t base = h.seq;
  const Digest at_base = h.digest_at_checkpoint();
  h.make_file(kRoot, "tentative");
  const Handle t = h.ok(lookup(kRoot, "tentative")).attr.handle();
  h.ok(write(t, 0, Bytes(200000, 3)));
  h.ok(remove(kRoot, "committed"));
  CHECK(h.svc.undo_records() > 0);
  h.svc.rollback_to(base);
  h.seq = base;
  CHECK(h.err_of(lookup(kRoot, "tentative")) == err::kNoEnt);
  CHECK(h.err_of(lookup(kRoot, "committed")) == err::kOk);
  h.svc.rollback_to(h.seq);
  CHECK(h.digest_at_checkpoint() == at_base);
}

TEST_CASE("fs a checkpoint re-encodes only the partitions that changed", "[fs]") {
  FsOptions o = small_options();
  o.partitions = 4096;
  Harness h(o);
  Workload w(5);
  for (int i = 0; i < 50; ++i) w.step(h);
  const CheckpointId c1 = h.svc.checkpoint(h.seq);
  const Handle f = h.make_file(kRoot, "one-more");
  h.ok(write(f, 0, std::string("x")));
  const CheckpointId c2 = h.svc.checkpoint(h.seq);
  std::uint64_t changed = 0;
  for (std::uint64_t p = 0; p < o.partitions; ++p) {
    if (h.svc.checkpoint_tree(c1.seq).leaf(p) != h.svc.checkpoint_tree(c2.seq).leaf(p)) ++changed;
  }
  // The superblock, the root inode, the new inode, its name and entry, the free-number record it reused, one
  // data block: at most 7 of 4096.
  CHECK(changed >= 1);
  CHECK(changed <= 7);
}

namespace {

// State transfer as the engine does it: every partition whose digest differs goes from `from` to `to`.
CheckpointId transfer(FsService& from, std::uint64_t seq, FsService& to) {
  to.begin_install(seq);
  const PartitionTree& tree = from.checkpoint_tree(seq);
  const PartitionTree& mine = to.checkpoint_tree(to.recovered_checkpoint().seq);
  for (std::uint64_t p = 0; p < from.partition_count(); ++p) {
    if (tree.leaf(p) != mine.leaf(p)) to.install_partition(p, from.read_partition(seq, p));
  }
  return to.finish_install(seq);
}

}  // namespace

TEST_CASE("fs state transfer into a fresh replica gives the same digest and behaviour", "[fs]") {
  Harness a;
  Workload w(77);
  for (int i = 0; i < 200; ++i) w.step(a);
  const Handle f = a.make_file(kRoot, "known");
  a.ok(write(f, 70000, std::string("tail")));
  const CheckpointId cp = a.svc.checkpoint(a.seq);

  Harness b;
  const CheckpointId installed = transfer(a.svc, cp.seq, b.svc);
  CHECK(installed.digest == cp.digest);
  CHECK(b.svc.check_invariants() == "");
  b.seq = a.seq;
  b.time_ns = a.time_ns;
  const Bytes tail = encode_request(Request{{read(f, 70000, 10)}});
  a.run_bytes(tail);
  b.run_bytes(tail);
  CHECK(a.last_bytes == b.last_bytes);
  for (int i = 0; i < 100; ++i) {
    const Bytes req = encode_request(Request{w.next()});
    w.learn(a.run_bytes(req));
    b.run_bytes(req);
    REQUIRE(a.last_bytes == b.last_bytes);
  }
  CHECK(a.digest_at_checkpoint() == b.digest_at_checkpoint());
}

TEST_CASE("fs state transfer discards a replica's own changes since its last checkpoint", "[fs]") {
  Harness a;
  a.make_file(kRoot, "from-a");
  const CheckpointId cp = a.svc.checkpoint(a.seq);
  Harness b;
  b.make_file(kRoot, "only-on-b");  // executed but never checkpointed: the install replaces it
  const CheckpointId got = transfer(a.svc, cp.seq, b.svc);
  CHECK(got.digest == cp.digest);
  CHECK(b.err_of(lookup(kRoot, "only-on-b")) == err::kNoEnt);
  CHECK(b.err_of(lookup(kRoot, "from-a")) == err::kOk);
}

TEST_CASE("fs install of bytes that are not file-service state is rejected and changes nothing", "[fs]") {
  Harness b;
  b.make_file(kRoot, "keep");
  const Digest before = b.digest_at_checkpoint();
  b.svc.begin_install(99);
  b.svc.install_partition(3, Bytes{1, 2, 3});
  const CheckpointId r = b.svc.finish_install(99);
  CHECK(r.digest.is_zero());
  CHECK(b.err_of(lookup(kRoot, "keep")) == err::kOk);
  CHECK(b.digest_at_checkpoint() == before);
}

TEST_CASE("fs recovers its last checkpoint from the snapshot store after a restart", "[fs]") {
  MemSnapshots snaps;
  CheckpointId cp;
  Handle f;
  {
    Harness a(small_options(), &snaps);
    f = a.make_file(kRoot, "durable");
    a.ok(write(f, 0, std::string("kept")));
    cp = a.svc.checkpoint(a.seq);
    a.make_file(kRoot, "lost");  // after the checkpoint: the engine replays it from its log
  }
  Harness b(small_options(), &snaps);
  CHECK(b.svc.recovered_checkpoint().seq == cp.seq);
  CHECK(b.svc.recovered_checkpoint().digest == cp.digest);
  b.seq = cp.seq;
  CHECK(str(b.ok(read(f, 0, 10)).data) == "kept");
  CHECK(b.err_of(lookup(kRoot, "lost")) == err::kNoEnt);
}

TEST_CASE("fs with the default 2^16 partitions checkpoints and transfers", "[fs]") {
  FsOptions o = small_options();
  o.partitions = FsOptions{}.partitions;
  Harness a(o);
  const Handle f = a.make_file(kRoot, "f");
  a.ok(write(f, 0, Bytes(3 * kBlockBytes, 9)));
  const CheckpointId cp = a.svc.checkpoint(a.seq);
  Harness b(o);
  CHECK(transfer(a.svc, cp.seq, b.svc).digest == cp.digest);
}

TEST_CASE("fs a partition that would exceed its byte limit gives ENOSPC and changes nothing", "[fs]") {
  FsOptions o = small_options();
  o.partitions = 1;  // everything in one partition: its limit is reached at 4 MiB
  Harness h(o);
  const Handle f = h.make_file(kRoot, "f");
  std::uint64_t off = 0;
  std::uint32_t last = err::kOk;
  while (last == err::kOk && off < (8u << 20)) {
    last = h.err_of(write(f, off, Bytes(kIoBytesMax, 1)));
    if (last == err::kOk) off += kIoBytesMax;
  }
  CHECK(last == err::kNoSpc);
  CHECK(h.attr(f).size == off);
  CHECK(h.svc.partition_count() == 1);
  const CheckpointId cp = h.svc.checkpoint(h.seq);  // still encodable within the limit
  CHECK(h.svc.read_partition(cp.seq, 0).size() <= kPartitionBytesMax);
}

TEST_CASE("fs runs behind the PBFT-CS shim: the largest results fit and the partitions add up", "[fs]") {
  namespace shim = bftfs::shim;
  FsService fs(nullptr, small_options());
  shim::Shim s(fs, nullptr);
  CHECK(s.partition_count() == small_options().partitions + shim::kShimPartitions);
  ExecContext ctx;
  ctx.seq = 1;
  ctx.client = 7;
  ctx.request_id = 1;
  ctx.timestamp_ns = 1000;
  const Bytes fill = encode_request(Request{{create(kRoot, "f"), write(Handle::result_of(0), 0, Bytes(kIoBytesMax, 5)),
                                             symlink(kRoot, "s", std::string(kSymlinkBytesMax, 'x'))}});
  shim::ShimResult sr;
  REQUIRE(shim::decode_envelope_result(s.execute(ctx, shim::encode_envelope({}, fill)), sr));
  REQUIRE(sr.status == shim::ShimStatus::kExecuted);
  Result r;
  REQUIRE(decode_result(sr.inner, r) == FsDecodeError::kOk);
  REQUIRE(r.outcome == Outcome::kDone);
  const Handle f = r.results[0].attr.handle();
  const Handle sl = r.results[2].attr.handle();
  // Near the worst case: a full read, a readlink of the longest target and a long readdir in one compound.
  const Bytes big = encode_request(Request{{read(f, 0, kIoBytesMax), readlink(sl), readdir(kRoot, 0, 900)}});
  Bytes out;
  REQUIRE(s.execute_read_only(7, shim::encode_envelope({}, big), out));
  REQUIRE(shim::decode_envelope_result(out, sr));
  REQUIRE(decode_result(sr.inner, r) == FsDecodeError::kOk);
  CHECK(r.outcome == Outcome::kDone);
  CHECK(r.results[0].data.size() == kIoBytesMax);
  CHECK(r.results[1].target.size() == kSymlinkBytesMax);
  CHECK_FALSE(s.checkpoint(1).digest.is_zero());
}
