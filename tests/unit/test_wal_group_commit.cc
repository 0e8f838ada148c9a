// The write-ahead log's group commit (storage/wal.h, "Group commit" and "Direct I/O"): groups written on
// another thread while appending goes on, logs without fsync, and durable groups through O_DIRECT or, where the
// file system refuses it, pwritev2(RWF_DSYNC), each replayed the same.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <thread>
#include <vector>

#include "storage/wal.h"

#include "test_wal_util.h"

using namespace bftfs;
using namespace bftfs::wal_testing;

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
