// The file service over the replica's disk store (storage/disk_object_store.h), in real temporary directories:
// equivalence with the in-memory store (results, digests, rollback), restart and crash consistency of the
// index, checksum failures that are detected, never answered, and repaired by an install.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "storage/crc32c.h"
#include "storage/disk_object_store.h"
#include "test_fs_util.h"
#include "test_runtime_util.h"

using namespace fstest;
using bftfs::DiskObjectStore;
using bftfs::DiskStoreOptions;
using bftfs::testing::TempDir;

namespace {

DiskStoreOptions disk_options(const FsOptions& o) {
  DiskStoreOptions d;
  d.partitions = o.partitions;
  return d;
}

// Opens the store in `dir` (it must open); `raw` keeps a pointer for inspection after the service owns it.
std::unique_ptr<DiskObjectStore> open_store(const std::string& dir, const DiskStoreOptions& d,
                                            DiskObjectStore** raw = nullptr) {
  std::unique_ptr<DiskObjectStore> s;
  const std::string err = DiskObjectStore::open(dir, d, s);
  INFO(err);
  REQUIRE(err.empty());
  if (raw != nullptr) *raw = s.get();
  return s;
}

std::unique_ptr<Harness> disk_harness(const std::string& dir, FsOptions o = small_options(),
                                      DiskObjectStore** raw = nullptr) {
  return std::make_unique<Harness>(open_store(dir, disk_options(o), raw), o);
}

off_t file_size(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  const off_t size = ::lseek(fd, 0, SEEK_END);
  ::close(fd);
  return size;
}

void truncate_file(const std::string& path, off_t size) { REQUIRE(::truncate(path.c_str(), size) == 0); }

void flip_byte(const std::string& path, std::uint64_t offset) {
  const int fd = ::open(path.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  std::uint8_t b = 0;
  REQUIRE(::pread(fd, &b, 1, static_cast<off_t>(offset)) == 1);
  b ^= 0x5A;
  REQUIRE(::pwrite(fd, &b, 1, static_cast<off_t>(offset)) == 1);
  ::close(fd);
}

// State transfer as the engine does it for a repair: every partition whose digest differs from the local
// checkpoint's, with the damaged partitions' leaves blanked (protocol/replica_state_transfer.cc check_service_damage).
CheckpointId repair_from(FsService& from, std::uint64_t seq, FsService& to) {
  PartitionTree mine = to.checkpoint_tree(to.recovered_checkpoint().seq);
  for (std::uint64_t p : to.damaged_partitions()) mine.set_leaf(p, Digest{});
  const PartitionTree& tree = from.checkpoint_tree(seq);
  to.begin_install(seq);
  for (std::uint64_t p = 0; p < from.partition_count(); ++p) {
    if (tree.leaf(p) != mine.leaf(p)) to.install_partition(p, from.read_partition(seq, p));
  }
  return to.finish_install(seq);
}

}  // namespace

namespace {

// Runs `requests` random requests on the memory store and the disk store side by side (results equal), and
// every `interval` requests undoes the last `undo` of them on both (tentative execution undone by a view
// change) and checkpoints: the digests must be equal.
void check_equivalence(std::uint64_t seed, int requests, int interval, std::uint64_t undo) {
  TempDir dir;
  Harness mem;
  auto disk = disk_harness(dir.path);
  Workload w(seed);
  std::uint64_t committed = 0;
  for (int i = 0; i < requests; ++i) {
    const Bytes req = encode_request(Request{w.next()});
    w.learn(mem.run_bytes(req));
    disk->run_bytes(req);
    REQUIRE(mem.last_bytes == disk->last_bytes);
    if (i % interval == interval - 1) {
      const std::uint64_t back = std::max(committed, mem.seq - undo);
      mem.svc.rollback_to(back);
      disk->svc.rollback_to(back);
      mem.seq = disk->seq = back;
      REQUIRE(mem.svc.checkpoint(back).digest == disk->svc.checkpoint(back).digest);
      committed = back;
      disk->svc.discard_checkpoints_below(back);
    }
  }
  CHECK(disk->svc.check_invariants() == "");
  CHECK(disk->svc.object_count() == mem.svc.object_count());
}

}  // namespace

TEST_CASE("fs disk store gives the memory store's results, digests and rollbacks on random requests", "[fs][disk]") {
  for (std::uint64_t seed : {21u, 22u}) check_equivalence(seed, 300, 40, 3);
}

// Long checkpoint intervals: most dirty partitions are digested ahead of the checkpoint (DiskObjectStore's
// digest cache, kDigestLag changes behind), some change again or are rolled back after being digested; the
// checkpoint digests must still be the memory store's.
TEST_CASE("fs disk store: partitions digested ahead of a long checkpoint interval give the same digests",
          "[fs][disk]") {
  for (std::uint64_t seed : {23u, 24u}) check_equivalence(seed, 1200, 300, 40);
}

TEST_CASE("fs disk store recovers its last checkpoint after a restart, without what followed it", "[fs][disk]") {
  TempDir dir;
  Handle f;
  CheckpointId cp;
  Bytes listing;
  const Bytes ls = encode_request(Request{{readdir(kRoot, 0, 100)}});
  {
    auto h = disk_harness(dir.path);
    f = h->make_file(kRoot, "kept");
    h->ok(write(f, 0, Bytes(150000, 7)));
    cp = h->svc.checkpoint(h->seq);
    REQUIRE(h->svc.execute_read_only(7, ls, listing));
    h->make_file(kRoot, "lost");  // executed after the checkpoint: the engine replays it from its log
  }
  auto h = disk_harness(dir.path);
  CHECK(h->svc.recovered_checkpoint().seq == cp.seq);
  CHECK(h->svc.recovered_checkpoint().digest == cp.digest);
  CHECK(h->svc.check_invariants() == "");
  Bytes again;
  REQUIRE(h->svc.execute_read_only(7, ls, again));
  CHECK(again == listing);
  h->seq = cp.seq;
  const OpResult r = h->ok(read(f, 100000, 10));
  CHECK(r.data == Bytes(10, 7));
  CHECK(h->err_of(lookup(kRoot, "lost")) == err::kNoEnt);
}

TEST_CASE("fs disk store: a crash at any point of a checkpoint's index write recovers the previous or the new one",
          "[fs][disk]") {
  TempDir dir;
  const std::string index = dir.path + "/index";
  const std::string data = dir.path + "/data";
  CheckpointId first;
  CheckpointId second;
  off_t first_end = 0;
  off_t data_first_end = 0;
  {
    auto h = disk_harness(dir.path);
    Workload w(31);
    for (int i = 0; i < 40; ++i) w.step(*h);
    first = h->svc.checkpoint(h->seq);
    first_end = file_size(index);
    data_first_end = file_size(data);
    for (int i = 0; i < 40; ++i) w.step(*h);
    second = h->svc.checkpoint(h->seq);
  }
  const off_t second_end = file_size(index);
  REQUIRE(second_end > first_end);
  // Keep a copy of the whole journal and data file, then cut the journal at many points inside the second
  // checkpoint's records (a crash mid-append): the store must come back at exactly the first checkpoint.
  const std::string saved_index = dir.path + "/index.saved";
  const std::string saved_data = dir.path + "/data.saved";
  REQUIRE(std::system(("cp '" + index + "' '" + saved_index + "' && cp '" + data + "' '" + saved_data + "'").c_str()) == 0);
  const off_t step = std::max<off_t>(1, (second_end - first_end) / 50);
  std::vector<off_t> cuts;
  for (off_t cut = first_end; cut < second_end; cut += step) cuts.push_back(cut);
  cuts.push_back(second_end);
  for (const off_t cut : cuts) {
    REQUIRE(std::system(("cp '" + saved_index + "' '" + index + "' && cp '" + saved_data + "' '" + data + "'").c_str()) == 0);
    truncate_file(index, cut);
    auto h = disk_harness(dir.path);
    const CheckpointId want = cut == second_end ? second : first;
    INFO("cut at " << cut << " of " << second_end);
    CHECK(h->svc.recovered_checkpoint().seq == want.seq);
    CHECK(h->svc.recovered_checkpoint().digest == want.digest);
    CHECK(h->svc.check_invariants() == "");
    if (cut != second_end) CHECK(file_size(data) == data_first_end);  // values of the lost checkpoint are cut off
  }
}

TEST_CASE("fs disk store refuses a directory whose index does not fit or was damaged", "[fs][disk]") {
  TempDir dir;
  {
    auto h = disk_harness(dir.path);
    h->make_file(kRoot, "x");
    h->svc.checkpoint(h->seq);
  }
  DiskStoreOptions other = disk_options(small_options());
  other.partitions = 512;
  std::unique_ptr<DiskObjectStore> s;
  CHECK(DiskObjectStore::open(dir.path, other, s).find("partitions") != std::string::npos);
  CHECK(s == nullptr);
  // Data lost behind the index's back (a truncated data file): the checkpoint names bytes that are gone.
  truncate_file(dir.path + "/data", 3);
  CHECK(DiskObjectStore::open(dir.path, disk_options(small_options()), s).find("lost writes") != std::string::npos);
}

TEST_CASE("fs disk store: a flipped byte is detected, never answered, and repaired by an install", "[fs][disk]") {
  TempDir dir;
  Harness healthy;
  DiskObjectStore* store = nullptr;
  auto h = disk_harness(dir.path, small_options(), &store);
  const auto both = [&](const std::vector<Op>& ops) {
    const Bytes req = encode_request(Request{ops});
    healthy.run_bytes(req);
    h->run_bytes(req);
    REQUIRE(healthy.last_bytes == h->last_bytes);
    return healthy.last_bytes;
  };
  const Bytes content(100000, 0x42);
  both({create(kRoot, "victim"), write(Handle::result_of(0), 0, content)});
  both({create(kRoot, "other"), write(Handle::result_of(0), 0, std::string("fine"))});
  const Handle victim = healthy.ok(lookup(kRoot, "victim")).attr.handle();
  h->ok(lookup(kRoot, "victim"));
  healthy.seq = h->seq;
  const CheckpointId base = h->svc.checkpoint(h->seq);
  REQUIRE(healthy.svc.checkpoint(healthy.seq).digest == base.digest);

  // Bit rot in the first data block of "victim".
  const ObjectKey block = ObjectKey::data(victim.ino, 0);
  const auto extent = store->extent_of(block);
  REQUIRE(extent.has_value());
  flip_byte(store->data_path(), extent->first + 1000);
  CHECK(h->svc.damaged_partitions().empty());  // not read yet

  // A read-only read answers nothing; an ordered one returns EIO (which the engine never sends: it checks
  // damaged_partitions() after every execution); the partition is marked damaged.
  Bytes out;
  CHECK_FALSE(h->svc.execute_read_only(7, encode_request(Request{{read(victim, 0, 100)}}), out));
  const std::uint64_t p = partition_of(block, small_options().partitions);
  CHECK(h->svc.damaged_partitions() == std::vector<std::uint64_t>{p});
  const OpResult r = h->one(read(victim, 0, 100));
  CHECK(r.err == err::kIo);
  CHECK(r.data.empty());
  // A damaged service takes no checkpoint (nothing computed from bad bytes is claimed).
  const Handle other = h->ok(lookup(kRoot, "other")).attr.handle();
  CHECK(other.ino != 0);

  // The healthy replica moves on and checkpoints; the damaged one repairs from it.
  healthy.seq = h->seq;
  healthy.ok(write(healthy.ok(lookup(kRoot, "other")).attr.handle(), 4, std::string("!")));
  const CheckpointId target = healthy.svc.checkpoint(healthy.seq);
  const CheckpointId repaired = repair_from(healthy.svc, target.seq, h->svc);
  CHECK(repaired.digest == target.digest);
  CHECK(h->svc.damaged_partitions().empty());
  CHECK(store->scrub() == 0);
  CHECK(h->svc.check_invariants() == "");
  h->seq = healthy.seq;
  CHECK(h->ok(read(victim, 0, 100000)).data == content);
  CHECK(h->ok(read(other, 0, 5)).data == Bytes{'f', 'i', 'n', 'e', '!'});
}

TEST_CASE("fs disk store: damage found while checkpointing takes no checkpoint", "[fs][disk]") {
  TempDir dir;
  DiskObjectStore* store = nullptr;
  auto h = disk_harness(dir.path, small_options(), &store);
  const Handle f = h->make_file(kRoot, "f");
  h->ok(write(f, 0, Bytes(5000, 1)));
  const CheckpointId before = h->svc.checkpoint(h->seq);
  h->ok(write(f, 5000, Bytes(10, 2)));  // dirties the block's partition: the checkpoint reads it back
  const auto extent = store->extent_of(ObjectKey::data(f.ino, 0));
  REQUIRE(extent.has_value());
  flip_byte(store->data_path(), extent->first);
  const CheckpointId failed = h->svc.checkpoint(h->seq);
  CHECK(failed.digest.is_zero());
  CHECK_FALSE(h->svc.damaged_partitions().empty());
  CHECK(store->latest().seq == before.seq);  // nothing taken: the previous checkpoint is still the newest
}

TEST_CASE("fs disk store: the index journal is rewritten when it grows and still recovers", "[fs][disk]") {
  TempDir dir;
  FsOptions o = small_options();
  DiskStoreOptions d = disk_options(o);
  d.index_compact_bytes_min = 0;
  CheckpointId last;
  {
    DiskObjectStore* store = nullptr;
    Harness h(open_store(dir.path, d, &store), o);
    const Handle f = h.make_file(kRoot, "f");
    for (int i = 0; i < 30; ++i) {
      h.ok(write(f, 0, Bytes(100, static_cast<std::uint8_t>(i))));
      last = h.svc.checkpoint(h.seq);
      h.svc.discard_checkpoints_below(h.seq);
    }
    CHECK(store->stats().index_compactions > 0);
    CHECK(store->stats().index_file_bytes < 64 * 1024);
  }
  Harness h(open_store(dir.path, d), o);
  CHECK(h.svc.recovered_checkpoint().digest == last.digest);
  h.seq = last.seq;
  CHECK(h.ok(read(h.ok(lookup(kRoot, "f")).attr.handle(), 0, 1)).data == Bytes{29});
}

TEST_CASE("fs disk store serves retained older checkpoints from their index versions", "[fs][disk]") {
  TempDir dir;
  Harness mem;
  auto disk = disk_harness(dir.path);
  Workload w(41);
  std::vector<CheckpointId> cps;
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 30; ++i) {
      const Bytes req = encode_request(Request{w.next()});
      w.learn(mem.run_bytes(req));
      disk->run_bytes(req);
    }
    cps.push_back(disk->svc.checkpoint(disk->seq));
    REQUIRE(mem.svc.checkpoint(mem.seq).digest == cps.back().digest);
  }
  for (int i = 0; i < 10; ++i) {  // uncheckpointed changes on top must not leak into the retained versions
    const Bytes req = encode_request(Request{w.next()});
    w.learn(mem.run_bytes(req));
    disk->run_bytes(req);
  }
  for (const CheckpointId& c : cps) {
    for (std::uint64_t p = 0; p < disk->svc.partition_count(); ++p) {
      REQUIRE(disk->svc.read_partition(c.seq, p) == mem.svc.read_partition(c.seq, p));
    }
  }
}

TEST_CASE("fs disk store: an install at its latest checkpoint's seq replaces it; older ones stay readable",
          "[fs][disk]") {
  // A replica whose crash kept this checkpoint but lost the engine's record of it fetches the cluster's
  // checkpoint at the same seq (protocol/service.h finish_install).
  TempDir dir;
  Harness mem;  // the same history as the disk store
  Harness other;  // another history of the same length: the checkpoint the cluster agreed on
  auto disk = disk_harness(dir.path);
  Workload w(43);
  Workload w_other(44);
  CheckpointId older;
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 30; ++i) {
      const Bytes req = encode_request(Request{w.next()});
      w.learn(mem.run_bytes(req));
      disk->run_bytes(req);
      w_other.learn(other.run_bytes(encode_request(Request{w_other.next()})));
    }
    const CheckpointId mine = disk->svc.checkpoint(disk->seq);
    REQUIRE(mem.svc.checkpoint(mem.seq).digest == mine.digest);
    if (round == 0) older = mine;
  }
  const CheckpointId target = other.svc.checkpoint(other.seq);
  REQUIRE(target.seq == disk->seq);
  REQUIRE(target.digest != disk->svc.checkpoint_tree(disk->seq).root());

  const PartitionTree& theirs = other.svc.checkpoint_tree(target.seq);
  const PartitionTree mine = disk->svc.checkpoint_tree(target.seq);
  disk->svc.begin_install(target.seq);
  for (std::uint64_t p = 0; p < disk->svc.partition_count(); ++p) {
    if (theirs.leaf(p) != mine.leaf(p)) disk->svc.install_partition(p, other.svc.read_partition(target.seq, p));
  }
  CHECK(disk->svc.finish_install(target.seq).digest == target.digest);
  for (std::uint64_t p = 0; p < disk->svc.partition_count(); ++p) {
    REQUIRE(disk->svc.read_partition(target.seq, p) == other.svc.read_partition(target.seq, p));
    REQUIRE(disk->svc.read_partition(older.seq, p) == mem.svc.read_partition(older.seq, p));
  }
  CHECK(disk->svc.check_invariants() == "");
  // Durable: a restart recovers the installed checkpoint.
  disk.reset();
  auto again = disk_harness(dir.path);
  CHECK(again->svc.recovered_checkpoint().seq == target.seq);
  CHECK(again->svc.recovered_checkpoint().digest == target.digest);
}

TEST_CASE("fs disk store reclaims dead extents and keeps every retained checkpoint readable", "[fs][disk]") {
  TempDir dir;
  FsOptions o = small_options();
  DiskStoreOptions d = disk_options(o);
  d.data_compact_bytes_min = 0;
  Harness mem;
  DiskObjectStore* store = nullptr;
  auto disk = std::make_unique<Harness>(open_store(dir.path, d, &store), o);
  Workload w(51);
  std::vector<CheckpointId> retained;
  for (int round = 0; round < 12; ++round) {
    for (int i = 0; i < 25; ++i) {
      const Bytes req = encode_request(Request{w.next()});
      w.learn(mem.run_bytes(req));
      disk->run_bytes(req);
      REQUIRE(mem.last_bytes == disk->last_bytes);
    }
    const CheckpointId c = disk->svc.checkpoint(disk->seq);
    REQUIRE(mem.svc.checkpoint(mem.seq).digest == c.digest);
    retained.push_back(c);
    if (retained.size() > 3) {  // the engine retains a window of checkpoints
      retained.erase(retained.begin());
      disk->svc.discard_checkpoints_below(retained.front().seq);
      mem.svc.discard_checkpoints_below(retained.front().seq);
    }
  }
  CHECK(store->stats().data_compactions > 0);
  CHECK(store->data_path() != dir.path + "/data");
  // Retained checkpoints still read back byte for byte after their extents moved.
  for (const CheckpointId& c : retained) {
    for (std::uint64_t p = 0; p < o.partitions; ++p) {
      REQUIRE(disk->svc.read_partition(c.seq, p) == mem.svc.read_partition(c.seq, p));
    }
  }
  CHECK(store->scrub() == 0);
  // A restart opens the generation the journal names (and only that file is left).
  const CheckpointId last = retained.back();
  const std::uint64_t compactions = store->stats().data_compactions;
  disk.reset();
  // A compaction that crashed before its switch leaves the next generation's file behind: open removes it.
  const std::string orphan = dir.path + "/data." + std::to_string(compactions + 1);
  REQUIRE(std::system(("echo garbage > '" + orphan + "'").c_str()) == 0);
  auto again = std::make_unique<Harness>(open_store(dir.path, d, &store), o);
  CHECK(again->svc.recovered_checkpoint().digest == last.digest);
  CHECK(again->svc.check_invariants() == "");
  CHECK(store->scrub() == 0);
  CHECK(file_size(store->data_path()) == static_cast<off_t>(store->stats().data_file_bytes));
  CHECK(::access((dir.path + "/data").c_str(), F_OK) != 0);
  CHECK(::access(orphan.c_str(), F_OK) != 0);
}

TEST_CASE("fs disk store: a replica whose superblock rotted on disk starts damaged instead of stopping",
          "[fs][disk]") {
  TempDir dir;
  {
    auto h = disk_harness(dir.path);
    h->make_file(kRoot, "x");
    h->svc.checkpoint(h->seq);
  }
  std::pair<std::uint64_t, std::uint32_t> extent;
  std::string data;
  {
    auto s = open_store(dir.path, disk_options(small_options()));
    const auto e = s->extent_of(ObjectKey::super());
    REQUIRE(e.has_value());
    extent = *e;
    data = s->data_path();
  }
  flip_byte(data, extent.first);
  auto h = disk_harness(dir.path);
  CHECK(h->svc.damaged_partitions() ==
        std::vector<std::uint64_t>{partition_of(ObjectKey::super(), small_options().partitions)});
  Bytes out;
  CHECK_FALSE(h->svc.execute_read_only(7, encode_request(Request{{getattr(kRoot)}}), out));
}

namespace {

Bytes read_whole(const std::string& path) {
  const off_t size = file_size(path);
  Bytes b(static_cast<std::size_t>(size));
  const int fd = ::open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  REQUIRE(::pread(fd, b.data(), b.size(), 0) == size);
  ::close(fd);
  return b;
}

void write_whole(const std::string& path, const Bytes& b) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC);
  REQUIRE(fd >= 0);
  REQUIRE(::pwrite(fd, b.data(), b.size(), 0) == static_cast<ssize_t>(b.size()));
  ::close(fd);
}

std::uint32_t le32(const std::uint8_t* p) {
  return static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
         static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24;
}

void put_le32(Bytes& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}

// Rewrites the index journal at `path` into the format before engine states: every COMMIT (type 4: seq, data
// end, partitions, root, then the engine state) becomes a type-2 COMMIT without the engine state.
void downgrade_commits(const std::string& path) {
  const Bytes in = read_whole(path);
  Bytes out;
  std::size_t pos = 0;
  int converted = 0;
  while (pos + 8 <= in.size()) {
    const std::uint32_t len = le32(in.data() + pos);
    REQUIRE(pos + 8 + len <= in.size());
    Bytes body(in.begin() + static_cast<std::ptrdiff_t>(pos + 8), in.begin() + static_cast<std::ptrdiff_t>(pos + 8 + len));
    if (body.at(0) == 4) {
      body.resize(1 + 8 + 8 + 8 + 32);
      body[0] = 2;
      converted++;
    }
    put_le32(out, static_cast<std::uint32_t>(body.size()));
    put_le32(out, bftfs::crc32c(0, body));
    out.insert(out.end(), body.begin(), body.end());
    pos += 8 + len;
  }
  REQUIRE(pos == in.size());
  REQUIRE(converted > 0);
  write_whole(path, out);
}

}  // namespace

TEST_CASE("fs disk store keeps the engine state with its checkpoint: restart, crash mid-write, journal rewrite",
          "[fs][disk]") {
  TempDir dir;
  const std::string index = dir.path + "/index";
  FsOptions o = small_options();
  DiskStoreOptions d = disk_options(o);
  const Bytes first_state(3000, 0xA1);
  const Bytes second_state{1, 2, 3};
  CheckpointId first;
  off_t first_end = 0;
  {
    auto h = disk_harness(dir.path);
    CHECK(h->svc.recovered_engine_state().empty());  // checkpoint 0 has none
    h->make_file(kRoot, "a");
    first = h->svc.checkpoint(h->seq, first_state);
    first_end = file_size(index);
    h->make_file(kRoot, "b");
    h->svc.checkpoint(h->seq, second_state);
  }
  {
    auto h = disk_harness(dir.path);
    CHECK(h->svc.recovered_engine_state() == second_state);
  }
  // A crash inside the second checkpoint's write keeps the first checkpoint and its engine state, together.
  truncate_file(index, file_size(index) - 1);
  {
    auto h = disk_harness(dir.path);
    CHECK(h->svc.recovered_checkpoint().seq == first.seq);
    CHECK(h->svc.recovered_engine_state() == first_state);
  }
  REQUIRE(first_end == file_size(index));
  // A rewritten journal carries the latest engine state over.
  d.index_compact_bytes_min = 0;
  {
    Harness h(open_store(dir.path, d), o);
    h.seq = first.seq;
    for (int i = 0; i < 20; ++i) {
      h.make_file(kRoot, "f" + std::to_string(i));
      h.svc.checkpoint(h.seq, Bytes{static_cast<std::uint8_t>(i)});
      h.svc.discard_checkpoints_below(h.seq);
    }
  }
  DiskObjectStore* store = nullptr;
  Harness h(open_store(dir.path, d, &store), o);
  CHECK(h.svc.recovered_engine_state() == Bytes{19});
}

TEST_CASE("fs disk store opens a journal written before engine states, with an empty engine state", "[fs][disk]") {
  TempDir dir;
  CheckpointId cp;
  {
    auto h = disk_harness(dir.path);
    h->make_file(kRoot, "old");
    cp = h->svc.checkpoint(h->seq, Bytes{9, 9});
  }
  downgrade_commits(dir.path + "/index");
  {
    auto h = disk_harness(dir.path);
    CHECK(h->svc.recovered_checkpoint().seq == cp.seq);
    CHECK(h->svc.recovered_checkpoint().digest == cp.digest);
    CHECK(h->svc.recovered_engine_state().empty());  // the engine falls back to its log's CheckpointRecord
    h->seq = cp.seq;
    h->make_file(kRoot, "new");
    h->svc.checkpoint(h->seq, Bytes{4});  // appends a COMMIT with the engine state to the old journal
  }
  auto h = disk_harness(dir.path);
  CHECK(h->svc.recovered_engine_state() == Bytes{4});
}
