// Measurements of the write-ahead log's durable writes (hidden: run with `build/tests/unit_tests '[.bench]'`;
// benchmarks are not tests, so nothing here asserts a time). The directory is BFTFS_BENCH_DIR if set, else
// /tmp (the same disk as /work on this machine kind). Each line prints p50/p99/mean of one way to make a small
// group durable.
#include <fcntl.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "storage/wal.h"

#include "test_wal_util.h"

using namespace bftfs;
using namespace bftfs::wal_testing;

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
