// The write-ahead log's segments (storage/wal.h, preallocation, roll-over and "Compaction"): the log rolls over
// before a segment fills, compaction keeps exactly what recovery needs, and an interrupted compaction or
// segment creation is recovered.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "storage/wal.h"

#include "test_wal_util.h"

using namespace bftfs;
using namespace bftfs::wal_testing;

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
