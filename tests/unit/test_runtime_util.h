// Helpers shared by the runtime tests (tests/unit/test_runtime*.cc): temporary directories, free loopback
// ports, and running an event loop until a condition holds or a deadline passes.
#pragma once

#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <thread>

#include "runtime/event_raii.h"

namespace bftfs::testing {

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/bftfs-rt-XXXXXX";
    char* p = mkdtemp(tmpl);
    REQUIRE(p != nullptr);
    path = p;
  }
  ~TempDir() { [[maybe_unused]] int rc = std::system(("rm -rf '" + path + "'").c_str()); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

inline bool port_free(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

// A base port with `count` consecutive free loopback ports (racy by nature; the range is random).
inline std::uint16_t free_port_range(int count) {
  std::mt19937 rng(static_cast<unsigned>(::getpid()) ^ static_cast<unsigned>(::time(nullptr)));
  for (int attempt = 0; attempt < 200; ++attempt) {
    const auto base = static_cast<std::uint16_t>(20000 + rng() % 30000);
    bool ok = true;
    for (int i = 0; i < count && ok; ++i) ok = port_free(static_cast<std::uint16_t>(base + i));
    if (ok) return base;
  }
  FAIL("no free port range");
  return 0;
}

// Runs `base` until `done()` is true (checked every millisecond) or `timeout_ms` passes. Returns done().
inline bool run_until(event_base* base, const std::function<bool()>& done, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!done() && std::chrono::steady_clock::now() < deadline) {
    timeval tv{0, 1000};
    event_base_loopexit(base, &tv);
    event_base_loop(base, 0);
  }
  return done();
}

// Polls `done()` from this thread (for state owned by other threads' loops). Returns as soon as `done()` is
// true, without calling it again (a predicate may consume what it found, e.g. an event).
inline bool wait_until(const std::function<bool()>& done, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    if (done()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace bftfs::testing
