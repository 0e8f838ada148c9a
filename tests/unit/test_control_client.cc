// The supervisor's end of the control connection (criu-hooks/control_client.h) against a fake daemon on the other
// end of a real socket pair, speaking the §9 codec (spec/control_wire.h): replies matched to requests, events
// queued in order whenever they arrive, a descriptor passed with ATTACH, and a connection broken for good by a
// bad frame, an unasked-for reply, FATAL or the daemon going away.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>

#include "criu-hooks/control_client.h"
#include "os/unique_fd.h"
#include "spec/control_wire.h"

using namespace bftfs;
using namespace bftfs::criu;

namespace {

// The daemon's end: reads the supervisor's frames, writes its own.
struct FakeDaemonEnd {
  UniqueFd fd;
  spec::ControlFrameSplitter splitter;

  // The next request (waiting for it), and the descriptor that came with it (or an invalid one).
  spec::SupervisorMsg request(UniqueFd* passed = nullptr) {
    for (;;) {
      Bytes body;
      spec::ControlWireError why = spec::ControlWireError::kOk;
      if (splitter.next(body, why) == spec::ControlFrameSplitter::Step::kFrame) {
        spec::SupervisorMsg m;
        REQUIRE(spec::decode_supervisor_body(body, m) == spec::ControlWireError::kOk);
        return m;
      }
      std::uint8_t buf[4096];
      iovec iov{buf, sizeof buf};
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      msg.msg_control = control;
      msg.msg_controllen = sizeof control;
      const ssize_t n = ::recvmsg(fd.get(), &msg, MSG_CMSG_CLOEXEC);
      REQUIRE(n > 0);
      if (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr && c->cmsg_type == SCM_RIGHTS) {
        int got = -1;
        std::memcpy(&got, CMSG_DATA(c), sizeof got);
        REQUIRE(passed != nullptr);
        passed->reset(got);
      }
      splitter.append(std::span<const std::uint8_t>(buf, static_cast<std::size_t>(n)));
    }
  }
  void send(const spec::DaemonMsg& m) { send_bytes(spec::encode_control_frame(m)); }
  void send_bytes(const Bytes& b) { REQUIRE(::write(fd.get(), b.data(), b.size()) == static_cast<ssize_t>(b.size())); }
};

void make_pair(std::unique_ptr<ControlClient>& client, FakeDaemonEnd& daemon) {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  client = ControlClient::adopt(UniqueFd(sv[0]));
  daemon.fd.reset(sv[1]);
}

}  // namespace

TEST_CASE("control client: replies answer requests; events arriving meanwhile are queued in order",
          "[criu_hooks][control]") {
  std::unique_ptr<ControlClient> client;
  FakeDaemonEnd daemon;
  make_pair(client, daemon);
  std::thread fake([&] {
    REQUIRE(std::holds_alternative<spec::Hello>(daemon.request()));
    // Events before the reply, split across writes mid-frame.
    Bytes both = spec::encode_control_frame(spec::DaemonMsg{spec::Waits{10, 20, 3}});
    const Bytes committed = spec::encode_control_frame(spec::DaemonMsg{spec::Committed{4}});
    both.insert(both.end(), committed.begin(), committed.end());
    daemon.send_bytes(Bytes(both.begin(), both.begin() + 7));
    daemon.send_bytes(Bytes(both.begin() + 7, both.end()));
    daemon.send(spec::HelloOk{spec::kControlWireVersion, 7, "", "/.bftfs-run/1", 1});
    UniqueFd passed;
    const auto attach = std::get<spec::Attach>(daemon.request(&passed));
    CHECK(attach.pidns_ino == 99);
    CHECK(attach.model_mb == 64);
    // The descriptor arrived: it is the same file as the one sent.
    struct stat st{};
    REQUIRE(passed.valid());
    REQUIRE(::fstat(passed.get(), &st) == 0);
    CHECK(S_ISFIFO(st.st_mode));
    daemon.send(spec::Failed{5, spec::FailCause::kEntry, "LOOKUP a"});
    daemon.send(spec::Attached{});
  });
  spec::DaemonMsg reply;
  REQUIRE(client->call(spec::Hello{}, spec::ControlType::kHelloOk, reply).empty());
  CHECK(std::get<spec::HelloOk>(reply).run_dir == "/.bftfs-run/1");
  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  UniqueFd r(p[0]), w(p[1]);
  REQUIRE(client->call(spec::Attach{99, true, 64}, spec::ControlType::kAttached, reply, r.get()).empty());
  fake.join();
  spec::DaemonMsg event;
  REQUIRE(client->next_event(event));
  CHECK(std::get<spec::Waits>(event) == spec::Waits{10, 20, 3});
  REQUIRE(client->next_event(event));
  CHECK(std::get<spec::Committed>(event).epoch == 4);
  REQUIRE(client->next_event(event));
  CHECK(std::get<spec::Failed>(event).detail == "LOOKUP a");
  CHECK_FALSE(client->next_event(event));
  // Events that arrive while nothing is awaited are read without waiting.
  daemon.send(spec::Doomed{6});
  for (int i = 0; i < 100 && !client->next_event(event); ++i) REQUIRE(client->read_events().empty());
  CHECK(std::get<spec::Doomed>(event).epoch == 6);
  CHECK(client->broken().empty());
}

TEST_CASE("control client: a bad frame, a reply nobody asked for, FATAL or a closed socket break it for good",
          "[criu_hooks][control]") {
  std::unique_ptr<ControlClient> client;
  FakeDaemonEnd daemon;
  spec::DaemonMsg reply;
  SECTION("a reply of the wrong type") {
    make_pair(client, daemon);
    daemon.send(spec::Attached{});
    CHECK(client->call(spec::Hello{}, spec::ControlType::kHelloOk, reply) == "unexpected reply 130 from the daemon");
  }
  SECTION("a reply while none is awaited") {
    make_pair(client, daemon);
    daemon.send(spec::Sealed{1, 0, 0, 0, 0});
    std::string err;
    for (int i = 0; i < 100 && err.empty(); ++i) err = client->read_events();
    CHECK(err == "unexpected reply 132 from the daemon");
  }
  SECTION("a frame that does not decode") {
    make_pair(client, daemon);
    daemon.send_bytes(Bytes{2, 0, 0, 0, 133, 1});  // COMMITTED cut short
    CHECK(client->call(spec::Hello{}, spec::ControlType::kHelloOk, reply) == "bad frame from the daemon: truncated");
  }
  SECTION("FATAL") {
    make_pair(client, daemon);
    daemon.send(spec::Fatal{"relay lost"});
    CHECK(client->call(spec::Hello{}, spec::ControlType::kHelloOk, reply) == "the daemon gave up: relay lost");
  }
  SECTION("the daemon closes the connection") {
    make_pair(client, daemon);
    daemon.fd.reset();
    // The request cannot even be sent (a broken pipe), or the reply never comes (the socket closed).
    const std::string err = client->call(spec::Hello{}, spec::ControlType::kHelloOk, reply);
    CHECK((err == "send to the daemon: Broken pipe" || err == "the daemon closed the control connection"));
  }
  SECTION("no reply in time") {
    make_pair(client, daemon);
    CHECK(client->call(spec::Hello{}, spec::ControlType::kHelloOk, reply, -1, 50) ==
          "the daemon did not answer request 1 within 50 ms");
  }
  // Every later call fails with the first reason, without touching the socket.
  const std::string first = client->broken();
  REQUIRE_FALSE(first.empty());
  CHECK(client->send(spec::Detach{}) == first);
  CHECK(client->read_events() == first);
}

TEST_CASE("control client: connecting where nobody serves says so with the errno", "[criu_hooks][control]") {
  std::unique_ptr<ControlClient> client;
  int connect_errno = 0;
  const std::string err = ControlClient::connect("/nonexistent-bftfs-dir/x.ctl", client, &connect_errno);
  CHECK(connect_errno == ENOENT);
  CHECK(err.find("No such file") != std::string::npos);
  CHECK(client == nullptr);
}
