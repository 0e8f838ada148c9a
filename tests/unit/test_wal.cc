// The replica's write-ahead log (replica/wal.h): round trip, group commit, torn tails, corruption and
// compaction.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "common/log.h"
#include "replica/crc32c.h"
#include "replica/wal.h"

using namespace bftfs;

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/bftfs-wal-XXXXXX";
    char* p = mkdtemp(tmpl);
    REQUIRE(p != nullptr);
    path = p;
  }
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
  std::string wal() const { return path + "/wal"; }
};

std::vector<std::string> list(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(n);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

std::string only_segment(const std::string& dir) {
  auto files = list(dir);
  REQUIRE(files.size() == 1);
  return dir + "/" + files[0];
}

Bytes read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
void write_all(const std::string& path, const Bytes& b) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

Digest dig(std::uint8_t v) {
  Digest d;
  d.bytes.fill(v);
  return d;
}

PrePrepareRecord pre_prepare(std::uint64_t view, std::uint64_t seq, std::size_t op_bytes = 16) {
  PrePrepareRecord r;
  r.view = view;
  r.seq = seq;
  r.batch.timestamp_ns = 1000 + seq;
  Request q;
  q.client = 4;
  q.request_id = seq;
  q.op = Bytes(op_bytes, static_cast<std::uint8_t>(seq));
  q.authenticator.resize(4);
  r.batch.requests.push_back(q);
  return r;
}

std::vector<PersistRecord> sample_records() {
  std::vector<PersistRecord> rs;
  rs.reserve(16);
  rs.emplace_back(std::in_place_type<ViewRecord>, ViewRecord{0, false});
  for (std::uint64_t s = 1; s <= 3; ++s) {
    rs.push_back(pre_prepare(0, s));
    rs.push_back(PreparedRecord{0, s, dig(static_cast<std::uint8_t>(s))});
    rs.push_back(CommittedRecord{s, dig(static_cast<std::uint8_t>(s))});
  }
  rs.push_back(CheckpointRecord{3, dig(9), Bytes{1, 2, 3}});
  rs.push_back(ViewRecord{1, true});
  return rs;
}

// Records compare by their encoding (PersistRecord has no operator==).
std::vector<Bytes> encoded(const std::vector<PersistRecord>& rs) {
  std::vector<Bytes> out;
  for (const auto& r : rs) out.push_back(encode_record(r));
  return out;
}

std::unique_ptr<Wal> open_ok(const std::string& dir, std::vector<PersistRecord>& recs, WalOptions o = {}) {
  std::unique_ptr<Wal> w;
  const std::string err = Wal::open(dir, o, w, recs);
  INFO(err);
  REQUIRE(err.empty());
  REQUIRE(w != nullptr);
  return w;
}

std::uint64_t seq_of(const PersistRecord& r) {
  return std::visit(
      [](const auto& x) -> std::uint64_t {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, ViewRecord>) {
          return x.view;
        } else {
          return x.seq;
        }
      },
      r);
}

}  // namespace

TEST_CASE("crc32c matches the standard check value", "[wal]") {
  const std::string s = "123456789";
  const std::span<const std::uint8_t> d(reinterpret_cast<const std::uint8_t*>(s.data()), s.size());
  CHECK(crc32c(0, d) == 0xE3069283u);
  // Incremental equals one shot, across the 8-byte hardware path and the byte tail.
  CHECK(crc32c(crc32c(0, d.subspan(0, 5)), d.subspan(5)) == 0xE3069283u);
}

TEST_CASE("wal: records round trip across a reopen, in order", "[wal]") {
  TempDir t;
  const auto rs = sample_records();
  {
    std::vector<PersistRecord> recs;
    auto w = open_ok(t.wal(), recs);
    CHECK(recs.empty());
    for (const auto& r : rs) w->append(r);
    CHECK(w->dirty());
    w->sync();
    CHECK_FALSE(w->dirty());
    CHECK(w->stats().syncs == 1);  // one group, one write + fdatasync
  }
  std::vector<PersistRecord> recs;
  auto w = open_ok(t.wal(), recs);
  CHECK(encoded(recs) == encoded(rs));
  CHECK(w->stats().torn_tail_bytes == 0);
  // Appending after a reopen continues the same log.
  w->append(CommittedRecord{4, dig(4)});
  w->sync();
  w.reset();
  open_ok(t.wal(), recs);
  REQUIRE(recs.size() == rs.size() + 1);
  CHECK(std::holds_alternative<CommittedRecord>(recs.back()));
}

TEST_CASE("wal: a torn tail is truncated and the log stays appendable", "[wal]") {
  TempDir t;
  const auto rs = sample_records();
  {
    std::vector<PersistRecord> recs;
    auto w = open_ok(t.wal(), recs);
    for (std::size_t i = 0; i + 1 < rs.size(); ++i) w->append(rs[i]);
    w->sync();
    w->append(rs.back());  // the last group: one record
    w->sync();
  }
  const std::string seg = only_segment(t.wal());
  Bytes b = read_all(seg);
  const std::size_t last = kWalRecordHeaderBytes + encode_record(rs.back()).size();

  SECTION("cut inside the last record") {
    b.resize(b.size() - last / 2);
  }
  SECTION("cut inside the last record's header") {
    b.resize(b.size() - last + 3);
  }
  SECTION("the last record's bytes replaced by garbage") {
    for (std::size_t i = b.size() - last; i < b.size(); ++i) b[i] = static_cast<std::uint8_t>(i * 31 + 7);
  }
  SECTION("zeros past the end (a preallocated or partially flushed page)") {
    b.resize(b.size() - last);
    b.resize(b.size() + 4096, 0);
  }
  write_all(seg, b);
  std::vector<PersistRecord> recs;
  auto w = open_ok(t.wal(), recs);
  CHECK(w->stats().torn_tail_bytes > 0);
  CHECK(encoded(recs) == encoded(std::vector<PersistRecord>(rs.begin(), rs.end() - 1)));
  w->append(StableRecord{3, dig(9)});
  w->sync();
  w.reset();
  open_ok(t.wal(), recs);
  REQUIRE(recs.size() == rs.size());
  CHECK(std::holds_alternative<StableRecord>(recs.back()));
}

TEST_CASE("wal: a corrupt record followed by a later group is reported, never skipped", "[wal]") {
  TempDir t;
  const auto rs = sample_records();
  {
    std::vector<PersistRecord> recs;
    auto w = open_ok(t.wal(), recs);
    w->append(rs[0]);
    w->append(rs[1]);
    w->sync();
    w->append(rs[2]);  // a second, later group: proves the first one was synced
    w->sync();
  }
  const std::string seg = only_segment(t.wal());
  Bytes b = read_all(seg);
  // Flip one payload byte of the second record of the first group.
  const std::size_t second = kWalSegmentHeaderBytes + kWalRecordHeaderBytes + encode_record(rs[0]).size();
  b[second + kWalRecordHeaderBytes + 2] ^= 0x40;
  write_all(seg, b);
  std::unique_ptr<Wal> w;
  std::vector<PersistRecord> recs;
  const std::string err = Wal::open(t.wal(), WalOptions{}, w, recs);
  CHECK(w == nullptr);
  CHECK_THAT(err, Catch::Contains("corrupt"));
  CHECK_THAT(err, Catch::Contains(std::to_string(second)));
  // The file is left as it was for an operator to inspect.
  CHECK(read_all(seg) == b);
}

TEST_CASE("wal: corruption in a sealed segment is reported", "[wal]") {
  TempDir t;
  WalOptions o;
  o.segment_bytes_max = 256;  // roll after almost every group
  {
    std::vector<PersistRecord> recs;
    auto w = open_ok(t.wal(), recs, o);
    for (std::uint64_t s = 1; s <= 6; ++s) {
      w->append(pre_prepare(0, s, 300));
      w->sync();
    }
  }
  auto files = list(t.wal());
  REQUIRE(files.size() >= 3);
  const std::string first = t.wal() + "/" + files[0];
  Bytes b = read_all(first);
  b.back() ^= 1;  // the last record of a sealed segment: its tail is not a torn write
  write_all(first, b);
  std::unique_ptr<Wal> w;
  std::vector<PersistRecord> recs;
  const std::string err = Wal::open(t.wal(), o, w, recs);
  CHECK(w == nullptr);
  CHECK_THAT(err, Catch::Contains("sealed segment"));
}

TEST_CASE("wal: a record with a valid checksum that does not decode is an error", "[wal]") {
  TempDir t;
  {
    std::vector<PersistRecord> recs;
    auto w = open_ok(t.wal(), recs);
    w->append(ViewRecord{2, false});
    w->sync();
  }
  const std::string seg = only_segment(t.wal());
  Bytes b = read_all(seg);
  // Frame an undecodable payload (tag 0 is never a record) with this segment's salt, as the log would.
  const Bytes payload = {0, 1, 2, 3};
  std::uint8_t head[12];
  std::memcpy(head, b.data() + 8, 8);  // salt
  const std::uint32_t lf = 0x80000000u | static_cast<std::uint32_t>(payload.size());
  for (int i = 0; i < 4; ++i) head[8 + i] = static_cast<std::uint8_t>(lf >> (8 * i));
  const std::uint32_t crc = crc32c(crc32c(0, head), payload);
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<std::uint8_t>(lf >> (8 * i)));
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<std::uint8_t>(crc >> (8 * i)));
  b.insert(b.end(), payload.begin(), payload.end());
  write_all(seg, b);
  std::unique_ptr<Wal> w;
  std::vector<PersistRecord> recs;
  const std::string err = Wal::open(t.wal(), WalOptions{}, w, recs);
  CHECK(w == nullptr);
  CHECK_THAT(err, Catch::Contains("does not decode"));
}

TEST_CASE("wal: compaction keeps exactly what recovery needs", "[wal]") {
  TempDir t;
  WalOptions o;
  o.compact_bytes_min = 0;  // compact at every stable checkpoint
  o.segment_bytes_max = 1024;
  std::vector<PersistRecord> all;
  {
    std::vector<PersistRecord> recs;
    auto w = open_ok(t.wal(), recs, o);
    auto add = [&](PersistRecord r) {
      all.push_back(r);
      w->append(r);
    };
    add(ViewRecord{0, false});
    for (std::uint64_t s = 1; s <= 12; ++s) {
      add(pre_prepare(0, s, 100));
      add(PreparedRecord{0, s, dig(static_cast<std::uint8_t>(s))});
      if (s <= 10) add(CommittedRecord{s, dig(static_cast<std::uint8_t>(s))});
      if (s == 4 || s == 8) add(CheckpointRecord{s, dig(static_cast<std::uint8_t>(100 + s)), Bytes{9}});
      if (s == 6) add(ViewRecord{1, true});
      if (s == 7) add(ViewRecord{1, false});
      w->sync();
    }
    add(StableRecord{4, dig(104)});
    add(CheckpointRecord{12, dig(112), Bytes{7}});  // appended in the same group as the stable record
    w->sync();
    CHECK(w->stats().compactions == 1);
    add(StableRecord{8, dig(108)});
    w->sync();
    CHECK(w->stats().compactions == 2);
    add(CommittedRecord{11, dig(11)});
    w->sync();
  }
  // Only the newest base and what follows it remain.
  auto files = list(t.wal());
  REQUIRE(!files.empty());
  CHECK(files[0].ends_with(".base"));
  for (std::size_t i = 1; i < files.size(); ++i) CHECK(files[i].ends_with(".seg"));

  std::vector<PersistRecord> recs;
  auto w = open_ok(t.wal(), recs, o);
  // What a recovering replica needs: the latest view, the latest stable checkpoint, checkpoints at or above it,
  // and every ordering record above it, in their original order.
  std::vector<PersistRecord> expect;
  for (const auto& r : all) {
    const std::uint64_t s = seq_of(r);
    if (const auto* v = std::get_if<ViewRecord>(&r)) {
      if (v->view == 1 && !v->in_view_change) expect.push_back(r);
    } else if (std::holds_alternative<StableRecord>(r)) {
      if (s == 8) expect.push_back(r);
    } else if (std::holds_alternative<CheckpointRecord>(r)) {
      if (s >= 8) expect.push_back(r);
    } else if (s > 8) {
      expect.push_back(r);
    }
  }
  CHECK(encoded(recs) == encoded(expect));
}

TEST_CASE("wal: an interrupted compaction or segment creation is recovered", "[wal]") {
  TempDir t;
  WalOptions o;
  o.compact_bytes_min = 0;
  {
    std::vector<PersistRecord> recs;
    auto w = open_ok(t.wal(), recs, o);
    w->append(pre_prepare(0, 1));
    w->append(StableRecord{1, dig(1)});
    w->append(pre_prepare(0, 2));
    w->sync();  // compacts into base 2
  }
  auto files = list(t.wal());
  REQUIRE(files.size() == 1);
  const std::string base = files[0];
  CHECK(base == "0000000000000002.base");

  SECTION("an older segment left behind by a crash before the deletion is ignored and removed") {
    Bytes old = read_all(t.wal() + "/" + base);
    write_all(t.wal() + "/0000000000000001.seg", old);  // would duplicate every record if replayed
    std::vector<PersistRecord> recs;
    open_ok(t.wal(), recs, o);
    CHECK(recs.size() == 2);
    CHECK(list(t.wal()).size() == 1);
  }
  SECTION("a temporary base of a compaction that never finished is ignored") {
    write_all(t.wal() + "/0000000000000003.base.tmp", Bytes(100, 0xAB));
    std::vector<PersistRecord> recs;
    open_ok(t.wal(), recs, o);
    CHECK(recs.size() == 2);
    CHECK(list(t.wal()).size() == 1);
  }
  SECTION("a new segment whose header never reached the disk holds nothing") {
    write_all(t.wal() + "/0000000000000003.seg", Bytes{'B', 'F', 'T'});
    std::vector<PersistRecord> recs;
    auto w = open_ok(t.wal(), recs, o);
    CHECK(recs.size() == 2);
    w->append(CommittedRecord{2, dig(2)});
    w->sync();
    w.reset();
    open_ok(t.wal(), recs, o);
    CHECK(recs.size() == 3);
  }
  SECTION("a missing segment in the middle is an error") {
    std::vector<PersistRecord> recs;
    {
      WalOptions small = o;
      small.segment_bytes_max = 64;
      small.compact_bytes_min = 1ull << 40;
      auto w = open_ok(t.wal(), recs, small);
      w->append(pre_prepare(0, 3));
      w->sync();
      w->append(pre_prepare(0, 4));
      w->sync();
    }
    REQUIRE(list(t.wal()).size() >= 3);
    ::unlink((t.wal() + "/0000000000000003.seg").c_str());
    std::unique_ptr<Wal> w;
    const std::string err = Wal::open(t.wal(), o, w, recs);
    CHECK_THAT(err, Catch::Contains("missing"));
  }
}

TEST_CASE("wal: without fsync the records are still written and replayed", "[wal]") {
  TempDir t;
  WalOptions o;
  o.fsync = false;
  {
    std::vector<PersistRecord> recs;
    auto w = open_ok(t.wal(), recs, o);
    w->append(ViewRecord{5, false});
    w->sync();
  }
  std::vector<PersistRecord> recs;
  open_ok(t.wal(), recs, o);
  REQUIRE(recs.size() == 1);
  CHECK(std::get<ViewRecord>(recs[0]).view == 5);
}

TEST_CASE("wal: every cut and every bit flip is either a clean prefix or a reported error", "[wal]") {
  TempDir t;
  std::vector<PersistRecord> rs;
  std::vector<std::size_t> group_of;  // group index of each record
  {
    std::vector<PersistRecord> recs;
    auto w = open_ok(t.wal(), recs);
    for (std::uint64_t g = 0; g < 3; ++g) {
      for (std::uint64_t i = 0; i < 3; ++i) {
        const std::uint64_t s = g * 3 + i + 1;
        PersistRecord r = PreparedRecord{0, s, dig(static_cast<std::uint8_t>(s))};
        w->append(r);
        rs.push_back(r);
        group_of.push_back(g);
      }
      w->sync();
    }
  }
  const std::string seg = only_segment(t.wal());
  const Bytes original = read_all(seg);
  const std::size_t record_bytes = kWalRecordHeaderBytes + encode_record(rs[0]).size();
  const std::size_t last_group_start = kWalSegmentHeaderBytes + 6 * record_bytes;
  REQUIRE(original.size() == last_group_start + 3 * record_bytes);
  const auto all = encoded(rs);

  auto replay = [&](const Bytes& b, std::vector<Bytes>& out) -> std::string {
    write_all(seg, b);
    std::unique_ptr<Wal> w;
    std::vector<PersistRecord> recs;
    std::string err = Wal::open(t.wal(), WalOptions{}, w, recs);
    out = encoded(recs);
    w.reset();
    write_all(seg, original);  // open may have truncated the file
    return err;
  };
  auto is_prefix = [&](const std::vector<Bytes>& got) {
    return got.size() <= all.size() && std::equal(got.begin(), got.end(), all.begin());
  };

  // Cuts anywhere in the last (unacknowledged) group: a prefix holding at least the synced groups.
  for (std::size_t cut = last_group_start; cut < original.size(); ++cut) {
    std::vector<Bytes> got;
    const std::string err = replay(Bytes(original.begin(), original.begin() + static_cast<std::ptrdiff_t>(cut)), got);
    INFO("cut at " << cut << ": " << err);
    REQUIRE(err.empty());
    REQUIRE(is_prefix(got));
    REQUIRE(got.size() >= 6);
  }
  // One flipped bit in the header or a synced group (a later group exists): reported, never skipped.
  // One flipped bit in the last group: a prefix that keeps every synced group.
  // The segment header was synced before any record: damage to it is reported too.
  for (std::size_t at = 0; at < original.size(); ++at) {
    Bytes b = original;
    b[at] ^= static_cast<std::uint8_t>(1u << (at % 8));
    std::vector<Bytes> got;
    const std::string err = replay(b, got);
    INFO("flip at " << at << ": " << err);
    if (at < last_group_start) {
      REQUIRE_FALSE(err.empty());
    } else {
      REQUIRE(err.empty());
      REQUIRE(is_prefix(got));
      REQUIRE(got.size() >= 6);
    }
  }
}

// ---- Measurements (hidden: run with `build/tests/unit_tests '[.bench]'`; benchmarks are not tests, so
// nothing here asserts a time). The directory is BFTFS_BENCH_DIR if set, else /tmp (the same disk as /work on
// this machine kind). Each line prints p50/p99/mean of one way to make a small group durable.
namespace {

std::uint64_t bench_now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

struct BenchDir {
  std::string path;
  BenchDir() {
    const char* base = std::getenv("BFTFS_BENCH_DIR");
    std::string tmpl = std::string(base != nullptr ? base : "/tmp") + "/bftfs-walbench-XXXXXX";
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~BenchDir() { std::system(("rm -rf '" + path + "'").c_str()); }
};

void bench_report(const char* what, std::vector<std::uint64_t> ns) {
  std::sort(ns.begin(), ns.end());
  double sum = 0;
  for (auto v : ns) sum += static_cast<double>(v);
  const auto at = [&](double q) { return static_cast<double>(ns[static_cast<std::size_t>(q * static_cast<double>(ns.size() - 1))]) / 1e3; };
  std::printf("%-58s n=%zu p50 %7.1f us  p99 %7.1f us  mean %7.1f us\n", what, ns.size(), at(0.5), at(0.99),
              sum / static_cast<double>(ns.size()) / 1e3);
  std::fflush(stdout);
}

int bench_groups() {
  const char* n = std::getenv("BFTFS_BENCH_GROUPS");
  return n != nullptr ? std::atoi(n) : 2000;
}

// Raw system calls on one file: `prealloc` writes the file full of zeros and fsyncs it first, so every group
// is an overwrite of initialized blocks; otherwise every group appends.
void bench_raw(const std::string& dir, const char* what, std::size_t group_bytes, bool prealloc, int open_flags,
               bool rwf_dsync, bool fdatasync_after) {
  const int groups = bench_groups();
  const std::string path = dir + "/raw";
  ::unlink(path.c_str());
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | open_flags, 0644);
  REQUIRE(fd >= 0);
  if (prealloc) {
    const Bytes zeros(1 << 20, 0);
    const std::size_t total = group_bytes * static_cast<std::size_t>(groups) + (1 << 20);
    for (std::size_t off = 0; off < total; off += zeros.size()) {
      REQUIRE(::pwrite(fd, zeros.data(), zeros.size(), static_cast<off_t>(off)) == static_cast<ssize_t>(zeros.size()));
    }
    REQUIRE(::fsync(fd) == 0);
  }
  Bytes buf(group_bytes, 0x5A);
  std::vector<std::uint64_t> ns;
  ns.reserve(static_cast<std::size_t>(groups));
  for (int g = 0; g < groups; ++g) {
    buf[0] = static_cast<std::uint8_t>(g);
    const off_t off = static_cast<off_t>(group_bytes * static_cast<std::size_t>(g));
    const std::uint64_t t0 = bench_now_ns();
    iovec iov{buf.data(), buf.size()};
    const ssize_t w = ::pwritev2(fd, &iov, 1, off, rwf_dsync ? RWF_DSYNC : 0);
    REQUIRE(w == static_cast<ssize_t>(buf.size()));
    if (fdatasync_after) REQUIRE(::fdatasync(fd) == 0);
    ns.push_back(bench_now_ns() - t0);
  }
  ::close(fd);
  ::unlink(path.c_str());
  char label[128];
  std::snprintf(label, sizeof label, "raw %5zu B %s", group_bytes, what);
  bench_report(label, std::move(ns));
}

}  // namespace

TEST_CASE("wal bench: one small group made durable, by method", "[.bench][wal]") {
  BenchDir d;
  for (std::size_t size : {std::size_t{200}, std::size_t{4096}}) {
    bench_raw(d.path, "append + fdatasync", size, false, 0, false, true);
    bench_raw(d.path, "append, pwritev2 RWF_DSYNC", size, false, 0, true, false);
    bench_raw(d.path, "overwrite (zero-filled, fsynced) + fdatasync", size, true, 0, false, true);
    bench_raw(d.path, "overwrite, pwritev2 RWF_DSYNC", size, true, 0, true, false);
    bench_raw(d.path, "overwrite, O_DSYNC", size, true, O_DSYNC, false, false);
  }
}

TEST_CASE("wal bench: group commit through the Wal", "[.bench][wal]") {
  BenchDir d;
  std::vector<PersistRecord> recs;
  WalOptions o;
  auto w = open_ok(d.path + "/wal", recs, o);
  const int groups = bench_groups();
  std::vector<std::uint64_t> ns;
  ns.reserve(static_cast<std::size_t>(groups));
  for (int g = 1; g <= groups; ++g) {
    const auto s = static_cast<std::uint64_t>(g);
    // A backup's critical-path group: the pre-prepare (one request) and the prepared record.
    w->append(pre_prepare(0, s, 16));
    w->append(PreparedRecord{0, s, dig(static_cast<std::uint8_t>(s))});
    const std::uint64_t t0 = bench_now_ns();
    w->sync();
    ns.push_back(bench_now_ns() - t0);
  }
  bench_report("Wal::sync (pre-prepare + prepared, ~220 B)", std::move(ns));
}
