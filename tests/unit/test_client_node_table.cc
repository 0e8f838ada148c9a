// The FUSE client's cache and handle logic (client/node_table.h) and the local backend (client/local_backend.h),
// without FUSE.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "client/local_backend.h"
#include "client/node_table.h"

using namespace bftfs;
using namespace bftfs::client;

namespace {

const fs::Handle kRoot = fs::Handle::of(1, 1);

fs::Attr file_attr(std::uint64_t ino, std::uint64_t gen, std::uint64_t size = 0, std::uint64_t mtime = 1) {
  fs::Attr a;
  a.ino = ino;
  a.generation = gen;
  a.type = fs::FileType::kRegular;
  a.mode = 0644;
  a.nlink = 1;
  a.size = size;
  a.mtime_ns = mtime;
  return a;
}

}  // namespace

TEST_CASE("client cache: one node per (ino, generation); a reused inode number gets a new node", "[client]") {
  NodeTable t(kRoot);
  const FuseIno a = t.remember(file_attr(5, 1), 1);
  REQUIRE(t.remember(file_attr(5, 1), 2) == a);  // a second lookup of the same object
  REQUIRE(t.lookups(a) == 2);
  const FuseIno b = t.remember(file_attr(5, 2), 3);  // same number, next generation: a different object
  REQUIRE(b != a);
  REQUIRE(b != kRootNode);
  REQUIRE(t.handle(a) == fs::Handle::of(5, 1));
  REQUIRE(t.handle(b) == fs::Handle::of(5, 2));
}

TEST_CASE("client cache: forget drops a node only when the kernel's references reach zero", "[client]") {
  NodeTable t(kRoot);
  const FuseIno a = t.remember(file_attr(7, 1), 1);
  (void)t.remember(file_attr(7, 1), 2);
  REQUIRE_FALSE(t.forget(a, 1));
  REQUIRE(t.handle(a).has_value());
  REQUIRE(t.forget(a, 1));
  REQUIRE_FALSE(t.handle(a).has_value());
  REQUIRE_FALSE(t.find(fs::Handle::of(7, 1)).has_value());
  REQUIRE(t.forget(a, 1));  // forgetting an unknown node is harmless
  REQUIRE_FALSE(t.forget(kRootNode, 1000));  // the root is never forgotten
  REQUIRE(t.handle(kRootNode) == kRoot);
}

TEST_CASE("client cache: an older result never overwrites newer attributes", "[client]") {
  NodeTable t(kRoot);
  const FuseIno a = t.remember(file_attr(3, 1, 10), 5);
  t.update_attr(file_attr(3, 1, 99), 4);  // submitted before the one that gave size 10
  REQUIRE(t.snapshot(a)->attr.size == 10);
  t.update_attr(file_attr(3, 1, 20), 6);
  REQUIRE(t.snapshot(a)->attr.size == 20);
  t.update_attr(file_attr(3, 2, 30), 7);  // another generation: not this node
  REQUIRE(t.snapshot(a)->attr.size == 20);
}

TEST_CASE("client cache: a snapshot says which request's result gave the committed attributes, and when",
          "[client]") {
  NodeTable t(kRoot);
  const auto before = std::chrono::steady_clock::now();
  const FuseIno a = t.remember(file_attr(7, 1, 10), 4);
  REQUIRE(t.snapshot(a)->attr_seq == 4);
  REQUIRE(t.snapshot(a)->attr_time >= before);
  t.update_attr(file_attr(7, 1, 20), 3);  // older: ignored, and does not refresh the time either
  REQUIRE(t.snapshot(a)->attr_seq == 4);
  REQUIRE(t.snapshot(a)->attr.size == 10);
  const auto mid = std::chrono::steady_clock::now();
  t.update_attr(file_attr(7, 1, 30), 9);
  REQUIRE(t.snapshot(a)->attr_seq == 9);
  REQUIRE(t.snapshot(a)->attr_time >= mid);
  // A write's final result refreshes them too (the attribute cache answers getattr from it).
  const std::uint64_t w = t.write_submitted(a, 0, 5, false);
  t.write_finished(a, w, 5, 0, file_attr(7, 1, 30, 2), 12);
  REQUIRE(t.snapshot(a)->attr_seq == 12);
  REQUIRE(t.snapshot(a)->attr.mtime_ns == 2);
}

TEST_CASE("client cache: the data version is unknown until the first open records it", "[client]") {
  NodeTable t(kRoot);
  const FuseIno a = t.remember(file_attr(8, 1, 10, 5), 1);
  REQUIRE_FALSE(t.data_version(a).has_value());  // open() then prefetches: the kernel holds no pages
  REQUIRE_FALSE(t.opened(a, DataVersion{5, 10}));
  REQUIRE(t.data_version(a) == DataVersion{5, 10});
  REQUIRE(t.opened(a, DataVersion{5, 10}));  // unchanged: the kernel may keep its pages
  REQUIRE_FALSE(t.data_version(12345).has_value());  // an unknown node
}

TEST_CASE("client cache: pending writes overlay the committed size until final, and errors report once",
          "[client]") {
  NodeTable t(kRoot);
  const FuseIno a = t.remember(file_attr(4, 1, 100), 1);
  REQUIRE(t.opened(a, DataVersion{1, 100}) == false);  // first open: nothing cached yet
  const std::uint64_t w1 = t.write_submitted(a, 1000, 24, false);
  const std::uint64_t w2 = t.write_submitted(a, 50, 10, false);
  auto s = t.snapshot(a);
  REQUIRE(s->has_pending);
  REQUIRE(s->attr.size == 1024);  // read-your-writes: the overlay extends the committed size
  REQUIRE(t.pending_bytes() == 34);
  t.write_finished(a, w1, 24, 0, file_attr(4, 1, 1024, 2), 2);
  t.write_finished(a, w2, 10, 28 /* ENOSPC */, std::nullopt, 3);
  s = t.snapshot(a);
  REQUIRE_FALSE(s->has_pending);
  REQUIRE(s->attr.size == 1024);  // the committed layer now has the write's result
  REQUIRE(t.pending_bytes() == 0);
  REQUIRE(t.take_write_error(a) == 28);
  REQUIRE(t.take_write_error(a) == 0);
  // Our own write changed mtime/size: the page cache still holds what we wrote, so the next open keeps it.
  REQUIRE(t.opened(a, DataVersion{2, 1024}));
  REQUIRE_FALSE(t.opened(a, DataVersion{3, 1024}));  // someone else wrote: drop it
}

TEST_CASE("client cache: waiting for writes ends when they are final or when interrupted", "[client]") {
  NodeTable t(kRoot);
  const FuseIno a = t.remember(file_attr(4, 1), 1);
  const std::uint64_t w = t.write_submitted(a, 0, 5, false);
  // (Catch2 assertions stay on this thread: the waiters only record what they returned.)
  std::atomic<bool> interrupted{false};
  std::atomic<int> first{-1}, second{-1};
  std::thread waiter_interrupted([&] { first = t.wait_writes(a, [&] { return interrupted.load(); }) ? 1 : 0; });
  interrupted.store(true);
  t.notify_waiters();
  waiter_interrupted.join();
  REQUIRE(first == 0);
  std::thread waiter([&] { second = t.wait_writes(a, nullptr) ? 1 : 0; });
  t.write_finished(a, w, 5, 0, file_attr(4, 1, 5), 2);
  waiter.join();
  REQUIRE(second == 1);
  REQUIRE(t.wait_pending_below(0, nullptr));
}

TEST_CASE("client cache: a node with writes in flight or opens outlives the kernel's forget", "[client]") {
  NodeTable t(kRoot);
  const FuseIno a = t.remember(file_attr(9, 1), 1);
  const std::uint64_t w = t.write_submitted(a, 0, 3, false);
  REQUIRE_FALSE(t.forget(a, 1));
  REQUIRE(t.handle(a).has_value());
  t.write_finished(a, w, 3, 0, file_attr(9, 1, 3), 2);
  REQUIRE_FALSE(t.handle(a).has_value());  // gone once the write is final
}

TEST_CASE("client cache: silly rename hides nlink and hands the hidden name to the last reference", "[client]") {
  NodeTable t(kRoot);
  const FuseIno a = t.remember(file_attr(6, 3), 1);
  REQUIRE(t.referenced(a));  // the kernel holds a lookup: it may still open it
  (void)t.opened(a, DataVersion{});
  (void)t.opened(a, DataVersion{});
  REQUIRE(t.any_open());
  const std::string name = t.silly_name_for(fs::Handle::of(6, 3));
  REQUIRE(name.rfind(".bftfs-silly-6-3-", 0) == 0);
  REQUIRE(t.silly_name_for(fs::Handle::of(6, 3)) != name);  // unique
  REQUIRE(t.set_silly(a, SillyName{kRoot, name}));
  REQUIRE(t.snapshot(a)->attr.nlink == 0);  // the user's last link is gone
  REQUIRE_FALSE(t.released(a).has_value());  // still open once
  REQUIRE_FALSE(t.released(a).has_value());  // closed, but the kernel still holds its lookup
  REQUIRE_FALSE(t.any_open());
  std::optional<SillyName> hidden;
  REQUIRE(t.forget(a, 1, &hidden));
  REQUIRE(hidden.has_value());
  REQUIRE(hidden->name == name);
  REQUIRE_FALSE(t.set_silly(a, SillyName{kRoot, "x"}));  // gone: nothing to hide
}

TEST_CASE("client cache: a hidden node released after the kernel forgot it hands its name to the release", "[client]") {
  NodeTable t(kRoot);
  const FuseIno a = t.remember(file_attr(7, 1), 1);
  (void)t.opened(a, DataVersion{});
  REQUIRE(t.set_silly(a, SillyName{kRoot, "h"}));
  std::optional<SillyName> hidden;
  REQUIRE_FALSE(t.forget(a, 1, &hidden));  // still open
  REQUIRE_FALSE(hidden.has_value());
  const auto last = t.released(a);
  REQUIRE(last.has_value());
  REQUIRE(last->name == "h");
  REQUIRE(t.take_all_silly().empty());
}

TEST_CASE("local backend: executes in submission order and reports each final result once", "[client]") {
  LocalBackend b(nullptr);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::uint32_t> errs;
  auto submit = [&](fs::Op op) {
    fs::Request r;
    r.ops.push_back(std::move(op));
    Callbacks cb;
    cb.on_final = [&](Final f) {
      std::lock_guard<std::mutex> lock(mu);
      if (f.status != FinalStatus::kCommitted) {
        errs.push_back(9999);
      } else {
        errs.push_back(f.result.outcome == fs::Outcome::kDone ? 0 : f.result.results[f.result.stop].err);
      }
      cv.notify_all();
    };
    (void)b.submit(r, SubmitOptions{}, std::move(cb));
  };
  fs::Op create;
  create.code = fs::OpCode::kCreate;
  create.handle = kRoot;
  create.name = "f";
  create.mode = 0644;
  create.exclusive = true;
  submit(create);
  submit(create);  // second exclusive create of the same name: EEXIST, because it ran second
  fs::Op rm;
  rm.code = fs::OpCode::kRemove;
  rm.handle = kRoot;
  rm.name = "f";
  submit(rm);
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return errs.size() == 3; });
  REQUIRE(errs == std::vector<std::uint32_t>{0, fs::err::kExist, 0});
}

TEST_CASE("client cache: a waiter waits for the writes submitted before it, not for those that keep coming",
          "[client]") {
  NodeTable t(kRoot);
  const FuseIno a = t.remember(file_attr(5, 1), 1);
  REQUIRE(t.last_write_ticket(a) == 0);
  const std::uint64_t w1 = t.write_submitted(a, 0, 4, true);
  const std::uint64_t w2 = t.write_submitted(a, 0, 4, true);
  REQUIRE(w2 > w1);
  const std::uint64_t upto = t.last_write_ticket(a);  // a stat begins: it must see w1 and w2
  REQUIRE(upto == w2);
  const std::uint64_t w3 = t.write_submitted(a, 0, 4, true);  // another process keeps appending
  std::atomic<int> returned{-1};
  std::thread stat([&] { returned = t.wait_writes(a, nullptr, std::chrono::milliseconds(0), upto) ? 1 : 0; });
  t.write_finished(a, w1, 4, 0, file_attr(5, 1, 4), 2);
  t.write_finished(a, w2, 4, 0, file_attr(5, 1, 8), 3);
  stat.join();  // returns although w3 (and more after it) are still in flight
  REQUIRE(returned == 1);
  REQUIRE(t.snapshot(a)->has_pending);
  REQUIRE(t.writes_in_flight() == 1);
  t.write_finished(a, w3, 4, 0, file_attr(5, 1, 12), 4);
  REQUIRE(t.wait_writes(a, nullptr));
  REQUIRE(t.last_write_ticket(a) == w3);  // tickets are never reused
}
