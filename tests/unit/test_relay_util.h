// Helpers shared by the relay daemon tests (tests/unit/test_relay_daemon.cc, test_relay_dependencies.cc): a
// relay (relay/relay_daemon.h) in front of an in-process NO-REP file server or of four in-process replicas
// running the file service behind the shim, and a blocking mount-side connection to its Unix socket.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <array>
#include <chrono>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <thread>

#include "common/config.h"
#include "norep/norep_server.h"
#include "os/unique_fd.h"
#include "relay/relay_daemon.h"
#include "relay/relay_wire.h"
#include "replica/replica_runtime.h"
#include "services/fs/fs_codec.h"
#include "services/fs/fs_service.h"
#include "tests/unit/test_runtime_util.h"

namespace bftfs::testing {

// Adjusts the relay's options before it starts (a test's limits).
using RelayTweak = std::function<void(RelayOptions&)>;

// Starts `relay` for `conf` and `client_id` on `sock` and runs it in `thread`.
inline void start_relay(const std::string& conf, NodeId client_id, const std::string& sock, bool norep,
                        const RelayTweak& tweak, std::unique_ptr<RelayDaemon>& relay, std::thread& thread) {
  RelayOptions ro;
  ro.config_path = conf;
  ro.id = client_id;
  ro.socket_path = sock;
  ro.norep = norep;
  if (tweak) tweak(ro);
  const std::string err = RelayDaemon::create(ro, relay);
  INFO(err);
  REQUIRE(err.empty());
  RelayDaemon* r = relay.get();
  thread = std::thread([r] { r->run(); });
}

// A relay in NO-REP mode in front of an in-process NO-REP file server (FIRST and FINAL carry the server's one
// reply).
struct RelayFixture {
  TempDir dir;
  std::string conf;
  std::string sock;
  std::unique_ptr<NorepServer> server;
  std::unique_ptr<RelayDaemon> relay;
  std::thread server_thread;
  std::thread relay_thread;
  NodeId client_id = 0;

  explicit RelayFixture(const RelayTweak& tweak = {}) {
    const std::uint16_t port = free_port_range(4);
    REQUIRE(generate_cluster(dir.path, 1, 2, {"127.0.0.1"}, port).empty());
    conf = dir.path + "/cluster.conf";
    ClusterConfig config;
    REQUIRE(load_cluster(conf, config).empty());
    client_id = config.clients.back();
    NorepOptions no;
    no.config_path = conf;
    no.data_dir = dir.path + "/norep";
    no.service = "fs";
    std::string err = NorepServer::create(no, server);
    INFO(err);
    REQUIRE(err.empty());
    server_thread = std::thread([this] { server->run(); });
    sock = dir.path + "/relay.sock";
    start_relay(conf, client_id, sock, true, tweak, relay, relay_thread);
  }
  ~RelayFixture() {
    relay->stop();
    relay_thread.join();
    relay.reset();
    server->stop();
    server_thread.join();
  }
};

// A relay in front of four in-process replicas (one thread each, loopback TCP, no fsync) running the file
// service behind the shim, with early replies. With `corrupt_early_ppm` = 1000000 the primary lies in every
// early reply (a wrong result with a matching digest: only the consensus shows it).
struct PbftRelayFixture {
  TempDir dir;
  std::string conf;
  std::string sock;
  std::array<std::unique_ptr<ReplicaRuntime>, 4> replicas;
  std::array<std::thread, 4> replica_threads;
  std::unique_ptr<RelayDaemon> relay;
  std::thread relay_thread;
  NodeId client_id = 0;

  explicit PbftRelayFixture(std::uint32_t corrupt_early_ppm, const RelayTweak& tweak = {}) {
    const std::uint16_t port = free_port_range(4);
    REQUIRE(generate_cluster(dir.path, 1, 2, {"127.0.0.1"}, port).empty());
    conf = dir.path + "/cluster.conf";
    ClusterConfig config;
    REQUIRE(load_cluster(conf, config).empty());
    client_id = config.clients.back();
    for (NodeId i = 0; i < 4; ++i) {
      ReplicaRuntimeOptions o;
      o.config_path = conf;
      o.id = i;
      o.data_dir = dir.path + "/r" + std::to_string(i);
      o.service = "fs";
      o.shim = true;
      o.core.early_replies = true;
      o.corrupt_early_replies_ppm = corrupt_early_ppm;
      o.wal.fsync = false;
      const std::string err = ReplicaRuntime::create(o, replicas[i]);
      INFO(err);
      REQUIRE(err.empty());
      ReplicaRuntime* rt = replicas[i].get();
      replica_threads[i] = std::thread([rt] { rt->run(); });
    }
    sock = dir.path + "/relay.sock";
    start_relay(conf, client_id, sock, false, tweak, relay, relay_thread);
  }
  ~PbftRelayFixture() {
    relay->stop();
    relay_thread.join();
    relay.reset();
    for (NodeId i = 0; i < 4; ++i) {
      replicas[i]->stop();
      replica_threads[i].join();
      replicas[i].reset();
    }
  }
};

// A blocking mount-side connection with a deadline on every read.
class Mount {
 public:
  explicit Mount(const std::string& path) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    REQUIRE(path.size() < sizeof addr.sun_path);
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    fd_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    REQUIRE(fd_.valid());
    REQUIRE(::connect(fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  }
  // Sends several frames in one write, so the relay reads them in one go.
  void send(std::initializer_list<relay::MountMsg> msgs) {
    Bytes all;
    for (const auto& m : msgs) {
      const Bytes f = relay::encode_relay_frame(m);
      all.insert(all.end(), f.begin(), f.end());
    }
    send_raw(all);
  }
  void send_raw(const Bytes& bytes) {
    REQUIRE(::send(fd_.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size()));
  }
  // The next frame; false when the relay closed the connection (or nothing came within the timeout).
  bool receive(relay::RelayMsg& out, int timeout_ms = 10000) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      Bytes body;
      relay::RelayWireError why = relay::RelayWireError::kOk;
      const auto next = splitter_.next(body, why);
      REQUIRE(next != relay::FrameSplitter::Next::kBroken);
      if (next == relay::FrameSplitter::Next::kFrame) {
        REQUIRE(relay::decode_relay_body(body, out) == relay::RelayWireError::kOk);
        return true;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd pfd{fd_.get(), POLLIN, 0};
      if (::poll(&pfd, 1, static_cast<int>(left.count())) <= 0) continue;
      std::uint8_t buf[65536];
      const ssize_t n = ::recv(fd_.get(), buf, sizeof buf, 0);
      if (n <= 0) return false;
      splitter_.append(std::span<const std::uint8_t>(buf, static_cast<std::size_t>(n)));
    }
  }
  relay::HelloOk hello() {
    send({relay::Hello{}});
    relay::RelayMsg m;
    REQUIRE(receive(m));
    REQUIRE(std::holds_alternative<relay::HelloOk>(m));
    return std::get<relay::HelloOk>(m);
  }

 private:
  UniqueFd fd_;
  relay::FrameSplitter splitter_;
};

inline fs::Op root_op(fs::OpCode code) {
  fs::Op op;
  op.code = code;
  op.handle = fs::Handle::of(fs::kRootIno, 1);
  return op;
}

inline Bytes getattr_root() { return fs::encode_request(fs::Request{{root_op(fs::OpCode::kGetattr)}}); }

inline Bytes mkdir_root(const std::string& name) {
  fs::Op op = root_op(fs::OpCode::kMkdir);
  op.name = name;
  op.mode = 0755;
  return fs::encode_request(fs::Request{{op}});
}

inline Bytes lookup_root(const std::string& name) {
  fs::Op op = root_op(fs::OpCode::kLookup);
  op.name = name;
  return fs::encode_request(fs::Request{{op}});
}

inline fs::Result decoded(const Bytes& b) {
  fs::Result r;
  REQUIRE(fs::decode_result(b, r) == fs::FsDecodeError::kOk);
  return r;
}

}  // namespace bftfs::testing
