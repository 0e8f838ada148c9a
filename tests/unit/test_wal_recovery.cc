// Replaying the write-ahead log after a crash (storage/wal.h, "Replay"): the end of the log is found by the
// records, not the file size; torn tails are removed and can never come back; corruption and missing seals
// are reported, never skipped; every cut and bit flip gives a clean prefix or an error; reopen cycles with
// kill -9 keep every record.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <vector>

#include "storage/wal.h"

#include "test_wal_util.h"

using namespace bftfs;
using namespace bftfs::wal_testing;

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
