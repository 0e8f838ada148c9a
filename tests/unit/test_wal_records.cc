// The write-ahead log's records and their framing (storage/wal.h): the checksum, a round trip across a
// reopen, a record whose checksum holds but that does not decode, and logs framed by format 1 (an older bftfs:
// no preallocation, no seals), replayed and continued.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <span>
#include <string>
#include <vector>

#include "storage/crc32c.h"
#include "storage/wal.h"

#include "test_wal_util.h"

using namespace bftfs;
using namespace bftfs::wal_testing;

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
