// The FUSE client's write-behind (client/write_behind.h) without FUSE: how pieces coalesce into ops, where a
// coalesced append lands, and the lane's backpressure (a writer whose staged request is full waits while the
// lane is full, and no other writer does; the flusher holds its sends while the lane is full).
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "client/node_table.h"
#include "client/write_behind.h"
#include "test_runtime_util.h"

using namespace bftfs;
using namespace bftfs::client;

namespace {

const fs::Handle kRoot = fs::Handle::of(1, 1);

fs::Attr file_attr(std::uint64_t ino) {
  fs::Attr a;
  a.ino = ino;
  a.generation = 1;
  a.type = fs::FileType::kRegular;
  a.mode = 0644;
  a.nlink = 1;
  return a;
}

fs::Op write_op(bool append, std::uint64_t offset, const std::string& data, std::uint32_t uid = 0) {
  fs::Op op;
  op.code = fs::OpCode::kWrite;
  op.handle = fs::Handle::of(7, 1);
  op.cred = fs::Cred{uid, uid, {}};
  op.append = append;
  op.offset = append ? 0 : offset;
  op.data.assign(data.begin(), data.end());
  return op;
}

std::string text(const Bytes& b) { return std::string(b.begin(), b.end()); }

// A write-behind whose submissions are recorded, not sent; finished() is the test's to call.
struct Fixture {
  explicit Fixture(WriteBehind::Options o = {}) : wb(o, table, counters, [this](FuseIno id, const fs::Request& r,
                                                                               std::vector<WriteBehind::Piece> p) {
    std::lock_guard<std::mutex> lock(mu);
    sent.push_back(Sent{id, r, std::move(p)});
  }) {
    a = table.remember(file_attr(7), 1);
    b = table.remember(file_attr(8), 1);
  }
  struct Sent {
    FuseIno id;
    fs::Request request;
    std::vector<WriteBehind::Piece> pieces;
  };
  std::size_t sent_count() {
    std::lock_guard<std::mutex> lock(mu);
    return sent.size();
  }
  bool stage(FuseIno id, fs::Op op, std::uint64_t kernel_offset = 0) {
    return wb.stage(id, std::move(op), kernel_offset, nullptr);
  }

  NodeTable table{kRoot};
  ClientCounters counters;
  std::mutex mu;
  std::vector<Sent> sent;
  WriteBehind wb;
  FuseIno a = 0, b = 0;
};

// Polls `done` for up to two seconds (the flusher is a thread of its own).
bool eventually(const std::function<bool()>& done) { return bftfs::testing::wait_until(done, 2000); }

}  // namespace

TEST_CASE("write-behind: consecutive appends of one credential become one op, in staging order",
          "[client][write_behind]") {
  Fixture fx;
  REQUIRE(fx.stage(fx.a, write_op(true, 0, "r1.."), 100));
  REQUIRE(fx.stage(fx.a, write_op(true, 0, "r2.."), 104));
  REQUIRE(fx.stage(fx.a, write_op(true, 0, "r3.."), 108));
  REQUIRE(fx.stage(fx.a, write_op(true, 0, "r4.."), 112));
  REQUIRE(fx.stage(fx.a, write_op(true, 0, "r5.."), 116));
  REQUIRE(fx.table.writes_in_flight() == 5);
  fx.wb.kick(fx.a, fx.counters.stage_sends_close);
  REQUIRE(fx.sent.size() == 1);
  const fs::Request& r = fx.sent[0].request;
  REQUIRE(r.ops.size() == 1);
  CHECK(r.ops[0].append);
  CHECK(r.ops[0].offset == 0);
  CHECK(text(r.ops[0].data) == "r1..r2..r3..r4..r5..");
  const auto& pieces = fx.sent[0].pieces;
  REQUIRE(pieces.size() == 5);
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    CHECK(pieces[i].op_index == 0);
    CHECK(pieces[i].op_pos == 4 * i);
  }
  CHECK(fx.counters.ops_joined == 4);
  CHECK(fx.wb.in_flight() == 1);
}

TEST_CASE("write-behind: appends of other credentials, or after a positional write, get ops of their own",
          "[client][write_behind]") {
  Fixture fx;
  REQUIRE(fx.stage(fx.a, write_op(true, 0, "aaaa")));
  REQUIRE(fx.stage(fx.a, write_op(true, 0, "bbbb", 1000)));  // another user's descriptor
  REQUIRE(fx.stage(fx.a, write_op(false, 0, "cccc", 1000)));
  REQUIRE(fx.stage(fx.a, write_op(true, 0, "dddd", 1000)));  // lands after the positional write's effect
  REQUIRE(fx.stage(fx.a, write_op(false, 2, "ee", 1000)));   // may not move before the append
  fx.wb.kick(fx.a, fx.counters.stage_sends_close);
  REQUIRE(fx.sent.size() == 1);
  const auto& ops = fx.sent[0].request.ops;
  REQUIRE(ops.size() == 5);
  CHECK(text(ops[0].data) == "aaaa");
  CHECK(text(ops[1].data) == "bbbb");
  CHECK(text(ops[2].data) == "cccc");
  CHECK(text(ops[3].data) == "dddd");
  CHECK(text(ops[4].data) == "ee");
  CHECK(fx.counters.ops_joined == 0);
}

TEST_CASE("write-behind: positional writes join an op they overlap or touch, the later bytes winning",
          "[client][write_behind]") {
  Fixture fx;
  REQUIRE(fx.stage(fx.a, write_op(false, 0, "aaaa")));
  REQUIRE(fx.stage(fx.a, write_op(false, 4, "bbbb")));    // touches: op 0 grows
  REQUIRE(fx.stage(fx.a, write_op(false, 100, "cccc")));  // apart: op 1
  REQUIRE(fx.stage(fx.a, write_op(false, 2, "XXXX")));    // overlaps op 0 only: joins it past op 1
  REQUIRE(fx.stage(fx.a, write_op(false, 96, "dddd")));   // touches op 1 from below
  REQUIRE(fx.stage(fx.a, write_op(false, 98, "ZZ", 5)));  // overlaps op 1, another credential: op 2
  REQUIRE(fx.stage(fx.a, write_op(false, 99, "y")));      // must land after op 2, which it overlaps: op 3
  fx.wb.kick(fx.a, fx.counters.stage_sends_close);
  REQUIRE(fx.sent.size() == 1);
  const auto& ops = fx.sent[0].request.ops;
  REQUIRE(ops.size() == 4);
  CHECK(ops[0].offset == 0);
  CHECK(text(ops[0].data) == "aaXXXXbb");
  CHECK(ops[1].offset == 96);
  CHECK(text(ops[1].data) == "ddddcccc");
  CHECK(ops[2].offset == 98);
  CHECK(text(ops[2].data) == "ZZ");
  CHECK(ops[3].offset == 99);
  CHECK(text(ops[3].data) == "y");
  const auto& pieces = fx.sent[0].pieces;
  REQUIRE(pieces.size() == 7);
  const std::vector<std::size_t> op_of = {0, 0, 1, 0, 1, 2, 3};
  for (std::size_t i = 0; i < pieces.size(); ++i) CHECK(pieces[i].op_index == op_of[i]);
}

TEST_CASE("write-behind: a coalesced append is misplaced when it did not land where the kernel put it",
          "[client][write_behind]") {
  std::vector<WriteBehind::Piece> pieces(2);
  pieces[0].append = pieces[1].append = true;
  pieces[0].len = pieces[1].len = 4;
  pieces[0].kernel_offset = 100;
  pieces[1].kernel_offset = 104;
  pieces[1].op_pos = 4;
  fs::Result r;
  r.results.resize(1);
  r.results[0].attr.size = 108;  // the op's 8 bytes landed at 100: where the kernel put them
  CHECK_FALSE(WriteBehind::appends_misplaced(pieces, r));
  r.results[0].attr.size = 112;  // another client appended 4 bytes first
  CHECK(WriteBehind::appends_misplaced(pieces, r));
}

TEST_CASE("write-behind: a writer whose staged request is full waits while the lane is full; others do not",
          "[client][write_behind]") {
  WriteBehind::Options o;
  o.requests_max = 1;
  Fixture fx(o);
  const std::string half(fs::kIoBytesMax, 'h');
  REQUIRE(fx.stage(fx.a, write_op(false, 0, half)));  // full: sent at once, the lane is now full
  REQUIRE(fx.sent_count() == 1);
  REQUIRE(fx.stage(fx.a, write_op(false, fs::kIoBytesMax, half)));  // full too, held: no room
  REQUIRE(fx.sent_count() == 1);
  std::atomic<int> staged{-1};
  std::thread writer([&] { staged = fx.stage(fx.a, write_op(false, 2 * fs::kIoBytesMax, "more")) ? 1 : 0; });
  // Another file's writer stages at once: its piece fits a staged request of its own.
  REQUIRE(fx.stage(fx.b, write_op(false, 0, "small")));
  REQUIRE(eventually([&] { return fx.counters.write_behind_waits == 1; }));  // the writer waits for room
  CHECK(staged == -1);  // still waiting for room
  fx.wb.finished();  // the first request is final: the held one goes, then the piece stages
  writer.join();
  CHECK(staged == 1);
  CHECK(fx.sent_count() == 2);
  CHECK(fx.wb.in_flight() == 1);
  CHECK(fx.table.writes_in_flight() == 4);
}

TEST_CASE("write-behind: a writer waiting for room stops at its interrupt, with nothing staged",
          "[client][write_behind]") {
  WriteBehind::Options o;
  o.requests_max = 1;
  Fixture fx(o);
  const std::string half(fs::kIoBytesMax, 'h');
  REQUIRE(fx.stage(fx.a, write_op(false, 0, half)));
  REQUIRE(fx.stage(fx.a, write_op(false, fs::kIoBytesMax, half)));
  std::atomic<bool> interrupted{false};
  std::atomic<int> staged{-1};
  std::thread writer([&] {
    staged = fx.wb.stage(fx.a, write_op(false, 0, "x"), 0, [&] { return interrupted.load(); }) ? 1 : 0;
  });
  REQUIRE(eventually([&] { return fx.counters.write_behind_waits == 1; }));  // it waits for room
  interrupted = true;
  fx.wb.wake_waiters();
  writer.join();
  CHECK(staged == 0);
  CHECK(fx.table.writes_in_flight() == 2);  // the interrupted piece was never counted
  CHECK(fx.sent_count() == 1);
}

TEST_CASE("write-behind: while the lane is full the flusher holds a file's pieces, and they coalesce",
          "[client][write_behind]") {
  WriteBehind::Options o;
  o.requests_max = 1;
  o.stage_delay = std::chrono::milliseconds(2);
  Fixture fx(o);
  fx.wb.start_flusher();
  REQUIRE(fx.stage(fx.a, write_op(true, 0, "r0..")));
  REQUIRE(eventually([&] { return fx.sent_count() == 1; }));  // stage_delay old, the lane had room
  for (int i = 1; i <= 100; ++i) REQUIRE(fx.stage(fx.a, write_op(true, 0, "r...")));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));  // many stage delays: still held
  CHECK(fx.sent_count() == 1);
  fx.wb.finished();
  REQUIRE(eventually([&] { return fx.sent_count() == 2; }));
  fx.wb.stop_flusher();
  std::lock_guard<std::mutex> lock(fx.mu);
  REQUIRE(fx.sent[1].request.ops.size() == 1);  // 100 appends, one op
  CHECK(fx.sent[1].request.ops[0].data.size() == 400);
  CHECK(fx.sent[1].pieces.size() == 100);
}
