// The mount daemon's end of the control protocol (client/control_server.h), driven through a real Unix socket by
// the supervisor's own client (criu-hooks/control_client.h) and, for what that client never sends, by raw frames:
// replies to requests, ATTACH's descriptor, events from other threads, the transport's rules (HELLO first, a
// descriptor only with ATTACH, frames that decode), the socket file's life, and the shutdown.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "client/control_server.h"
#include "criu-hooks/control_client.h"
#include "os/unique_fd.h"
#include "spec/control_wire.h"
#include "test_runtime_util.h"

using namespace bftfs;
using namespace bftfs::client;
namespace sp = bftfs::spec;

namespace {

// What the fake sessions of one server saw. Shared by the test and every session (they run on the connections'
// threads).
struct Record {
  std::mutex mu;
  std::vector<sp::ControlType> requests;
  std::vector<bool> fd_valid;  // per request: did a valid descriptor come with it
  UniqueFd attached;           // the descriptor of the last ATTACH that had one
  EventSink sink;              // the last session's
  std::atomic<int> made{0};
  std::atomic<int> destroyed{0};
  std::atomic<int> ticks{0};
  std::atomic<int> interrupted{0};
  // PREPARE blocks in handle() until released or interrupted (the shutdown test).
  bool block_prepare = false;
  bool released = false;
  std::condition_variable cv;
  // Events pushed from inside handle(PREPARE), before its reply.
  int events_in_prepare = 0;

  std::vector<sp::ControlType> seen() {
    std::lock_guard lock(mu);
    return requests;
  }
};

class FakeSession : public ControlSession {
 public:
  FakeSession(Record& r, EventSink sink) : r_(r) {
    std::lock_guard lock(r_.mu);
    r_.sink = std::move(sink);
    r_.made++;
  }
  ~FakeSession() override { r_.destroyed++; }

  std::optional<sp::DaemonMsg> handle(const sp::SupervisorMsg& m, UniqueFd fuse) override {
    const sp::ControlType t = sp::control_type(m);
    {
      std::lock_guard lock(r_.mu);
      r_.requests.push_back(t);
      r_.fd_valid.push_back(fuse.valid());
      if (fuse.valid()) r_.attached = std::move(fuse);
    }
    switch (t) {
      case sp::ControlType::kHello: return sp::HelloOk{sp::kControlWireVersion, 7, "", "/.bftfs-run/1", 1};
      case sp::ControlType::kAttach: return sp::Attached{};
      case sp::ControlType::kPrepare: return prepare(std::get<sp::Prepare>(m));
      case sp::ControlType::kSeal: return sp::Sealed{std::get<sp::Seal>(m).epoch, 3, 0, 0, 100};
      case sp::ControlType::kStats: return sp::StatsReply{"fake\n"};
      case sp::ControlType::kDetach: return sp::Detached{};
      default: return std::nullopt;  // ABORT, FINISH (the tests send nothing else)
    }
  }
  void tick() override { r_.ticks++; }
  void interrupt() override {
    std::lock_guard lock(r_.mu);
    r_.interrupted++;
    r_.released = true;
    r_.cv.notify_all();
  }

 private:
  sp::DaemonMsg prepare(const sp::Prepare& p) {
    EventSink sink;
    {
      std::unique_lock lock(r_.mu);
      sink = r_.sink;
      if (r_.block_prepare) r_.cv.wait(lock, [&] { return r_.released; });
    }
    for (int i = 0; i < r_.events_in_prepare; i++) sink(sp::Advice{sp::AdviceKind::kHideTarget, p.epoch + i});
    return sp::Prepared{true, ""};
  }
  Record& r_;
};

// A temporary directory for the socket, removed with what is left in it.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/bftfs-ctl-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    ::unlink((path + "/ctl.sock").c_str());
    ::rmdir(path.c_str());
  }
  std::string sock() const { return path + "/ctl.sock"; }
};

ControlServer::Factory factory_for(Record& r) {
  return [&r](EventSink sink) { return std::make_unique<FakeSession>(r, std::move(sink)); };
}

// Polls `pred` until it holds or 10 s pass (the things waited for happen within milliseconds).
bool eventually(const std::function<bool()>& pred) { return bftfs::testing::wait_until(pred, 10000); }

std::unique_ptr<criu::ControlClient> connect_client(const std::string& path) {
  std::unique_ptr<criu::ControlClient> c;
  REQUIRE(criu::ControlClient::connect(path, c).empty());
  return c;
}

void hello(criu::ControlClient& c) {
  sp::DaemonMsg reply;
  REQUIRE(c.call(sp::Hello{}, sp::ControlType::kHelloOk, reply).empty());
  CHECK(std::get<sp::HelloOk>(reply).run_dir == "/.bftfs-run/1");
}

// The next event the client gets (waiting for it), or nullopt after 10 s.
std::optional<sp::DaemonMsg> next_event(criu::ControlClient& c) {
  sp::DaemonMsg e;
  if (!eventually([&] { return c.next_event(e) || !c.read_events().empty(); })) return std::nullopt;
  if (!c.broken().empty()) return std::nullopt;
  return e;
}

UniqueFd connect_raw(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(fd.valid());
  REQUIRE(::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  return fd;
}

// Sends `bytes` with the descriptors `fds` attached to the first byte.
void send_with_fds(int sock, const Bytes& bytes, const std::vector<int>& fds) {
  iovec iov{const_cast<std::uint8_t*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(fds.size() * sizeof(int)));
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds.data(), fds.size() * sizeof(int));
  }
  REQUIRE(::sendmsg(sock, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size()));
}

// True when the daemon closes `sock` (EOF, after reading and dropping whatever it still sent) within 10 s.
bool closed_by_daemon(int sock) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{sock, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    std::uint8_t buf[4096];
    const ssize_t n = ::recv(sock, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
  }
  return false;
}

Bytes frame_of(const sp::SupervisorMsg& m) { return sp::encode_control_frame(m); }

// The descriptors this process has open.
int open_fds() {
  DIR* d = ::opendir("/proc/self/fd");
  REQUIRE(d != nullptr);
  int n = 0;
  while (::readdir(d) != nullptr) n++;
  ::closedir(d);
  return n;
}

// The next frame the daemon sends on a raw connection, decoded (waiting up to 10 s for it).
std::optional<sp::DaemonMsg> read_frame(int sock, sp::ControlFrameSplitter& splitter) {
  for (int i = 0; i < 100; i++) {
    Bytes body;
    sp::ControlWireError why = sp::ControlWireError::kOk;
    if (splitter.next(body, why) == sp::ControlFrameSplitter::Step::kFrame) {
      sp::DaemonMsg m;
      if (sp::decode_daemon_body(body, m) != sp::ControlWireError::kOk) return std::nullopt;
      return m;
    }
    pollfd p{sock, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    std::uint8_t buf[4096];
    const ssize_t n = ::recv(sock, buf, sizeof buf, 0);
    if (n <= 0) return std::nullopt;
    splitter.append(std::span<const std::uint8_t>(buf, static_cast<std::size_t>(n)));
  }
  return std::nullopt;
}

}  // namespace

TEST_CASE("control server: HELLO and ATTACH are answered; ATTACH's descriptor arrives usable", "[client][control]") {
  TempDir dir;
  Record rec;
  std::unique_ptr<ControlServer> server;
  REQUIRE(ControlServer::start(dir.sock(), factory_for(rec), server).empty());
  auto c = connect_client(dir.sock());
  hello(*c);

  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  UniqueFd r(p[0]), w(p[1]);
  sp::DaemonMsg reply;
  REQUIRE(c->call(sp::Attach{99, true, 64}, sp::ControlType::kAttached, reply, w.get()).empty());
  w.reset();  // the session's copy is now the pipe's only write end
  {
    std::lock_guard lock(rec.mu);
    REQUIRE(rec.attached.valid());
    CHECK((::fcntl(rec.attached.get(), F_GETFD) & FD_CLOEXEC) != 0);
    REQUIRE(::write(rec.attached.get(), "x", 1) == 1);
    rec.attached.reset();
  }
  char got[2] = {};
  REQUIRE(::read(r.get(), got, sizeof got) == 1);  // then EOF: no other copy of the write end is left
  CHECK(got[0] == 'x');
  CHECK(::read(r.get(), got, sizeof got) == 0);

  // An ATTACH without a descriptor reaches the session with an invalid one (the session judges it).
  REQUIRE(c->call(sp::Attach{99, true, 64}, sp::ControlType::kAttached, reply).empty());
  CHECK(rec.seen() == std::vector{sp::ControlType::kHello, sp::ControlType::kAttach, sp::ControlType::kAttach});
  std::lock_guard lock(rec.mu);
  CHECK(rec.fd_valid == std::vector{false, true, false});
}

TEST_CASE("control server: a descriptor belongs to the frame whose first byte it came with, however the bytes "
          "arrive", "[client][control]") {
  TempDir dir;
  Record rec;
  std::unique_ptr<ControlServer> server;
  REQUIRE(ControlServer::start(dir.sock(), factory_for(rec), server).empty());
  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  UniqueFd r(p[0]), w(p[1]);
  UniqueFd s = connect_raw(dir.sock());
  sp::ControlFrameSplitter splitter;
  const Bytes attach = frame_of(sp::Attach{5, true, 16});
  SECTION("HELLO and ATTACH back to back (the daemon may read both at once)") {
    send_with_fds(s.get(), frame_of(sp::Hello{}), {});
    send_with_fds(s.get(), attach, {w.get()});
  }
  SECTION("ATTACH in two pieces, the descriptor with the first") {
    send_with_fds(s.get(), frame_of(sp::Hello{}), {});
    REQUIRE(eventually([&] { return rec.seen().size() == 1; }));
    send_with_fds(s.get(), Bytes(attach.begin(), attach.begin() + 3), {w.get()});
    // Whether the daemon reads the pieces apart or together, the descriptor is ATTACH's; the pause makes "apart"
    // the likely case, which is the one worth exercising.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    send_with_fds(s.get(), Bytes(attach.begin() + 3, attach.end()), {});
  }
  const auto hello_ok = read_frame(s.get(), splitter);
  REQUIRE(hello_ok.has_value());
  CHECK(std::holds_alternative<sp::HelloOk>(*hello_ok));
  const auto attached = read_frame(s.get(), splitter);
  REQUIRE(attached.has_value());
  CHECK(std::holds_alternative<sp::Attached>(*attached));
  std::lock_guard lock(rec.mu);
  CHECK(rec.fd_valid == std::vector{false, true});
  CHECK(rec.attached.valid());
}

TEST_CASE("control server: a descriptor that came with the middle of a frame closes the connection",
          "[client][control]") {
  TempDir dir;
  Record rec;
  std::unique_ptr<ControlServer> server;
  REQUIRE(ControlServer::start(dir.sock(), factory_for(rec), server).empty());
  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  UniqueFd r(p[0]), w(p[1]);
  UniqueFd s = connect_raw(dir.sock());
  // HELLO and ATTACH's first 3 bytes in one message: once HELLO was handled, those 3 bytes were read too.
  const Bytes attach = frame_of(sp::Attach{5, true, 16});
  Bytes first = frame_of(sp::Hello{});
  first.insert(first.end(), attach.begin(), attach.begin() + 3);
  send_with_fds(s.get(), first, {});
  REQUIRE(eventually([&] { return rec.seen().size() == 1; }));
  send_with_fds(s.get(), Bytes(attach.begin() + 3, attach.end()), {w.get()});
  CHECK(closed_by_daemon(s.get()));
  CHECK(eventually([&] { return rec.destroyed.load() == 1; }));
  CHECK(rec.seen() == std::vector{sp::ControlType::kHello});
}

TEST_CASE("control server: ABORT and FINISH have no reply; the next request's reply is the next frame",
          "[client][control]") {
  TempDir dir;
  Record rec;
  std::unique_ptr<ControlServer> server;
  REQUIRE(ControlServer::start(dir.sock(), factory_for(rec), server).empty());
  auto c = connect_client(dir.sock());
  hello(*c);
  // A reply to ABORT or FINISH would reach the client as an unasked-for reply and break it.
  REQUIRE(c->send(sp::Abort{1}).empty());
  REQUIRE(c->send(sp::Finish{sp::FinishHow::kExit, 0}).empty());
  sp::DaemonMsg reply;
  REQUIRE(c->call(sp::StatsQuery{}, sp::ControlType::kStatsReply, reply).empty());
  CHECK(std::get<sp::StatsReply>(reply).text == "fake\n");
  REQUIRE(c->call(sp::Detach{}, sp::ControlType::kDetached, reply).empty());
  CHECK(c->read_events().empty());
  CHECK(rec.seen() == std::vector{sp::ControlType::kHello, sp::ControlType::kAbort, sp::ControlType::kFinish,
                                  sp::ControlType::kStats, sp::ControlType::kDetach});
}

TEST_CASE("control server: events from other threads arrive in order, idle or before the reply they preceded",
          "[client][control]") {
  TempDir dir;
  Record rec;
  rec.events_in_prepare = 3;
  std::unique_ptr<ControlServer> server;
  REQUIRE(ControlServer::start(dir.sock(), factory_for(rec), server).empty());
  auto c = connect_client(dir.sock());
  hello(*c);
  EventSink sink;
  {
    std::lock_guard lock(rec.mu);
    sink = rec.sink;
  }
  // While no request is in progress: 1,000 events from another thread, in order.
  std::thread producer([sink] {
    for (std::uint64_t i = 1; i <= 1000; i++) sink(sp::Committed{i});
  });
  producer.join();
  for (std::uint64_t i = 1; i <= 1000; i++) {
    const auto e = next_event(*c);
    REQUIRE(e.has_value());
    REQUIRE(std::get<sp::Committed>(*e).epoch == i);
  }
  // Events pushed inside handle() are queued before the reply: the client holds them when the call returns.
  sp::DaemonMsg reply;
  REQUIRE(c->call(sp::Prepare{1, sp::Next::kSpeculative, 1000}, sp::ControlType::kPrepared, reply).empty());
  for (std::uint64_t i = 0; i < 3; i++) {
    sp::DaemonMsg e;
    REQUIRE(c->next_event(e));
    CHECK(std::get<sp::Advice>(e).epoch == 1 + i);
  }
  // The tick runs while the connection is idle.
  const int ticks = rec.ticks.load();
  CHECK(eventually([&] { return rec.ticks.load() >= ticks + 2; }));
}

TEST_CASE("control server: bytes that break the protocol close the connection and destroy its session",
          "[client][control]") {
  TempDir dir;
  Record rec;
  std::unique_ptr<ControlServer> server;
  REQUIRE(ControlServer::start(dir.sock(), factory_for(rec), server).empty());
  UniqueFd s = connect_raw(dir.sock());
  REQUIRE(eventually([&] { return rec.made.load() == 1; }));
  Bytes bytes;
  std::vector<sp::ControlType> expected = {sp::ControlType::kHello};
  SECTION("a body that does not decode") {
    bytes = frame_of(sp::Hello{});
    const Bytes bad = {2, 0, 0, 0, 77, 0};  // an unknown type
    bytes.insert(bytes.end(), bad.begin(), bad.end());
  }
  SECTION("a length of 0") {
    bytes = frame_of(sp::Hello{});
    bytes.insert(bytes.end(), {0, 0, 0, 0});
  }
  SECTION("a length beyond 64 KiB") {
    bytes = {0, 0, 2, 0, 1};
    expected.clear();
  }
  SECTION("a request before HELLO") {
    bytes = frame_of(sp::Prepare{1, sp::Next::kSpeculative, 0});
    expected.clear();
  }
  SECTION("a HELLO cut short") {
    bytes = {2, 0, 0, 0, 1, 1};  // the body ends inside the version
    expected.clear();
  }
  REQUIRE(::send(s.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size()));
  CHECK(closed_by_daemon(s.get()));
  CHECK(eventually([&] { return rec.destroyed.load() == 1; }));
  CHECK(eventually([&] { return server->live() == 0; }));
  CHECK(rec.seen() == expected);
}

TEST_CASE("control server: a descriptor with anything but ATTACH, or two at once, closes the connection",
          "[client][control]") {
  TempDir dir;
  Record rec;
  std::unique_ptr<ControlServer> server;
  REQUIRE(ControlServer::start(dir.sock(), factory_for(rec), server).empty());
  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  UniqueFd r(p[0]), w(p[1]);
  std::vector<sp::ControlType> expected = {sp::ControlType::kHello};
  SECTION("with STATS, through the supervisor's client") {
    auto c = connect_client(dir.sock());
    hello(*c);
    sp::DaemonMsg reply;
    CHECK_FALSE(c->call(sp::StatsQuery{}, sp::ControlType::kStatsReply, reply, w.get()).empty());
  }
  SECTION("with HELLO") {
    UniqueFd s = connect_raw(dir.sock());
    send_with_fds(s.get(), frame_of(sp::Hello{}), {w.get()});
    CHECK(closed_by_daemon(s.get()));
    expected.clear();
  }
  SECTION("two with ATTACH") {
    UniqueFd s = connect_raw(dir.sock());
    send_with_fds(s.get(), frame_of(sp::Hello{}), {});
    REQUIRE(eventually([&] { return rec.seen().size() == 1; }));
    send_with_fds(s.get(), frame_of(sp::Attach{1, true, 8}), {w.get(), r.get()});
    CHECK(closed_by_daemon(s.get()));
  }
  CHECK(eventually([&] { return rec.destroyed.load() == 1; }));
  CHECK(rec.seen() == expected);
  std::lock_guard lock(rec.mu);
  CHECK_FALSE(rec.attached.valid());
  // Every descriptor the daemon received was closed: the pipe's write end `w` is the only one left.
  w.reset();
  char b;
  CHECK(::read(r.get(), &b, 1) == 0);
}

TEST_CASE("control server: a supervisor that stops reading is cut off once its queue passes the bound",
          "[client][control]") {
  TempDir dir;
  Record rec;
  std::unique_ptr<ControlServer> server;
  REQUIRE(ControlServer::start(dir.sock(), factory_for(rec), server).empty());
  auto c = connect_client(dir.sock());
  hello(*c);
  EventSink sink;
  {
    std::lock_guard lock(rec.mu);
    sink = rec.sink;
  }
  // Each push returns at once (nothing reads); beyond the bound the connection closes.
  const std::size_t frame = sp::encode_control_frame(sp::DaemonMsg{sp::Waits{1, 2, 3}}).size();
  const std::size_t pushes = 2 * kControlQueueBytesMax / frame;
  for (std::size_t i = 0; i < pushes; i++) sink(sp::Waits{1, 2, 3});
  CHECK(eventually([&] { return rec.destroyed.load() == 1; }));
  sink(sp::Waits{1, 2, 3});  // after the close: dropped
}

TEST_CASE("control server: the socket is 0600; a live path is refused, a stale one replaced", "[client][control]") {
  TempDir dir;
  Record rec;
  std::unique_ptr<ControlServer> server;
  SECTION("live and stale") {
    REQUIRE(ControlServer::start(dir.sock(), factory_for(rec), server).empty());
    struct stat st{};
    REQUIRE(::lstat(dir.sock().c_str(), &st) == 0);
    CHECK(S_ISSOCK(st.st_mode));
    CHECK((st.st_mode & 07777) == 0600);
    std::unique_ptr<ControlServer> second;
    CHECK(ControlServer::start(dir.sock(), factory_for(rec), second) ==
          "another process serves the control socket " + dir.sock());
    CHECK(second == nullptr);
    // The probe's connection is one the live server saw and ended.
    CHECK(eventually([&] { return server->accepted() == 1 && server->live() == 0; }));
    server.reset();
    CHECK(::lstat(dir.sock().c_str(), &st) != 0);

    // A socket file nobody listens on (its daemon died without removing it).
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, dir.sock().c_str(), dir.sock().size() + 1);
    {
      UniqueFd dead(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
      REQUIRE(::bind(dead.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    }
    REQUIRE(::lstat(dir.sock().c_str(), &st) == 0);
    REQUIRE(ControlServer::start(dir.sock(), factory_for(rec), server).empty());
    auto c = connect_client(dir.sock());
    hello(*c);
  }
  SECTION("a path that is not a socket") {
    UniqueFd f(::open(dir.sock().c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600));
    REQUIRE(f.valid());
    CHECK(ControlServer::start(dir.sock(), factory_for(rec), server) == dir.sock() + " exists and is not a socket");
    CHECK(server == nullptr);
  }
}

TEST_CASE("control server: destroying it ends every connection, interrupts a blocked request, removes the socket",
          "[client][control]") {
  TempDir dir;
  Record rec;
  rec.block_prepare = true;
  const int fds_before = open_fds();
  std::unique_ptr<ControlServer> server;
  REQUIRE(ControlServer::start(dir.sock(), factory_for(rec), server).empty());
  auto idle = connect_client(dir.sock());
  hello(*idle);
  auto busy = connect_client(dir.sock());
  hello(*busy);
  // The second run's PREPARE blocks in handle() until the shutdown interrupts it.
  std::string busy_err;
  std::thread caller([&] {
    sp::DaemonMsg reply;
    busy_err = busy->call(sp::Prepare{1, sp::Next::kSpeculative, 0}, sp::ControlType::kPrepared, reply);
  });
  REQUIRE(eventually([&] { return rec.seen().size() == 3; }));
  CHECK(server->live() == 2);
  server.reset();
  caller.join();
  CHECK(rec.destroyed.load() == 2);
  // The busy session was interrupted (the idle one may have ended, at the server's stop signal, before).
  CHECK(rec.interrupted.load() >= 1);
  struct stat st{};
  CHECK(::lstat(dir.sock().c_str(), &st) != 0);
  // Both supervisors see the end (the busy one may have read the reply that the interrupted PREPARE gave).
  CHECK(eventually([&] { return !idle->read_events().empty(); }));
  sp::DaemonMsg reply;
  CHECK_FALSE(busy->call(sp::StatsQuery{}, sp::ControlType::kStatsReply, reply).empty());
  // The server left no descriptor behind (listener, eventfds, connections), though `rec` keeps an EventSink.
  idle.reset();
  busy.reset();
  CHECK(open_fds() == fds_before);
}

TEST_CASE("control server: a supervisor that exits ends its session; the server serves the next run",
          "[client][control]") {
  TempDir dir;
  Record rec;
  std::unique_ptr<ControlServer> server;
  REQUIRE(ControlServer::start(dir.sock(), factory_for(rec), server).empty());
  {
    auto c = connect_client(dir.sock());
    hello(*c);
    EventSink sink;
    {
      std::lock_guard lock(rec.mu);
      sink = rec.sink;
    }
    // Events still flowing while it goes away (a normal end of a run).
    std::thread producer([sink] {
      for (int i = 0; i < 10000; i++) sink(sp::Waits{1, 2, 3});
    });
    c.reset();
    producer.join();
  }
  CHECK(eventually([&] { return rec.destroyed.load() == 1 && server->live() == 0; }));
  auto next = connect_client(dir.sock());
  hello(*next);
  CHECK(rec.made.load() == 2);
  CHECK(server->accepted() == 2);
}
