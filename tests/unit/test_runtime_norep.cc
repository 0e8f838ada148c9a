// The runtime's transport and NO-REP server on real loopback sockets: requests are answered, garbage closes
// the connection that sent it, unauthenticated frames are dropped and counted, and the durable mode replays
// its log after a restart.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <thread>

#include "common/config.h"
#include "common/log.h"
#include "protocol/wire.h"
#include "runtime/client_runtime.h"
#include "storage/file_snapshot_store.h"
#include "norep/norep_server.h"
#include "runtime/status_file.h"
#include "services/counter_service.h"
#include "tests/unit/test_runtime_util.h"

using namespace bftfs;
using namespace bftfs::testing;

namespace {

struct NorepFixture {
  TempDir dir;
  std::string conf;
  std::uint16_t port = 0;
  std::unique_ptr<NorepServer> server;
  std::thread thread;

  explicit NorepFixture(bool durable = false) {
    port = free_port_range(4);
    REQUIRE(generate_cluster(dir.path, 1, 4, {"127.0.0.1"}, port).empty());
    conf = dir.path + "/cluster.conf";
    start(durable);
  }
  void start(bool durable) {
    NorepOptions o;
    o.config_path = conf;
    o.data_dir = dir.path + "/norep";
    o.durable = durable;
    const std::string err = NorepServer::create(o, server);
    INFO(err);
    REQUIRE(err.empty());
    thread = std::thread([this] { server->run(); });
  }
  void stop() {
    server->stop();
    thread.join();
    server.reset();
  }
  ~NorepFixture() {
    if (server) stop();
  }
};

// Increments the counter `count` times through `client` and returns the values seen.
std::vector<std::uint64_t> increments(event_base* base, SubmitClient& client, int count) {
  std::vector<std::uint64_t> values;
  std::uint64_t token = counter_initial_token(client.id());
  std::function<void()> next;
  bool failed = false;
  next = [&] {
    client.submit(counter_increment_op(token), false, [&](const Completion& c) {
      CounterResult r;
      if (!parse_counter_result(c.result, r)) {
        failed = true;
        return;
      }
      if (r.status == 1) {  // resynchronize after a previous incarnation of this client id
        token = r.next_token;
        next();
        return;
      }
      values.push_back(r.value);
      token = r.next_token;
      if (static_cast<int>(values.size()) < count) next();
    });
  };
  next();
  REQUIRE(run_until(base, [&] { return failed || static_cast<int>(values.size()) >= count; }, 10000));
  REQUIRE_FALSE(failed);
  return values;
}

int connect_raw(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

}  // namespace

TEST_CASE("norep: a direct client's sequential increments are each executed once", "[runtime][norep]") {
  NorepFixture f;
  EventBasePtr base = make_event_base();
  std::unique_ptr<DirectClient> client;
  REQUIRE(DirectClient::create(base.get(), f.conf, 4, ReplicaAddress{}, client).empty());
  const auto values = increments(base.get(), *client, 100);
  REQUIRE(values.size() == 100);
  for (std::size_t i = 0; i < values.size(); ++i) CHECK(values[i] == i + 1);
  CHECK(f.server->executed() == 100);
}

TEST_CASE("norep: garbage closes the connection that sent it; the server keeps serving", "[runtime][norep]") {
  NorepFixture f;
  const int fd = connect_raw(f.port);
  Bytes garbage(kHeaderBytes, 0x5A);
  REQUIRE(::write(fd, garbage.data(), garbage.size()) == static_cast<ssize_t>(garbage.size()));
  char buf[16];
  CHECK(::read(fd, buf, sizeof buf) == 0);  // closed by the server: EOF, not a timeout
  ::close(fd);

  EventBasePtr base = make_event_base();
  std::unique_ptr<DirectClient> client;
  REQUIRE(DirectClient::create(base.get(), f.conf, 5, ReplicaAddress{}, client).empty());
  CHECK(increments(base.get(), *client, 3).size() == 3);
}

TEST_CASE("norep: frames with a bad MAC are dropped, and too many close the connection", "[runtime][norep]") {
  NorepFixture f;
  // A well-formed request from client 4, sealed with the keys of another client (6) claiming to be 4.
  ClusterConfig config;
  REQUIRE(load_cluster(f.conf, config).empty());
  SecretKeys wrong;
  REQUIRE(load_secret(secret_path_for(f.conf, 6), wrong).empty());
  auto crypto6 = make_crypto(config, 6, wrong);
  Request r;
  r.client = 6;
  r.request_id = 1;
  r.op = counter_read_op();
  r.authenticator.resize(config.n);
  Bytes frame = encode_frame(r, 6, 0, *crypto6);
  frame[8] = 4;  // sender field: now claims to be client 4; the MAC no longer verifies
  const int fd = connect_raw(f.port);
  // Well under rejects_max: the connection stays open and nothing executes.
  for (int i = 0; i < 10; ++i) REQUIRE(::write(fd, frame.data(), frame.size()) == static_cast<ssize_t>(frame.size()));
  // Then past it: the server closes the connection.
  for (int i = 0; i < 100; ++i) {
    if (::write(fd, frame.data(), frame.size()) != static_cast<ssize_t>(frame.size())) break;
  }
  char buf[16];
  CHECK(::read(fd, buf, sizeof buf) <= 0);
  ::close(fd);
  CHECK(f.server->executed() == 0);
}

TEST_CASE("norep: the durable mode replays its log after a restart", "[runtime][norep]") {
  NorepFixture f(/*durable=*/true);
  {
    EventBasePtr base = make_event_base();
    std::unique_ptr<DirectClient> client;
    REQUIRE(DirectClient::create(base.get(), f.conf, 4, ReplicaAddress{}, client).empty());
    CHECK(increments(base.get(), *client, 20).back() == 20);
  }
  f.stop();
  f.start(true);
  EventBasePtr base = make_event_base();
  std::unique_ptr<DirectClient> client;
  REQUIRE(DirectClient::create(base.get(), f.conf, 4, ReplicaAddress{}, client).empty());
  // The counter continues from 20, and the client's token survived too (no resynchronization needed).
  const auto v = increments(base.get(), *client, 5);
  CHECK(v.front() == 21);
  CHECK(v.back() == 25);
}

TEST_CASE("file snapshot store: put replaces atomically and get reads back", "[runtime]") {
  TempDir t;
  std::unique_ptr<FileSnapshotStore> s;
  REQUIRE(FileSnapshotStore::open(t.path + "/snap", s).empty());
  Bytes out;
  CHECK_FALSE(s->get("state", out));
  s->put("state", Bytes{1, 2, 3});
  s->put("state", Bytes{4, 5});
  REQUIRE(s->get("state", out));
  CHECK(out == Bytes{4, 5});
  // A second store on the same directory (a restart) sees the same bytes.
  std::unique_ptr<FileSnapshotStore> again;
  REQUIRE(FileSnapshotStore::open(t.path + "/snap", again).empty());
  REQUIRE(again->get("state", out));
  CHECK(out == Bytes{4, 5});
}

TEST_CASE("a data directory is used by one daemon at a time", "[runtime]") {
  NorepFixture f;
  NorepOptions o;
  o.config_path = f.conf;
  o.data_dir = f.dir.path + "/norep";  // the fixture's server holds it
  std::unique_ptr<NorepServer> second;
  const std::string err = NorepServer::create(o, second);
  CHECK(second == nullptr);
  CHECK_THAT(err, Catch::Contains("in use"));
}

TEST_CASE("status files round trip through the flat reader, nested groups included", "[runtime]") {
  TempDir t;
  JsonObject stats;
  stats.add("requests_executed", std::uint64_t{42}).add("ratio", 0.5);
  JsonObject o;
  o.add("role", "replica").add("running", true).add("view", std::uint64_t{3}).add("note", "a \"quoted\" \\ text")
      .add("stats", stats).add("last", std::int64_t{-1});
  const std::string path = t.path + "/status.json";
  REQUIRE(write_file_atomically(path, o.str() + "\n").empty());
  std::map<std::string, std::string> m;
  REQUIRE(read_status_file(path, m).empty());
  CHECK(m["role"] == "replica");
  CHECK(m["running"] == "true");
  CHECK(m["view"] == "3");
  CHECK(m["note"] == "a \"quoted\" \\ text");
  CHECK(m["requests_executed"] == "42");
  CHECK(m["ratio"] == "0.500");
  CHECK(m["last"] == "-1");
  std::map<std::string, std::string> none;
  CHECK_FALSE(read_status_file(t.path + "/missing.json", none).empty());
}

TEST_CASE("norep: clients of one event base share a connection, and each keeps working as others come and go",
          "[runtime][norep]") {
  NorepFixture f;
  EventBasePtr base = make_event_base();
  std::unique_ptr<DirectClient> a;
  std::unique_ptr<DirectClient> b;
  REQUIRE(DirectClient::create(base.get(), f.conf, 4, ReplicaAddress{}, a).empty());
  REQUIRE(DirectClient::create(base.get(), f.conf, 5, ReplicaAddress{}, b).empty());
  CHECK(increments(base.get(), *a, 3).size() == 3);
  CHECK(increments(base.get(), *b, 3).size() == 3);
  a.reset();  // the transport's first identity goes; the connection stays for b
  CHECK(increments(base.get(), *b, 3).back() == 9);  // one counter for all clients
  REQUIRE(DirectClient::create(base.get(), f.conf, 6, ReplicaAddress{}, a).empty());  // joins b's connection
  CHECK(increments(base.get(), *a, 2).size() == 2);
  a.reset();
  b.reset();  // the last one: the connection closes, and the server forgets every client bound to it
  std::unique_ptr<DirectClient> c;
  REQUIRE(DirectClient::create(base.get(), f.conf, 5, ReplicaAddress{}, c).empty());
  CHECK(increments(base.get(), *c, 2).back() == 13);
}
