// The replica's write-ahead log (storage/wal.h): round trip, group commit, preallocated segments (the end of
// the log is found by the records, not the file size), torn tails, corruption, seals, roll-over, compaction,
// and logs written by the format-1 (unpreallocated) version.
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
#include <thread>
#include <vector>

#include "common/log.h"
#include "storage/crc32c.h"
#include "storage/wal.h"

using namespace bftfs;

namespace {

struct TempDir {
  std::string path;
  explicit TempDir(const std::string& base = "/tmp") {
    std::string tmpl = base + "/bftfs-wal-XXXXXX";
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
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
std::uint64_t file_size(const std::string& path) {
  struct stat st{};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return static_cast<std::uint64_t>(st.st_size);
}
bool all_zero(const Bytes& b, std::size_t from, std::size_t to) {
  return std::all_of(b.begin() + static_cast<std::ptrdiff_t>(from), b.begin() + static_cast<std::ptrdiff_t>(to),
                     [](std::uint8_t x) { return x == 0; });
}
void zero(Bytes& b, std::size_t from, std::size_t to) {
  std::fill(b.begin() + static_cast<std::ptrdiff_t>(from), b.begin() + static_cast<std::ptrdiff_t>(to), 0);
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

std::string open_error(const std::string& dir, WalOptions o = {}) {
  std::unique_ptr<Wal> w;
  std::vector<PersistRecord> recs;
  std::string err = Wal::open(dir, o, w, recs);
  CHECK(w == nullptr);
  return err;
}

// Runs the log's housekeeping until it has none left (the runtime spreads it over its loop passes).
void settle(Wal& w) {
  int steps = 0;
  while (w.maintain()) REQUIRE(++steps < 100000);
}

WalOptions segments_of(std::uint64_t bytes) {
  WalOptions o;
  o.segment_bytes_max = bytes;
  o.compact_bytes_min = 1ull << 40;  // no compaction unless a test asks for it
  o.prealloc_chunk_bytes = 4096;
  return o;
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

// What compaction must keep of `all` (wal.h): the latest view and stable records, checkpoints at or above the
// stable seq, ordering records above it, in order.
std::vector<PersistRecord> needed(const std::vector<PersistRecord>& all) {
  std::uint64_t stable = 0;
  std::size_t last_view = all.size();
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (const auto* s = std::get_if<StableRecord>(&all[i])) stable = s->seq;
    if (std::holds_alternative<ViewRecord>(all[i])) last_view = i;
  }
  std::vector<PersistRecord> out;
  for (std::size_t i = 0; i < all.size(); ++i) {
    const PersistRecord& r = all[i];
    const std::uint64_t s = seq_of(r);
    if (std::holds_alternative<ViewRecord>(r)) {
      if (i == last_view) out.push_back(r);
    } else if (std::holds_alternative<StableRecord>(r)) {
      if (s == stable) out.push_back(r);
    } else if (std::holds_alternative<CheckpointRecord>(r)) {
      if (s >= stable) out.push_back(r);
    } else if (s > stable) {
      out.push_back(r);
    }
  }
  return out;
}

bool is_subsequence(const std::vector<Bytes>& small, const std::vector<Bytes>& big) {
  std::size_t j = 0;
  for (const Bytes& b : big) {
    if (j < small.size() && small[j] == b) ++j;
  }
  return j == small.size();
}

// A record framed as the log frames it (wal.h), for hand-made segments.
Bytes frame(std::uint64_t salt, std::uint32_t flags, const Bytes& payload) {
  std::uint8_t head[12];
  for (int i = 0; i < 8; ++i) head[i] = static_cast<std::uint8_t>(salt >> (8 * i));
  const std::uint32_t lf = flags | static_cast<std::uint32_t>(payload.size());
  for (int i = 0; i < 4; ++i) head[8 + i] = static_cast<std::uint8_t>(lf >> (8 * i));
  const std::uint32_t crc = crc32c(crc32c(0, head), payload);
  Bytes out;
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(lf >> (8 * i)));
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(crc >> (8 * i)));
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}
constexpr std::uint32_t kGroupStartFlag = 0x80000000u;

// The header of a format-1 segment (an older bftfs: no preallocation, no seals).
Bytes v1_header(std::uint64_t salt) {
  Bytes h = {'B', 'F', 'T', 'W', 'A', 'L', '0', '1'};
  for (int i = 0; i < 8; ++i) h.push_back(static_cast<std::uint8_t>(salt >> (8 * i)));
  const std::uint32_t crc = crc32c(0, h);
  for (int i = 0; i < 4; ++i) h.push_back(static_cast<std::uint8_t>(crc >> (8 * i)));
  for (int i = 0; i < 4; ++i) h.push_back(0);
  return h;
}

// Offset of the seal in a segment's bytes (a group of its own whose payload is its offset), or 0.
std::size_t find_seal(const Bytes& b) {
  for (std::size_t at = kWalSegmentHeaderBytes; at + kWalSealBytes <= b.size(); ++at) {
    if (b[at] == 8 && b[at + 1] == 0 && b[at + 2] == 0 && b[at + 3] == 0xC0) {
      std::uint64_t v = 0;
      for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(b[at + 8 + static_cast<std::size_t>(i)]) << (8 * i);
      if (v == at) return at;
    }
  }
  return 0;
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
    CHECK(w->stats().syncs == 1);  // one group, one durable write
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

TEST_CASE("wal: replay of a preallocated segment stops at the true end and appending continues there", "[wal]") {
  TempDir t;
  const auto rs = sample_records();
  std::uint64_t end = 0;
  {
    std::vector<PersistRecord> recs;
    auto w = open_ok(t.wal(), recs);
    for (const auto& r : rs) w->append(r);
    w->sync();
    end = w->active_bytes();
    CHECK(w->stats().syncs_past_prealloc == 0);  // the group overwrote preallocated zeros
  }
  const std::string seg = only_segment(t.wal());
  const std::uint64_t size = file_size(seg);
  CHECK(size == kWalFirstSegmentBytes);  // the file size says nothing about where the data ends
  REQUIRE(size > end);
  CHECK(all_zero(read_all(seg), end, size));

  std::vector<PersistRecord> recs;
  auto w = open_ok(t.wal(), recs);
  CHECK(encoded(recs) == encoded(rs));
  CHECK(w->stats().torn_tail_bytes == 0);  // zeros after the last group are the normal end, not a torn tail
  CHECK(w->active_bytes() == end);
  w->append(StableRecord{3, dig(9)});
  w->sync();
  w.reset();
  CHECK(file_size(seg) == size);  // an overwrite: the file did not grow
  open_ok(t.wal(), recs);
  REQUIRE(recs.size() == rs.size() + 1);
  CHECK(std::holds_alternative<StableRecord>(recs.back()));
}

TEST_CASE("wal: a torn tail in a preallocated segment is removed and the log stays appendable", "[wal]") {
  TempDir t;
  const auto rs = sample_records();
  std::size_t end = 0;
  {
    std::vector<PersistRecord> recs;
    auto w = open_ok(t.wal(), recs);
    for (std::size_t i = 0; i + 1 < rs.size(); ++i) w->append(rs[i]);
    w->sync();
    w->append(rs.back());  // the last group: one record
    w->sync();
    end = static_cast<std::size_t>(w->active_bytes());
  }
  const std::string seg = only_segment(t.wal());
  Bytes b = read_all(seg);
  const std::size_t last = kWalRecordHeaderBytes + encode_record(rs.back()).size();
  const std::size_t start = end - last;
  bool torn = true;

  SECTION("the last record half written, the rest of it still zeros") {
    zero(b, end - last / 2, end);
  }
  SECTION("only part of the last record's header written") {
    zero(b, start + 3, end);
  }
  SECTION("the second half of the last record written, the first half not") {
    zero(b, start, start + last / 2);
  }
  SECTION("the last record's bytes replaced by garbage") {
    for (std::size_t i = start; i < end; ++i) b[i] = static_cast<std::uint8_t>(i * 31 + 7);
  }
  SECTION("a stray non-zero byte far beyond the end (never written by the log)") {
    zero(b, start, end);
    b[b.size() - 100] = 0x5A;
  }
  SECTION("the last record never reached the disk: only zeros, the normal end of the log") {
    zero(b, start, end);
    torn = false;
  }
  SECTION("the file cut inside the last record") {
    b.resize(end - last / 2);
  }
  write_all(seg, b);
  std::vector<PersistRecord> recs;
  auto w = open_ok(t.wal(), recs);
  CHECK((w->stats().torn_tail_bytes > 0) == torn);
  CHECK(encoded(recs) == encoded(std::vector<PersistRecord>(rs.begin(), rs.end() - 1)));
  CHECK(w->active_bytes() == start);
  // Everything after the end is zero again (and was made durable before open returned).
  const Bytes after = read_all(seg);
  CHECK(all_zero(after, start, after.size()));
  w->append(StableRecord{3, dig(9)});
  w->sync();
  w.reset();
  open_ok(t.wal(), recs);
  REQUIRE(recs.size() == rs.size());
  CHECK(std::holds_alternative<StableRecord>(recs.back()));
}

TEST_CASE("wal: records of a torn group never come back behind a later, shorter group", "[wal]") {
  TempDir t;
  {
    std::vector<PersistRecord> recs;
    auto w = open_ok(t.wal(), recs);
    w->append(ViewRecord{0, false});
    w->sync();
    w->append(PreparedRecord{0, 1, dig(1)});
    w->append(PreparedRecord{0, 2, dig(2)});
    w->sync();
  }
  const std::string seg = only_segment(t.wal());
  Bytes b = read_all(seg);
  const std::size_t group = kWalSegmentHeaderBytes + kWalRecordHeaderBytes + encode_record(ViewRecord{0, false}).size();
  // The sector holding the group's first record never reached the disk; the second record did, intact.
  zero(b, group, group + kWalRecordHeaderBytes);
  write_all(seg, b);
  {
    std::vector<PersistRecord> recs;
    auto w = open_ok(t.wal(), recs);
    REQUIRE(recs.size() == 1);
    CHECK(w->stats().torn_tail_bytes > 0);
    // Same size as the lost first record: without the zeroing at open, the old second record would line up
    // right behind it (same salt, valid checksum) and be replayed.
    w->append(PreparedRecord{0, 3, dig(3)});
    w->sync();
  }
  std::vector<PersistRecord> recs;
  open_ok(t.wal(), recs);
  REQUIRE(recs.size() == 2);
  CHECK(std::get<PreparedRecord>(recs[1]).seq == 3);
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
  const std::size_t second = kWalSegmentHeaderBytes + kWalRecordHeaderBytes + encode_record(rs[0]).size();
  const std::size_t later = second + kWalRecordHeaderBytes + encode_record(rs[1]).size();
  SECTION("one payload byte of the second record of the first group flipped") {
    b[second + kWalRecordHeaderBytes + 2] ^= 0x40;
  }
  SECTION("the second record of the first group lost (zeros, as a preallocated block that was never written)") {
    zero(b, second, later);
  }
  write_all(seg, b);
  const std::string err = open_error(t.wal());
  CHECK_THAT(err, Catch::Contains("corrupt"));
  CHECK_THAT(err, Catch::Contains(std::to_string(second)));
  CHECK_THAT(err, Catch::Contains("followed by a valid group at offset " + std::to_string(later)));
  // The file is left as it was for an operator to inspect.
  CHECK(read_all(seg) == b);
}

TEST_CASE("wal: a segment that has a successor must end with its seal", "[wal]") {
  TempDir t;
  const WalOptions o = segments_of(1024);
  {
    std::vector<PersistRecord> recs;
    auto w = open_ok(t.wal(), recs, o);
    for (std::uint64_t s = 1; s <= 12; ++s) {
      w->append(pre_prepare(0, s, 100));
      w->sync();
      settle(*w);
    }
    CHECK(w->stats().rolls >= 2);
  }
  auto files = list(t.wal());
  REQUIRE(files.size() >= 3);
  const std::string first = t.wal() + "/" + files[0];
  Bytes b = read_all(first);
  const std::size_t seal = find_seal(b);
  REQUIRE(seal != 0);
  std::string expect = "sealed segment";
  SECTION("a bad record in a sealed segment") {
    b[kWalSegmentHeaderBytes + kWalRecordHeaderBytes + 2] ^= 1;
  }
  SECTION("the seal lost (zeros)") {
    zero(b, seal, seal + kWalSealBytes);
  }
  SECTION("the seal damaged") {
    b[seal + 9] ^= 0x10;
  }
  SECTION("the segment cut before its seal") {
    b.resize(seal);
  }
  SECTION("a non-zero byte after the seal") {
    if (b.size() > seal + kWalSealBytes) {
      b[b.size() - 1] = 1;
    } else {
      b.push_back(1);
    }
    expect = "after the seal";
  }
  write_all(first, b);
  CHECK_THAT(open_error(t.wal(), o), Catch::Contains(expect));
}

TEST_CASE("wal: a record with a valid checksum that does not decode is an error", "[wal]") {
  TempDir t;
  std::size_t end = 0;
  {
    std::vector<PersistRecord> recs;
    auto w = open_ok(t.wal(), recs);
    w->append(ViewRecord{2, false});
    w->sync();
    end = static_cast<std::size_t>(w->active_bytes());
  }
  const std::string seg = only_segment(t.wal());
  Bytes b = read_all(seg);
  // Frame an undecodable payload (tag 0 is never a record) with this segment's salt, as the log would, where
  // the next group would go.
  std::uint64_t salt = 0;
  for (int i = 0; i < 8; ++i) salt |= static_cast<std::uint64_t>(b[8 + static_cast<std::size_t>(i)]) << (8 * i);
  const Bytes rec = frame(salt, kGroupStartFlag, Bytes{0, 1, 2, 3});
  std::copy(rec.begin(), rec.end(), b.begin() + static_cast<std::ptrdiff_t>(end));
  write_all(seg, b);
  CHECK_THAT(open_error(t.wal()), Catch::Contains("does not decode"));
}

TEST_CASE("wal: compaction keeps exactly what recovery needs, across preallocated segments", "[wal]") {
  TempDir t;
  WalOptions o = segments_of(1024);
  o.compact_bytes_min = 0;  // compact at every stable checkpoint
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
      settle(*w);
    }
    CHECK(w->stats().rolls >= 2);  // several segments before the first compaction
    CHECK(w->stats().compactions == 0);
    add(StableRecord{4, dig(104)});
    add(CheckpointRecord{12, dig(112), Bytes{7}});  // appended in the same group as the stable record
    w->sync();
    settle(*w);
    CHECK(w->stats().compactions == 1);
    add(StableRecord{8, dig(108)});
    w->sync();
    settle(*w);
    CHECK(w->stats().compactions == 2);
    add(CommittedRecord{11, dig(11)});
    w->sync();
    settle(*w);
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
  CHECK(encoded(recs) == encoded(needed(all)));
}

TEST_CASE("wal: an interrupted compaction or segment creation is recovered", "[wal]") {
  TempDir t;
  WalOptions o = segments_of(4096);
  o.compact_bytes_min = 0;
  {
    std::vector<PersistRecord> recs;
    auto w = open_ok(t.wal(), recs, o);
    w->append(pre_prepare(0, 1));
    w->append(StableRecord{1, dig(1)});
    w->append(pre_prepare(0, 2));
    w->sync();
    settle(*w);  // compacts into base 2
    CHECK(w->stats().compactions == 1);
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
  SECTION("a temporary file (a next segment being preallocated, an older version's base) is ignored") {
    write_all(t.wal() + "/0000000000000003.base.tmp", Bytes(100, 0xAB));
    write_all(t.wal() + "/next.prealloc.tmp", Bytes(100, 0xAB));
    std::vector<PersistRecord> recs;
    open_ok(t.wal(), recs, o);
    CHECK(recs.size() == 2);
    CHECK(list(t.wal()).size() == 1);
  }
  SECTION("a new segment whose header never reached the disk (an older version) holds nothing") {
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
      WalOptions small = segments_of(256);
      auto w = open_ok(t.wal(), recs, small);
      for (std::uint64_t s = 3; w->active_segment() < 4; ++s) {
        REQUIRE(s < 100);
        w->append(pre_prepare(0, s, 300));
        w->sync();
        settle(*w);
      }
    }
    REQUIRE(list(t.wal()).size() >= 3);
    ::unlink((t.wal() + "/0000000000000003.seg").c_str());
    CHECK_THAT(open_error(t.wal(), o), Catch::Contains("missing"));
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
    settle(*w);
  }
  std::vector<PersistRecord> recs;
  open_ok(t.wal(), recs, o);
  REQUIRE(recs.size() == 1);
  CHECK(std::get<ViewRecord>(recs[0]).view == 5);
}

TEST_CASE("wal: with maintain() after every group the log rolls over before it fills", "[wal]") {
  TempDir t;
  const WalOptions o = segments_of(64 << 10);
  std::vector<PersistRecord> all;
  {
    std::vector<PersistRecord> recs;
    auto w = open_ok(t.wal(), recs, o);
    for (std::uint64_t s = 1; s <= 3000; ++s) {
      all.push_back(PreparedRecord{0, s, dig(static_cast<std::uint8_t>(s))});
      w->append(all.back());
      w->sync();
      w->maintain();  // once per group, as the runtime does: one bounded step
    }
    CHECK(w->stats().rolls >= 2);
    CHECK(w->stats().syncs_past_prealloc == 0);  // every group overwrote preallocated zeros
    CHECK(w->stats().prealloc_bytes >= w->stats().rolls * o.segment_bytes_max);
  }
  CHECK(list(t.wal()).size() >= 3);
  std::vector<PersistRecord> recs;
  open_ok(t.wal(), recs, o);
  CHECK(encoded(recs) == encoded(all));
}

TEST_CASE("wal: groups written on another thread while appending goes on keep every record, in order", "[wal]") {
  // The runtime's asynchronous group commit: begin_group() on the loop, write_group() on the sync thread,
  // records appended meanwhile go into the next group; the log rolls only between groups.
  TempDir t;
  const WalOptions o = segments_of(64 << 10);
  std::vector<PersistRecord> all;
  {
    std::vector<PersistRecord> recs;
    auto w = open_ok(t.wal(), recs, o);
    std::uint64_t s = 0;
    for (int round = 0; round < 600; ++round) {
      for (int i = 0; i < 3; ++i) {
        all.push_back(PreparedRecord{0, ++s, dig(static_cast<std::uint8_t>(s))});
        w->append(all.back());
      }
      Wal::Group g = w->begin_group();
      CHECK(w->group_in_flight());
      CHECK_FALSE(w->dirty());
      // Appended while the group is on its way: the next group.
      all.push_back(CommittedRecord{s, dig(static_cast<std::uint8_t>(s))});
      w->append(all.back());
      CHECK(w->dirty());
      const std::uint64_t rolls = w->stats().rolls;
      std::thread writer([&] { w->write_group(g); });
      w->maintain();  // only preallocation while a group is in flight
      writer.join();
      CHECK(w->stats().rolls == rolls);
      w->complete_group(g);
      CHECK_FALSE(w->group_in_flight());
      if (w->roll_waiting()) w->sync();
      w->maintain();
    }
    w->sync();
    CHECK(w->stats().rolls >= 2);
  }
  std::vector<PersistRecord> recs;
  open_ok(t.wal(), recs, o);
  CHECK(encoded(recs) == encoded(all));
}

TEST_CASE("wal: reopen, append, reopen cycles keep every record, also after a kill -9", "[wal]") {
  TempDir t;
  WalOptions o = segments_of(2048);
  const bool compact = GENERATE(false, true);
  if (compact) o.compact_bytes_min = 4096;
  std::vector<PersistRecord> all;
  std::uint64_t seq = 0;
  for (int cycle = 0; cycle < 24; ++cycle) {
    INFO("cycle " << cycle << (compact ? " with compaction" : ""));
    std::vector<PersistRecord> recs;
    auto w = open_ok(t.wal(), recs, o);
    const auto got = encoded(recs);
    if (compact) {
      CHECK(is_subsequence(encoded(needed(all)), got));
      CHECK(is_subsequence(got, encoded(all)));
    } else {
      CHECK(got == encoded(all));
    }
    CHECK(w->stats().torn_tail_bytes == 0);
    for (int g = 0; g < 1 + cycle % 5; ++g) {
      ++seq;
      for (const PersistRecord& r : {PersistRecord{pre_prepare(0, seq, 40 + 30 * (seq % 7))},
                                     PersistRecord{PreparedRecord{0, seq, dig(static_cast<std::uint8_t>(seq))}}}) {
        all.push_back(r);
        w->append(r);
      }
      if (seq % 4 == 0) {
        all.push_back(StableRecord{seq - 2, dig(static_cast<std::uint8_t>(seq))});
        w->append(all.back());
      }
      w->sync();
      if (cycle % 3 != 2) w->maintain();
    }
    if (cycle % 2 == 1) {
      // kill -9: the files as the page cache holds them at this moment (a next segment half preallocated,
      // nothing unsynced since every group was synced), copied before the Wal can tidy up.
      const std::string copy = t.path + "/copy";
      REQUIRE(std::system(("cp -a '" + t.wal() + "' '" + copy + "'").c_str()) == 0);
      w.reset();
      REQUIRE(std::system(("rm -rf '" + t.wal() + "' && mv '" + copy + "' '" + t.wal() + "'").c_str()) == 0);
    }
  }
  std::vector<PersistRecord> recs;
  auto w = open_ok(t.wal(), recs, o);
  if (compact) {
    CHECK(list(t.wal())[0].ends_with(".base"));
  } else {
    CHECK(encoded(recs) == encoded(all));
    CHECK(list(t.wal()).size() >= 4);  // the cycles crossed several roll-overs
  }
}

TEST_CASE("wal: a log written by format 1 (no preallocation, no seals) is replayed and continued", "[wal]") {
  TempDir t;
  REQUIRE(::mkdir(t.wal().c_str(), 0755) == 0);
  const std::vector<PersistRecord> rs = {ViewRecord{0, false}, pre_prepare(0, 1), PreparedRecord{0, 1, dig(1)},
                                         CommittedRecord{1, dig(1)}};
  const auto enc = encoded(rs);
  // Segment 1, sealed by its successor: it ends exactly at the end of its file.
  Bytes s1 = v1_header(11);
  for (std::size_t i = 0; i < 2; ++i) {
    const Bytes f = frame(11, i == 0 ? kGroupStartFlag : 0u, enc[i]);
    s1.insert(s1.end(), f.begin(), f.end());
  }
  // Segment 2, the last: two groups and a torn third.
  Bytes s2 = v1_header(22);
  for (std::size_t i = 2; i < 4; ++i) {
    const Bytes f = frame(22, kGroupStartFlag, enc[i]);
    s2.insert(s2.end(), f.begin(), f.end());
  }
  const std::size_t s2_end = s2.size();
  const Bytes torn = frame(22, kGroupStartFlag, encode_record(CommittedRecord{2, dig(2)}));
  s2.insert(s2.end(), torn.begin(), torn.begin() + 10);
  write_all(t.wal() + "/0000000000000001.seg", s1);
  write_all(t.wal() + "/0000000000000002.seg", s2);
  {
    std::vector<PersistRecord> recs;
    auto w = open_ok(t.wal(), recs);
    CHECK(encoded(recs) == enc);
    CHECK(w->stats().torn_tail_bytes == 10);
    CHECK(file_size(t.wal() + "/0000000000000002.seg") == s2_end);  // cut, as format 1 did
    CHECK(w->active_segment() == 3);  // a format-1 segment is never appended to
    w->append(CommittedRecord{2, dig(2)});
    w->sync();
  }
  std::vector<PersistRecord> recs;
  open_ok(t.wal(), recs);
  REQUIRE(recs.size() == rs.size() + 1);
  CHECK(std::get<CommittedRecord>(recs.back()).seq == 2);

  SECTION("a format-1 segment that does not end at the end of its file is corrupt when it has a successor") {
    s1.push_back(0);
    write_all(t.wal() + "/0000000000000001.seg", s1);
    CHECK_THAT(open_error(t.wal()), Catch::Contains("sealed segment"));
  }
}

TEST_CASE("wal: every cut and every bit flip is either a clean prefix or a reported error", "[wal]") {
  TempDir t;
  // A zero-filled tail after the data, small enough to try every byte. Buffered writes: a direct write pads the
  // file to a whole 4 KiB block, four times the bytes to try; replay reads the same format either way, and
  // the direct path has its own tests below.
  WalOptions o = segments_of(1024);
  o.direct_io = false;
  std::vector<PersistRecord> rs;
  std::size_t end = 0;
  {
    std::vector<PersistRecord> recs;
    auto w = open_ok(t.wal(), recs, o);
    for (std::uint64_t g = 0; g < 3; ++g) {
      for (std::uint64_t i = 0; i < 3; ++i) {
        const std::uint64_t s = g * 3 + i + 1;
        PersistRecord r = PreparedRecord{0, s, dig(static_cast<std::uint8_t>(s))};
        w->append(r);
        rs.push_back(r);
      }
      w->sync();
    }
    end = static_cast<std::size_t>(w->active_bytes());
  }
  const std::string seg = only_segment(t.wal());
  const Bytes original = read_all(seg);
  const std::size_t record_bytes = kWalRecordHeaderBytes + encode_record(rs[0]).size();
  const std::size_t last_group_start = kWalSegmentHeaderBytes + 6 * record_bytes;
  REQUIRE(end == last_group_start + 3 * record_bytes);
  REQUIRE(original.size() == 1024);
  REQUIRE(all_zero(original, end, original.size()));
  const auto all = encoded(rs);

  auto replay = [&](const Bytes& b, std::vector<Bytes>& out) -> std::string {
    write_all(seg, b);
    std::unique_ptr<Wal> w;
    std::vector<PersistRecord> recs;
    std::string err = Wal::open(t.wal(), o, w, recs);
    out = encoded(recs);
    w.reset();
    write_all(seg, original);  // open may have zeroed a torn tail
    return err;
  };
  auto is_prefix = [&](const std::vector<Bytes>& got) {
    return got.size() <= all.size() && std::equal(got.begin(), got.end(), all.begin());
  };

  // Anywhere in the last (unacknowledged) group, or in the zeros after it: the file cut there, or the rest of
  // the group never written (zeros): a prefix holding at least the synced groups.
  for (std::size_t cut = last_group_start; cut < original.size(); ++cut) {
    for (bool zeros : {false, true}) {
      Bytes b = original;
      if (zeros) {
        zero(b, cut, b.size());
      } else {
        b.resize(cut);
      }
      std::vector<Bytes> got;
      const std::string err = replay(b, got);
      INFO("cut at " << cut << (zeros ? " (zeros)" : "") << ": " << err);
      REQUIRE(err.empty());
      REQUIRE(is_prefix(got));
      REQUIRE(got.size() >= 6);
      if (cut >= end) REQUIRE(got.size() == 9);
    }
  }
  // One flipped bit in the header or a synced group (a later group exists): reported, never skipped.
  // One flipped bit in the last group or in the zeros after it: a prefix that keeps every synced group.
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
      if (at >= end) REQUIRE(got.size() == 9);
    }
  }
}

namespace {

// True when `dir`'s file system accepts O_DIRECT (ext4 does; tmpfs refuses it at open).
bool accepts_o_direct(const std::string& dir) {
  const std::string probe = dir + "/probe";
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_DIRECT | O_CLOEXEC, 0644);
  if (fd >= 0) ::close(fd);
  ::unlink(probe.c_str());
  return fd >= 0;
}

// Groups whose sizes put their ends anywhere in a 4 KiB block, across block boundaries, and one larger than
// the direct-write buffer the log keeps (1 MiB): every shape of head and padding a direct write can have.
void append_groups_of_every_shape(Wal& w, std::vector<PersistRecord>& all, std::uint64_t& seq) {
  for (std::size_t op : {1u, 100u, 4000u, 4096u, 5000u, 12345u, 3u << 20, 700u, 8191u}) {
    ++seq;
    for (std::size_t left = op; left > 0;) {  // an operation is at most kOpBytesMax: big groups take several
      const std::size_t n = std::min<std::size_t>(left, kOpBytesMax);
      all.push_back(pre_prepare(0, seq, n));
      w.append(all.back());
      left -= n;
    }
    all.push_back(PreparedRecord{0, seq, dig(static_cast<std::uint8_t>(seq))});
    w.append(all.back());
    w.sync();
    settle(w);  // preallocates the next segment and rolls over when the active one is full
  }
}

}  // namespace

TEST_CASE("wal: durable groups go through O_DIRECT where the file system allows it, and replay the same", "[wal]") {
  TempDir t;
  if (!accepts_o_direct(t.path)) {
    WARN("the file system of " << t.path << " refuses O_DIRECT; nothing to test here");
    return;
  }
  WalOptions o = segments_of(4ull << 20);  // roll-overs during the test, with the 3 MiB groups
  std::vector<PersistRecord> all;
  std::uint64_t seq = 0;
  for (int cycle = 0; cycle < 3; ++cycle) {
    INFO("cycle " << cycle);
    std::vector<PersistRecord> recs;
    auto w = open_ok(t.wal(), recs, o);
    CHECK(encoded(recs) == encoded(all));  // a reopen continues from a tail it learned by replay
    append_groups_of_every_shape(*w, all, seq);
    // Every group went through the direct descriptor: the partial block before each one was repeated from
    // memory, so a wrong head would have corrupted the records already there (the replay above and below).
    CHECK(w->stats().direct_writes == w->stats().syncs);
    CHECK(w->stats().syncs >= 9);
    if (cycle == 2) CHECK(w->active_segment() > 1);  // the log rolled over: the new segment's tail came from
                                                     // its header
  }
  std::vector<PersistRecord> recs;
  auto w = open_ok(t.wal(), recs, o);
  CHECK(encoded(recs) == encoded(all));
  CHECK(w->stats().torn_tail_bytes == 0);
}

TEST_CASE("wal: without O_DIRECT (switched off, or tmpfs) durable groups use RWF_DSYNC and replay the same", "[wal]") {
  // tmpfs refuses O_DIRECT at open: the log notices and goes on. Where /dev/shm is not there, the option.
  std::string base = "/dev/shm";
  const bool off = GENERATE(false, true);
  struct stat st{};
  if (off || ::stat(base.c_str(), &st) != 0 || accepts_o_direct(base)) base = "/tmp";
  TempDir t(base);
  WalOptions o = segments_of(4ull << 20);
  o.direct_io = base == "/dev/shm";  // on tmpfs it stays on: the fallback is what is tested
  INFO(t.path << (o.direct_io ? " (O_DIRECT refused)" : " (direct_io off)"));
  std::vector<PersistRecord> all;
  std::uint64_t seq = 0;
  for (int cycle = 0; cycle < 2; ++cycle) {
    std::vector<PersistRecord> recs;
    auto w = open_ok(t.wal(), recs, o);
    CHECK(encoded(recs) == encoded(all));
    append_groups_of_every_shape(*w, all, seq);
    CHECK(w->stats().direct_writes == 0);
    CHECK(w->stats().syncs >= 9);
  }
  std::vector<PersistRecord> recs;
  auto w = open_ok(t.wal(), recs, o);
  CHECK(encoded(recs) == encoded(all));
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
  if (prealloc) {
    const int zfd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    REQUIRE(zfd >= 0);
    const Bytes zeros(1 << 20, 0);
    const std::size_t total = group_bytes * static_cast<std::size_t>(groups) + (1 << 20);
    for (std::size_t off = 0; off < total; off += zeros.size()) {
      REQUIRE(::pwrite(zfd, zeros.data(), zeros.size(), static_cast<off_t>(off)) == static_cast<ssize_t>(zeros.size()));
    }
    REQUIRE(::fsync(zfd) == 0);
    ::close(zfd);
  }
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | open_flags, 0644);
  REQUIRE(fd >= 0);
  // O_DIRECT writes whole 512-byte sectors from an aligned buffer: the sectors that the group touches.
  const bool direct = (open_flags & O_DIRECT) != 0;
  void* mem = nullptr;
  REQUIRE(posix_memalign(&mem, 4096, group_bytes + 1024) == 0);
  auto* buf = static_cast<std::uint8_t*>(mem);
  std::memset(buf, 0x5A, group_bytes + 1024);
  std::vector<std::uint64_t> ns;
  ns.reserve(static_cast<std::size_t>(groups));
  for (int g = 0; g < groups; ++g) {
    buf[0] = static_cast<std::uint8_t>(g);
    std::size_t off = group_bytes * static_cast<std::size_t>(g);
    std::size_t len = group_bytes;
    if (direct) {
      const std::size_t end = (off + len + 511) / 512 * 512;
      off = off / 512 * 512;
      len = end - off;
    }
    const std::uint64_t t0 = bench_now_ns();
    iovec iov{buf, len};
    const ssize_t w = ::pwritev2(fd, &iov, 1, static_cast<off_t>(off), rwf_dsync ? RWF_DSYNC : 0);
    REQUIRE(w == static_cast<ssize_t>(len));
    if (fdatasync_after) REQUIRE(::fdatasync(fd) == 0);
    ns.push_back(bench_now_ns() - t0);
  }
  std::free(mem);
  ::close(fd);
  ::unlink(path.c_str());
  char label[128];
  std::snprintf(label, sizeof label, "raw %5zu B %s", group_bytes, what);
  bench_report(label, std::move(ns));
}

}  // namespace

TEST_CASE("wal bench: one small group made durable, by method", "[.bench]") {
  BenchDir d;
  for (std::size_t size : {std::size_t{200}, std::size_t{4096}}) {
    bench_raw(d.path, "append + fdatasync", size, false, 0, false, true);
    bench_raw(d.path, "append, pwritev2 RWF_DSYNC", size, false, 0, true, false);
    bench_raw(d.path, "overwrite (zero-filled, fsynced) + fdatasync", size, true, 0, false, true);
    bench_raw(d.path, "overwrite, pwritev2 RWF_DSYNC", size, true, 0, true, false);
    bench_raw(d.path, "overwrite, O_DSYNC", size, true, O_DSYNC, false, false);
    bench_raw(d.path, "overwrite, O_DIRECT sectors, RWF_DSYNC", size, true, O_DIRECT, true, false);
  }
}

TEST_CASE("wal bench: group commit through the Wal", "[.bench]") {
  // As the runtime uses the log: sync() before the sends, maintain() after them. Small segments make the
  // preallocation and roll-over happen often enough to be measured; BFTFS_BENCH_SEGMENT_BYTES overrides.
  BenchDir d;
  std::vector<PersistRecord> recs;
  WalOptions o;
  if (const char* s = std::getenv("BFTFS_BENCH_SEGMENT_BYTES")) o.segment_bytes_max = std::strtoull(s, nullptr, 10);
  auto w = open_ok(d.path + "/wal", recs, o);
  const int groups = bench_groups();
  std::vector<std::uint64_t> ns, steps;
  ns.reserve(static_cast<std::size_t>(groups));
  for (int g = 1; g <= groups; ++g) {
    const auto s = static_cast<std::uint64_t>(g);
    // A backup's critical-path group: the pre-prepare (one request) and the prepared record.
    w->append(pre_prepare(0, s, 16));
    w->append(PreparedRecord{0, s, dig(static_cast<std::uint8_t>(s))});
    const std::uint64_t t0 = bench_now_ns();
    w->sync();
    const std::uint64_t t1 = bench_now_ns();
    ns.push_back(t1 - t0);
    if (w->maintain()) steps.push_back(bench_now_ns() - t1);
  }
  char label[160];
  std::snprintf(label, sizeof label, "Wal::sync (pre-prepare + prepared, ~220 B), segments %llu KiB",
                static_cast<unsigned long long>(o.segment_bytes_max >> 10));
  bench_report(label, std::move(ns));
  const WalStats& st = w->stats();
  std::printf("  maintain(): %llu preallocation steps (%llu MiB of zeros), %llu roll-overs, longest step %.1f us, "
              "longest roll-over %.1f us; groups past the preallocation: %llu\n",
              static_cast<unsigned long long>(st.prealloc_steps),
              static_cast<unsigned long long>(st.prealloc_bytes >> 20), static_cast<unsigned long long>(st.rolls),
              static_cast<double>(st.prealloc_ns_max) / 1e3, static_cast<double>(st.roll_ns_max) / 1e3,
              static_cast<unsigned long long>(st.syncs_past_prealloc));
  if (!steps.empty()) bench_report("  maintain() calls that did work", std::move(steps));
}
