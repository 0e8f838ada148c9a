// The FUSE client's relay backend (client/relay_backend.h) against the socket protocol of docs/RELAY.md: the
// test plays the relay's side of the socket with the shared codec (relay/relay_wire.h).
#include <catch2/catch.hpp>

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <variant>

#include "client/relay_backend.h"
#include "relay/relay_wire.h"
#include "os/unique_fd.h"
#include "test_runtime_util.h"

using namespace bftfs;

namespace {

constexpr int kWaitMs = 10000;  // a deadline against hangs, not a timing assertion

UniqueFd listen_at(const std::string& path) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(fd.valid());
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  REQUIRE(::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(::listen(fd.get(), 4) == 0);
  return fd;
}

UniqueFd accept_one(const UniqueFd& l) {
  pollfd p{l.get(), POLLIN, 0};
  REQUIRE(::poll(&p, 1, kWaitMs) == 1);
  UniqueFd c(::accept4(l.get(), nullptr, nullptr, SOCK_CLOEXEC));
  REQUIRE(c.valid());
  return c;
}

// Reads one frame from the mount's side.
relay::MountMsg read_msg(const UniqueFd& fd, relay::FrameSplitter& sp) {
  for (;;) {
    Bytes body;
    relay::RelayWireError why{};
    const auto next = sp.next(body, why);
    REQUIRE(next != relay::FrameSplitter::Next::kBroken);
    if (next == relay::FrameSplitter::Next::kFrame) {
      relay::MountMsg m;
      REQUIRE(relay::decode_mount_body(body, m) == relay::RelayWireError::kOk);
      return m;
    }
    pollfd p{fd.get(), POLLIN, 0};
    REQUIRE(::poll(&p, 1, kWaitMs) == 1);
    std::uint8_t buf[65536];
    const ssize_t n = ::recv(fd.get(), buf, sizeof(buf), 0);
    REQUIRE(n > 0);
    sp.append(std::span<const std::uint8_t>(buf, static_cast<std::size_t>(n)));
  }
}

void send_msg(const UniqueFd& fd, const relay::RelayMsg& m) {
  const Bytes f = relay::encode_relay_frame(m);
  REQUIRE(::send(fd.get(), f.data(), f.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(f.size()));
}

fs::Request getattr_root() {
  fs::Op op;
  op.code = fs::OpCode::kGetattr;
  op.handle = fs::Handle::of(1, 1);
  fs::Request r;
  r.ops.push_back(op);
  return r;
}

struct Results {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<std::uint64_t, client::Final>> finals;
  client::Callbacks callbacks_for(std::uint64_t id) {
    client::Callbacks cb;
    cb.on_final = [this, id](client::Final f) {
      std::lock_guard<std::mutex> lock(mu);
      finals.emplace_back(id, std::move(f));
      cv.notify_all();
    };
    return cb;
  }
  bool wait_count(std::size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::milliseconds(kWaitMs), [&] { return finals.size() >= n; });
  }
};

}  // namespace

TEST_CASE("relay backend: HELLO first, SUBMITs in order, FINAL to the caller; a reconnect resubmits what has "
          "no FINAL in tag order; CANCEL stops a request", "[client][relay]") {
  testing::TempDir dir;
  const std::string path = dir.path + "/relay.sock";
  UniqueFd l = listen_at(path);
  client::RelayBackend backend(path);
  Results res;

  UniqueFd c1 = accept_one(l);
  relay::FrameSplitter sp1;
  REQUIRE(std::holds_alternative<relay::Hello>(read_msg(c1, sp1)));
  send_msg(c1, relay::HelloOk{relay::kRelayWireVersion, 7, 4, 1});

  client::SubmitOptions ro;
  ro.read_only = true;
  const std::uint64_t t1 = backend.submit(getattr_root(), ro, res.callbacks_for(1));
  const std::uint64_t t2 = backend.submit(getattr_root(), client::SubmitOptions{}, res.callbacks_for(2));
  const std::uint64_t t3 = backend.submit(getattr_root(), client::SubmitOptions{}, res.callbacks_for(3));
  auto s1 = std::get<relay::Submit>(read_msg(c1, sp1));
  auto s2 = std::get<relay::Submit>(read_msg(c1, sp1));
  auto s3 = std::get<relay::Submit>(read_msg(c1, sp1));
  REQUIRE((s1.tag == t1 && s2.tag == t2 && s3.tag == t3));
  REQUIRE(s1.flags == relay::kFlagReadOnly);
  REQUIRE(s2.flags == 0);
  REQUIRE(s1.request == fs::encode_request(getattr_root()));

  // The relay answers the first; the mount then cancels the third.
  fs::Result ok;
  ok.outcome = fs::Outcome::kDone;
  fs::OpResult r0;
  r0.code = fs::OpCode::kGetattr;
  r0.attr.ino = 1;
  r0.attr.generation = 1;
  r0.attr.type = fs::FileType::kDirectory;
  r0.attr.nlink = 2;
  ok.results.push_back(r0);
  send_msg(c1, relay::Final{t1, relay::FinalStatus::kCommitted, fs::encode_result(ok)});
  REQUIRE(res.wait_count(1));
  REQUIRE(res.finals[0].first == 1);
  REQUIRE(res.finals[0].second.status == client::FinalStatus::kCommitted);
  REQUIRE(res.finals[0].second.result == ok);
  backend.cancel(t3);
  REQUIRE(std::get<relay::Cancel>(read_msg(c1, sp1)).tag == t3);

  // The relay restarts: the second request (no FINAL, not cancelled) is sent again, and only it.
  c1.reset();
  UniqueFd c2 = accept_one(l);
  relay::FrameSplitter sp2;
  REQUIRE(std::holds_alternative<relay::Hello>(read_msg(c2, sp2)));
  send_msg(c2, relay::HelloOk{relay::kRelayWireVersion, 7, 4, 1});
  const auto again = std::get<relay::Submit>(read_msg(c2, sp2));
  REQUIRE(again.tag == t2);
  const std::uint64_t t4 = backend.submit(getattr_root(), client::SubmitOptions{}, res.callbacks_for(4));
  REQUIRE(std::get<relay::Submit>(read_msg(c2, sp2)).tag == t4);
  // A refusal reaches the caller as such; a FINAL for a cancelled tag is ignored.
  const std::string reason = "too large";
  send_msg(c2, relay::Final{t3, relay::FinalStatus::kCommitted, fs::encode_result(ok)});
  send_msg(c2, relay::Final{t2, relay::FinalStatus::kRefused, Bytes(reason.begin(), reason.end())});
  send_msg(c2, relay::Final{t4, relay::FinalStatus::kCommitted, fs::encode_result(ok)});
  REQUIRE(res.wait_count(3));
  REQUIRE(res.finals.size() == 3);
  REQUIRE(res.finals[1].first == 2);
  REQUIRE(res.finals[1].second.status == client::FinalStatus::kRefused);
  REQUIRE(res.finals[1].second.reason == reason);
  REQUIRE(res.finals[2].first == 4);
  REQUIRE(backend.connected());
}

TEST_CASE("relay backend: a relay that is not there yet is retried until it appears", "[client][relay]") {
  testing::TempDir dir;
  const std::string path = dir.path + "/relay.sock";
  client::RelayBackend backend(path);  // nothing listens yet
  Results res;
  const std::uint64_t t = backend.submit(getattr_root(), client::SubmitOptions{}, res.callbacks_for(1));
  UniqueFd l = listen_at(path);
  UniqueFd c = accept_one(l);
  relay::FrameSplitter sp;
  REQUIRE(std::holds_alternative<relay::Hello>(read_msg(c, sp)));
  send_msg(c, relay::HelloOk{relay::kRelayWireVersion, 7, 4, 1});
  REQUIRE(std::get<relay::Submit>(read_msg(c, sp)).tag == t);
}
