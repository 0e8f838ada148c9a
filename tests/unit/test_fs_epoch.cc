// The file service's speculation ops (docs/SPECULATION.md §5): EPOCH all or nothing, the chain, staging, the
// pool, entries independent of the batch's seq and time, FETCH, and streams across checkpoints, state transfer
// and restarts.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "common/crypto.h"
#include "storage/disk_object_store.h"
#include "test_fs_speculation_util.h"
#include "test_runtime_util.h"

using namespace fstest;

namespace {

constexpr std::uint64_t kStream = 5;

// The one OpResult of a request of one op that must be done.
OpResult done1(Harness& h, const Op& op) {
  const Result r = h.run({op});
  INFO("outcome " << static_cast<int>(r.outcome) << " errno " << (r.results.empty() ? 0 : r.results[0].err));
  REQUIRE(r.outcome == Outcome::kDone);
  REQUIRE(r.results.size() == 1);
  return r.results[0];
}

std::uint32_t errno_of(Harness& h, const Op& op) {
  const Result r = h.run({op});
  REQUIRE(r.results.size() == 1);
  return r.results[0].err;
}

// An entry that creates `name` under the root at time t, expected to succeed.
Entry create_entry(std::uint64_t t, const std::string& name) {
  return entry_of(entry_request(t, {create(kRoot, name)}));
}

// An entry whose LOOKUP of `name` is expected to find nothing.
Entry absent_entry(std::uint64_t t, const std::string& name) {
  return entry_of(entry_request(t, {lookup(kRoot, name)}), Outcome::kOpFailed, 1, err::kNoEnt);
}

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

TEST_CASE("fs reserve takes the lowest free numbers and creates in entries take the pool in order", "[fs][epoch]") {
  Harness h;
  std::vector<Handle> made;
  for (const char* n : {"a", "b", "c", "d"}) made.push_back(h.make_file(kRoot, n));  // inodes 2..5
  h.ok(remove(kRoot, "b"));
  h.ok(remove(kRoot, "d"));
  const OpResult r = done1(h, reserve_op(kStream, 3));
  CHECK(r.pool_first == 0);
  REQUIRE(r.reserved.size() == 3);
  CHECK(r.reserved[0] == ReservedInode{3, 2});  // freed numbers first, each with its next generation
  CHECK(r.reserved[1] == ReservedInode{5, 2});
  CHECK(r.reserved[2] == ReservedInode{6, 1});
  CHECK(h.ok(statfs(kRoot)).statfs.ffree == small_options().inodes_max - 6);  // counted as used at once
  // A plain create does not touch the pool.
  CHECK(h.make_file(kRoot, "plain").ino == 7);
  const OpResult second = done1(h, reserve_op(kStream, 1));
  CHECK(second.pool_first == 3);

  const OpResult e = done1(h, epoch_op(kStream, 1, 0, {create_entry(10, "x"), create_entry(11, "y")}));
  REQUIRE(e.verdict == EpochVerdict::kApplied);
  CHECK(h.ok(lookup(kRoot, "x")).attr.handle() == Handle::of(3, 2));
  CHECK(h.ok(lookup(kRoot, "y")).attr.handle() == Handle::of(5, 2));
  CHECK(h.ok(lookup(kRoot, "x")).attr.mtime_ns == 10);  // the entry's TIME, not the batch's
  // Two left in the pool; a third create in an entry finds it empty.
  const Entry third = entry_of(entry_request(12, {create(kRoot, "p"), create(kRoot, "q"), create(kRoot, "r")}),
                               Outcome::kOpFailed, 3, err::kNoSpc);
  CHECK(done1(h, epoch_op(kStream, 2, 1, {third})).verdict == EpochVerdict::kApplied);
  CHECK(h.err_of(lookup(kRoot, "p")) == err::kNoEnt);  // the failed entry left nothing
  CHECK(done1(h, epoch_op(kStream, 3, 2, {create_entry(13, "p")})).verdict == EpochVerdict::kApplied);
  CHECK(h.ok(lookup(kRoot, "p")).attr.handle() == Handle::of(6, 1));
}

TEST_CASE("fs an epoch whose entry does not match changes nothing and names the entry", "[fs][epoch]") {
  Harness h;
  done1(h, reserve_op(kStream, 8));
  const Handle f = h.make_file(kRoot, "seen");
  h.ok(write(f, 0, std::string("old")));
  const OpResult attr = h.ok(getattr(f));
  const Digest before = h.digest_at_checkpoint();
  // Entry 2 read the file as it was; another client wrote it since: its digest predicate fails.
  Op read_seen = expecting(getattr(f), attr);
  std::vector<Entry> entries = {create_entry(20, "n1"), absent_entry(21, "n2"),
                                entry_of(entry_request(22, {read_seen})), create_entry(23, "n3")};
  h.ok(write(f, 0, std::string("new")));
  const Digest changed = h.digest_at_checkpoint();
  REQUIRE(changed != before);
  const OpResult r = done1(h, epoch_op(kStream, 1, 0, entries));
  CHECK(r.verdict == EpochVerdict::kEntry);
  CHECK(r.entry == 2);
  CHECK(r.entry_outcome == Outcome::kPredicateFailed);
  CHECK(r.entry_stop == 1);
  REQUIRE(r.entry_result.size() == 1);
  CHECK(r.entry_result[0].attr == h.ok(getattr(f)).attr);  // what the replicas have: the consensus value
  CHECK(r.last_before == 0);
  CHECK(h.digest_at_checkpoint() == changed);  // all of it, the stream's chain included
  CHECK(h.err_of(lookup(kRoot, "n1")) == err::kNoEnt);

  // An entry that expected a failure and succeeded reports no op.
  h.make_file(kRoot, "n2");
  const OpResult r2 = done1(h, epoch_op(kStream, 2, 0, {absent_entry(30, "n2")}));
  CHECK(r2.verdict == EpochVerdict::kEntry);
  CHECK(r2.entry == 0);
  CHECK(r2.entry_outcome == Outcome::kDone);
  CHECK(r2.entry_result.empty());
}

TEST_CASE("fs the chain: an epoch applies after its prev only, and a number applies once", "[fs][epoch]") {
  Harness h;
  done1(h, reserve_op(kStream, 8));
  CHECK(done1(h, epoch_op(kStream, 1, 0, {create_entry(1, "a")})).verdict == EpochVerdict::kApplied);
  // The same batch again (a resubmission after a relay restart): refused, and last_before says it applied.
  const OpResult again = done1(h, epoch_op(kStream, 1, 0, {create_entry(1, "a")}));
  CHECK(again.verdict == EpochVerdict::kChain);
  CHECK(again.last_before == 1);
  CHECK(done1(h, epoch_op(kStream, 2, 1, {create_entry(2, "b")})).verdict == EpochVerdict::kApplied);
  // Epoch 3 fails at its entry; its re-run is epoch 4 with prev 2; a late copy of 3 can never apply after it.
  h.make_file(kRoot, "c");
  CHECK(done1(h, epoch_op(kStream, 3, 2, {absent_entry(3, "c")})).verdict == EpochVerdict::kEntry);
  CHECK(done1(h, epoch_op(kStream, 4, 2, {create_entry(4, "d")})).verdict == EpochVerdict::kApplied);
  h.ok(remove(kRoot, "c"));
  const OpResult late = done1(h, epoch_op(kStream, 3, 2, {absent_entry(3, "c")}));
  CHECK(late.verdict == EpochVerdict::kChain);
  CHECK(late.last_before == 4);
  CHECK(done1(h, epoch_op(kStream, 5, 3, {})).verdict == EpochVerdict::kChain);
  // Streams are per client: another client's stream of the same number has its own chain.
  const Bytes other = encode_request(Request{{epoch_op(kStream, 1, 0, {})}});
  ExecContext ctx{++h.seq, 8, 1, h.time_ns};
  Result r;
  REQUIRE(decode_result(h.svc.execute(ctx, other), r) == FsDecodeError::kOk);
  CHECK(r.results[0].verdict == EpochVerdict::kApplied);
  CHECK(done1(h, epoch_op(kStream, 6, 4, {})).verdict == EpochVerdict::kApplied);
}

TEST_CASE("fs staging: parts are stored, checked by number, epoch and digest, and applied with the epoch",
          "[fs][epoch]") {
  Harness h;
  done1(h, reserve_op(kStream, 16));
  const std::vector<Entry> p0 = {create_entry(1, "s0"), create_entry(2, "s1")};
  const std::vector<Entry> p1 = {create_entry(3, "s2")};
  const std::vector<Entry> inline_entries = {create_entry(4, "i0")};
  const std::vector<Bytes> parts = {encode_entries(p0), encode_entries(p1)};
  const Digest digest = parts_digest(parts);
  OpResult st = done1(h, stage_op(kStream, 1, 1, p1));  // parts may arrive in any order
  CHECK(st.parts_present == 1);
  st = done1(h, stage_op(kStream, 1, 0, p0));
  CHECK(st.parts_present == 2);
  CHECK(st.staged_bytes == parts[0].size() + parts[1].size());
  st = done1(h, stage_op(kStream, 1, 0, p0));  // resubmitted: replaces itself
  CHECK(st.parts_present == 2);
  CHECK(st.staged_bytes == parts[0].size() + parts[1].size());

  const Digest before = h.digest_at_checkpoint();
  CHECK(done1(h, epoch_op(kStream, 1, 0, inline_entries, 2, bftfs::digest_of(Bytes{1}))).verdict ==
        EpochVerdict::kStaging);
  CHECK(done1(h, epoch_op(kStream, 1, 0, inline_entries, 3, digest)).verdict == EpochVerdict::kStaging);
  CHECK(done1(h, epoch_op(kStream, 2, 0, inline_entries, 2, digest)).verdict == EpochVerdict::kStaging);
  CHECK(h.digest_at_checkpoint() == before);
  const OpResult applied = done1(h, epoch_op(kStream, 1, 0, inline_entries, 2, digest));
  REQUIRE(applied.verdict == EpochVerdict::kApplied);
  for (const char* n : {"s0", "s1", "s2", "i0"}) CHECK(h.err_of(lookup(kRoot, n)) == err::kOk);
  // Staged entries run first, in part order: their inode numbers say so.
  CHECK(h.ok(lookup(kRoot, "s0")).attr.ino < h.ok(lookup(kRoot, "s2")).attr.ino);
  CHECK(h.ok(lookup(kRoot, "s2")).attr.ino < h.ok(lookup(kRoot, "i0")).attr.ino);

  // After the epoch applied its parts are gone, and parts of it or earlier are stale.
  CHECK(errno_of(h, stage_op(kStream, 1, 0, p0)) == err::kStale);
  st = done1(h, stage_op(kStream, 3, 0, p1));
  CHECK(st.parts_present == 1);
  CHECK(errno_of(h, stage_op(kStream, 2, 0, p1)) == err::kStale);  // below the epoch being staged
  st = done1(h, stage_op(kStream, 4, 0, p0));                     // a later epoch's parts replace them
  CHECK(st.parts_present == 1);
  CHECK(st.staged_bytes == parts[0].size());
  CHECK(done1(h, epoch_op(kStream, 3, 1, {}, 1, parts_digest(std::vector<Bytes>{parts[1]}))).verdict ==
        EpochVerdict::kStaging);
}

TEST_CASE("fs staging is bounded per stream: 16 MiB", "[fs][epoch]") {
  Harness h;
  h.check_invariants = false;  // megabytes of staged parts: the full walk after each would be slow
  const Handle f = h.make_file(kRoot, "big");
  // 2 entries of 500 kB per part: the 17th part would pass 16 MiB.
  const Entry big = entry_of(entry_request(1, {write(f, 0, Bytes(500000, 1))}));
  std::uint32_t part = 0;
  for (; part < 16; ++part) REQUIRE(errno_of(h, stage_op(kStream, 1, part, {big, big})) == err::kOk);
  CHECK(errno_of(h, stage_op(kStream, 1, part, {big, big})) == err::kNoSpc);
  CHECK(errno_of(h, stage_op(kStream, 1, 0, {big})) == err::kOk);  // a smaller part 0 in its place fits
  h.check_invariants = true;
  CHECK(h.svc.check_invariants() == "");
}

TEST_CASE("fs an entry gives the same result and state whatever the batch's seq and time", "[fs][epoch]") {
  Harness a;
  Harness b;
  for (Harness* h : {&a, &b}) {
    done1(*h, reserve_op(kStream, 4));
    h->make_file(kRoot, "old");
  }
  const Request req = entry_request(777, {mkdir(kRoot, "d"), create(Handle::result_of(1), "f"),
                                          write(Handle::result_of(2), 0, std::string("data")), remove(kRoot, "old"),
                                          readdir(kRoot, 0, 10)});
  const EntryRun ra = a.svc.execute_entry(ExecContext{a.seq + 1, 7, 1, 5}, kStream, req);
  const EntryRun rb = b.svc.execute_entry(ExecContext{b.seq + 1000, 7, 99, 123456789}, kStream, req);
  REQUIRE(ra.complete());
  REQUIRE(rb.complete());
  CHECK(ra.result.outcome == Outcome::kDone);
  CHECK(ra.result == rb.result);
  CHECK(ra.result.results[3].attr.mtime_ns == 777);
  a.seq += 1;
  b.seq += 1000;
  CHECK(a.digest_at_checkpoint() == b.digest_at_checkpoint());
  // Undo is under ctx.seq like any execution.
  Harness c;
  done1(c, reserve_op(kStream, 4));
  c.make_file(kRoot, "old");
  const Digest clean = c.digest_at_checkpoint();
  REQUIRE(c.svc.execute_entry(ExecContext{c.seq + 1, 7, 1, 5}, kStream, req).complete());
  c.svc.rollback_to(c.seq);
  CHECK(c.digest_at_checkpoint() == clean);
}

TEST_CASE("fs fetch by key gives values and where the next key is, and changes nothing", "[fs][epoch]") {
  Harness h;
  const Handle f = h.make_file(kRoot, "f");
  h.ok(write(f, 0, std::string("abc")));
  const OpResult r = done1(h, fetch_keys({ObjectKey::inode(f.ino), ObjectKey::dir_name(kRootIno, "zzz"),
                                          ObjectKey::data(f.ino, 0), ObjectKey::data(f.ino, 1)}));
  CHECK(r.complete);
  REQUIRE(r.facts.size() == 4);
  CHECK(r.facts[0].kind == FactKind::kValue);
  CHECK(r.facts[1].kind == FactKind::kNext);  // absent; the next key is the root's first entry record
  CHECK(r.facts[1].next == ObjectKey{kRootIno, Kind::kEntry, h.ok(readdir(kRoot, 2, 1)).entries[0].cookie, {}});
  CHECK(r.facts[2].value == Bytes{'a', 'b', 'c'});
  CHECK(r.facts[3].kind == FactKind::kNext);
}

TEST_CASE("fs fetch traces what an entry reads, as facts about the state before it", "[fs][epoch]") {
  Harness h;
  done1(h, reserve_op(kStream, 4));
  const Handle d = h.make_dir(kRoot, "d");
  for (const char* n : {"a", "b", "c"}) h.make_file(d, n);
  const Digest before = h.digest_at_checkpoint();
  // Removes two names, then lists the directory: the listing's scans pass the removed entries.
  const Request traced = entry_request(5, {remove(d, "a"), remove(d, "b"), readdir(d, 0, 10), create(d, "n")});
  const Op fetch = fetch_trace(kStream, traced);
  const OpResult ordered = done1(h, fetch);
  CHECK(ordered.complete);
  CHECK(h.digest_at_checkpoint() == before);
  Bytes read_only;
  REQUIRE(h.svc.execute_read_only(7, encode_request(Request{{fetch}}), read_only));
  Result ro;
  REQUIRE(decode_result(read_only, ro) == FsDecodeError::kOk);
  CHECK(ro.results[0] == ordered);
  CHECK(h.digest_at_checkpoint() == before);
  // Every fact is true of the state the FETCH ran at: check each against the service through FETCH by key.
  for (const Fact& f : ordered.facts) {
    const OpResult now = done1(h, fetch_keys({f.key}));
    REQUIRE(now.facts.size() == 1);
    if (f.kind == FactKind::kValue) CHECK(now.facts[0] == f);
    if (f.kind == FactKind::kAbsent) CHECK(now.facts[0].kind == FactKind::kNext);
    if (f.kind == FactKind::kNext && now.facts[0].kind == FactKind::kNext) CHECK(now.facts[0].next == f.next);
    if (f.kind == FactKind::kNext && now.facts[0].kind == FactKind::kValue) CHECK(f.next == f.key);
  }
  // The pool's front is among them (the create takes it), and so is every entry of the listing.
  bool pool_seen = false;
  std::size_t entry_values = 0;
  for (const Fact& f : ordered.facts) {
    pool_seen |= f.key.kind == Kind::kPool && f.kind == FactKind::kValue;
    entry_values += f.key.kind == Kind::kEntry && f.key.ino == d.ino && f.kind == FactKind::kValue ? 1 : 0;
  }
  CHECK(pool_seen);
  CHECK(entry_values == 1);  // "c": a and b were removed before the listing read them
}

TEST_CASE("fs stream close returns unused numbers as they were; streams are limited and expire", "[fs][epoch]") {
  Harness h;
  const OpResult r = done1(h, reserve_op(kStream, 3));
  done1(h, epoch_op(kStream, 1, 0, {create_entry(1, "used")}));
  done1(h, stage_op(kStream, 2, 0, {create_entry(2, "staged")}));
  const std::uint64_t free_before = h.ok(statfs(kRoot)).statfs.ffree;
  done1(h, stream_close_op(kStream));
  CHECK(h.ok(statfs(kRoot)).statfs.ffree == free_before + 2);
  done1(h, stream_close_op(kStream));  // closing again changes nothing
  // The next plain creates get exactly the unused numbers, with the generations the pool gave them.
  CHECK(h.make_file(kRoot, "p1") == Handle::of(r.reserved[1].ino, r.reserved[1].generation));
  CHECK(h.make_file(kRoot, "p2") == Handle::of(r.reserved[2].ino, r.reserved[2].generation));
  // The chain starts over: the stream is gone.
  CHECK(done1(h, epoch_op(kStream, 9, 0, {})).verdict == EpochVerdict::kApplied);

  for (std::uint64_t s = 100; s < 100 + kStreamsPerClientMax - 1; ++s) done1(h, reserve_op(s, 1));
  CHECK(errno_of(h, reserve_op(1000, 1)) == err::kNoSpc);  // the 65th
  CHECK(errno_of(h, stage_op(1000, 1, 0, {create_entry(1, "x")})) == err::kNoSpc);
  CHECK(errno_of(h, epoch_op(1000, 1, 0, {})) == err::kNoSpc);
  CHECK(errno_of(h, reserve_op(100, 1)) == err::kOk);  // an existing stream is not a new one
  // Idle streams go at the client's next RESERVE, STAGE or applied EPOCH, which then has room.
  h.seq += kStreamIdleSeqs + 10;
  // STAGE erases none (it changes stream objects only): idle streams still count against a new one.
  CHECK(errno_of(h, stage_op(1000, 1, 0, {create_entry(1, "x")})) == err::kNoSpc);
  done1(h, reserve_op(100, 1));  // keeps stream 100 (named), erases the other idle ones
  CHECK(errno_of(h, reserve_op(1000, 1)) == err::kOk);
  // In use: the root, "used", "p1", "p2"; reserved: stream 100's three and stream 1000's one.
  CHECK(h.ok(statfs(kRoot)).statfs.ffree == h.svc.options().inodes_max - 4 - 4);
}

TEST_CASE("fs streams survive checkpoints, state transfer and restarts", "[fs][epoch]") {
  MemSnapshots snaps;
  CheckpointId cp;
  const std::vector<Entry> part = {create_entry(2, "staged")};
  const Digest digest = parts_digest(std::vector<Bytes>{encode_entries(part)});
  {
    Harness a(small_options(), &snaps);
    done1(a, reserve_op(kStream, 4));
    done1(a, epoch_op(kStream, 1, 0, {create_entry(1, "first")}));
    done1(a, stage_op(kStream, 2, 0, part));
    cp = a.svc.checkpoint(a.seq);
    Harness b;
    REQUIRE(transfer(a.svc, cp.seq, b.svc).digest == cp.digest);
    CHECK(b.svc.check_invariants() == "");
    b.seq = a.seq;
    for (Harness* h : {&a, &b}) {
      const OpResult r = done1(*h, epoch_op(kStream, 2, 1, {create_entry(3, "inline")}, 1, digest));
      CHECK(r.verdict == EpochVerdict::kApplied);
    }
    CHECK(a.digest_at_checkpoint() == b.digest_at_checkpoint());
  }
  Harness c(small_options(), &snaps);  // restarted from a's last checkpoint: epoch 2 applied there
  c.seq = c.svc.recovered_checkpoint().seq;
  CHECK(c.ok(lookup(kRoot, "staged")).attr.mtime_ns == 2);
  const OpResult again = done1(c, epoch_op(kStream, 2, 1, {create_entry(3, "inline")}, 1, digest));
  CHECK(again.verdict == EpochVerdict::kChain);
  CHECK(again.last_before == 2);
  CHECK(done1(c, epoch_op(kStream, 3, 2, {create_entry(4, "third")})).verdict == EpochVerdict::kApplied);
  CHECK(c.ok(lookup(kRoot, "third")).attr.ino == 5);  // the pool's fourth number: 2, 3, 4 went before
}

TEST_CASE("fs the speculation ops give the memory store's results and digests over the disk store", "[fs][epoch]") {
  bftfs::testing::TempDir dir;
  bftfs::DiskStoreOptions d;
  d.partitions = small_options().partitions;
  std::unique_ptr<bftfs::DiskObjectStore> store;
  REQUIRE(bftfs::DiskObjectStore::open(dir.path, d, store).empty());
  Harness mem;
  Harness disk(std::move(store), small_options());
  const Handle dd = mem.make_dir(kRoot, "d");
  disk.make_dir(kRoot, "d");
  const std::vector<Entry> part = {entry_of(entry_request(3, {create(dd, "p"), write(Handle::result_of(1), 0,
                                                                                  Bytes(100000, 7))}))};
  const Digest digest = parts_digest(std::vector<Bytes>{encode_entries(part)});
  const std::vector<Request> requests = {
      Request{{reserve_op(kStream, 8)}},
      Request{{epoch_op(kStream, 1, 0, {create_entry(1, "a"), absent_entry(2, "b")})}},
      Request{{stage_op(kStream, 2, 0, part)}},
      Request{{epoch_op(kStream, 2, 1, {create_entry(4, "c")}, 1, digest)}},
      Request{{fetch_trace(kStream, entry_request(5, {remove(kRoot, "a"), readdir(kRoot, 0, 10), create(dd, "q")}))}},
      Request{{stream_close_op(kStream)}},
  };
  for (const Request& r : requests) {
    mem.run(r.ops);
    disk.run(r.ops);
    REQUIRE(mem.last_bytes == disk.last_bytes);
    Bytes ro_mem;
    Bytes ro_disk;
    const Request trace{{fetch_trace(kStream, entry_request(6, {readdir(dd, 0, 10), create(kRoot, "t")}))}};
    REQUIRE(mem.svc.execute_read_only(7, encode_request(trace), ro_mem));
    REQUIRE(disk.svc.execute_read_only(7, encode_request(trace), ro_disk));
    REQUIRE(ro_mem == ro_disk);
    REQUIRE(mem.digest_at_checkpoint() == disk.digest_at_checkpoint());
  }
}
