// The TCP transport on real loopback sockets, two nodes on one event loop: authentication binds a client to
// its connection, replies for a client that has not authenticated yet are parked and delivered, a peer that
// does not read is disconnected at the output cap, and outgoing connections come back after the peer restarts.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "common/config.h"
#include "protocol/wire.h"
#include "runtime/transport.h"
#include "services/counter_service.h"
#include "tests/unit/test_runtime_util.h"

using namespace bftfs;
using namespace bftfs::testing;

namespace {

struct Keys {
  TempDir dir;
  std::string conf;
  ClusterConfig config;
  std::uint16_t port = 0;
  Keys() {
    port = free_port_range(4);
    REQUIRE(generate_cluster(dir.path, 1, 4, {"127.0.0.1"}, port).empty());
    conf = dir.path + "/cluster.conf";
    REQUIRE(load_cluster(conf, config).empty());
  }
  std::unique_ptr<Crypto> crypto(NodeId id) const {
    SecretKeys s;
    REQUIRE(load_secret(secret_path_for(conf, id), s).empty());
    return make_crypto(config, id, s);
  }
};

Reply reply_for(NodeId client, std::uint64_t rid, std::size_t result_bytes = 8) {
  Reply r;
  r.client = client;
  r.request_id = rid;
  r.flags = kReplyHasResult;
  r.result = Bytes(result_bytes, 7);
  r.result_digest = digest_of(r.result);
  return r;
}

// A plain TCP socket connected to replica 0's address: a peer that speaks raw bytes. `rcvbuf` > 0 shrinks its
// receive buffer first.
int raw_connect(const Keys& k, int rcvbuf = 0) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  if (rcvbuf > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(k.config.replicas[0].port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

Request request_from(NodeId client, std::uint64_t rid, std::uint32_t n) {
  Request q;
  q.client = client;
  q.request_id = rid;
  q.op = counter_read_op();
  q.authenticator.resize(n);
  return q;
}

// Replica 0's transport listening on its address, recording what it receives.
struct Server {
  Keys k;
  EventBasePtr base = make_event_base();
  std::unique_ptr<Crypto> crypto = k.crypto(0);
  std::vector<std::pair<NodeId, Message>> received;
  Transport transport{base.get(), 4, *crypto, TransportOptions{},
                      [this](NodeId from, Message&& m) { received.emplace_back(from, std::move(m)); }};
  Server() { REQUIRE(transport.listen(k.config.replicas[0]).empty()); }
  // Connects a client transport with send_hello and waits until its hello has bound the connection here.
  void connect(Transport& client) {
    const std::uint64_t hellos = transport.stats().hellos_received;
    REQUIRE(client.connect(0, k.config.replicas[0]).empty());
    REQUIRE(run_until(base.get(), [&] { return transport.stats().hellos_received == hellos + 1; }, 5000));
  }
};

}  // namespace

TEST_CASE("transport: a reply for a client that has not authenticated yet is parked, then delivered",
          "[runtime][transport]") {
  Keys k;
  EventBasePtr base = make_event_base();
  auto c0 = k.crypto(0);
  auto c4 = k.crypto(4);
  std::vector<std::pair<NodeId, Message>> at_server;
  std::vector<std::pair<NodeId, Message>> at_client;
  Transport server(base.get(), 4, *c0, TransportOptions{},
                   [&](NodeId from, Message&& m) { at_server.emplace_back(from, std::move(m)); });
  REQUIRE(server.listen(k.config.replicas[0]).empty());

  // Nothing knows client 4 yet: the reply waits.
  server.send(Send{4, reply_for(4, 1)});
  CHECK(server.stats().frames_parked == 1);
  CHECK(server.stats().sends_dropped_no_connection == 0);

  TransportOptions no_hello;  // the client authenticates with its first request instead
  Transport client(base.get(), 4, *c4, no_hello,
                   [&](NodeId from, Message&& m) { at_client.emplace_back(from, std::move(m)); });
  REQUIRE(client.connect(0, k.config.replicas[0]).empty());
  client.send(Send{0, request_from(4, 1, 4)});
  REQUIRE(run_until(base.get(), [&] { return !at_client.empty(); }, 5000));
  REQUIRE(at_server.size() == 1);
  CHECK(at_server[0].first == 4);
  CHECK(at_client[0].first == 0);
  CHECK(std::get<Reply>(at_client[0].second).request_id == 1);
  CHECK(server.stats().parked_delivered == 1);
}

TEST_CASE("transport: a client's hello binds its connection and is not delivered", "[runtime][transport]") {
  Keys k;
  EventBasePtr base = make_event_base();
  auto c0 = k.crypto(0);
  auto c5 = k.crypto(5);
  int delivered_to_server = 0;
  std::vector<Message> at_client;
  Transport server(base.get(), 4, *c0, TransportOptions{}, [&](NodeId, Message&&) { ++delivered_to_server; });
  REQUIRE(server.listen(k.config.replicas[0]).empty());
  TransportOptions hello;
  hello.send_hello = true;
  Transport client(base.get(), 4, *c5, hello, [&](NodeId, Message&& m) { at_client.push_back(std::move(m)); });
  REQUIRE(client.connect(0, k.config.replicas[0]).empty());
  REQUIRE(run_until(base.get(), [&] { return server.stats().hellos_received == 1; }, 5000));
  CHECK(delivered_to_server == 0);
  // The server can now answer client 5 without ever having received a request from it.
  server.send(Send{5, reply_for(5, 9)});
  CHECK(server.stats().frames_parked == 0);
  REQUIRE(run_until(base.get(), [&] { return !at_client.empty(); }, 5000));
  CHECK(std::get<Reply>(at_client[0]).request_id == 9);
}

TEST_CASE("transport: a peer that does not read is disconnected at the output cap", "[runtime][transport]") {
  Keys k;
  EventBasePtr base = make_event_base();
  auto c0 = k.crypto(0);
  auto c6 = k.crypto(6);
  TransportOptions small;
  small.output_bytes_max = 256u << 10;
  Transport server(base.get(), 4, *c0, small, [](NodeId, Message&&) {});
  REQUIRE(server.listen(k.config.replicas[0]).empty());

  // A raw client: authenticates with one request, then never reads.
  const int fd = raw_connect(k, 4096);
  const Bytes frame = encode_frame(request_from(6, 1, 4), 6, 0, *c6);
  REQUIRE(::write(fd, frame.data(), frame.size()) == static_cast<ssize_t>(frame.size()));
  REQUIRE(run_until(base.get(), [&] { return server.stats().frames_received == 1; }, 5000));

  for (int i = 0; i < 2000 && server.stats().closed_slow_peer == 0; ++i) {
    server.send(Send{6, reply_for(6, static_cast<std::uint64_t>(i), 16u << 10)});
    event_base_loop(base.get(), EVLOOP_NONBLOCK);  // let the kernel take what it will
  }
  CHECK(server.stats().closed_slow_peer == 1);
  ::close(fd);
}

TEST_CASE("transport: an outgoing connection comes back after the peer restarts", "[runtime][transport]") {
  Keys k;
  EventBasePtr base = make_event_base();
  auto c0 = k.crypto(0);
  auto c1 = k.crypto(1);
  std::vector<Message> at_1;
  TransportOptions fast;
  fast.reconnect_ms_min = 2;
  fast.reconnect_ms_max = 20;
  Transport sender(base.get(), 4, *c0, fast, [](NodeId, Message&&) {});
  REQUIRE(sender.connect(1, k.config.replicas[1]).empty());
  // Replica 1 is not up yet: the connection attempts fail and are retried with backoff.
  run_until(base.get(), [] { return false; }, 30);
  CHECK_FALSE(sender.connected(1));
  CHECK(sender.stats().connects_started >= 2);
  {
    auto receiver = std::make_unique<Transport>(base.get(), 4, *c1, TransportOptions{},
                                                [&](NodeId, Message&& m) { at_1.push_back(std::move(m)); });
    REQUIRE(receiver->listen(k.config.replicas[1]).empty());
    REQUIRE(run_until(base.get(), [&] { return sender.connected(1); }, 5000));
    Checkpoint cp;
    cp.seq = 7;
    sender.send(Send{1, cp});
    REQUIRE(run_until(base.get(), [&] { return at_1.size() == 1; }, 5000));
  }
  // The receiver went away (its sockets closed); the sender notices and reconnects to its successor.
  REQUIRE(run_until(base.get(), [&] { return !sender.connected(1); }, 5000));
  auto again = std::make_unique<Transport>(base.get(), 4, *c1, TransportOptions{},
                                           [&](NodeId, Message&& m) { at_1.push_back(std::move(m)); });
  REQUIRE(again->listen(k.config.replicas[1]).empty());
  REQUIRE(run_until(base.get(), [&] { return sender.connected(1); }, 5000));
  Checkpoint cp;
  cp.seq = 8;
  sender.send(Send{1, cp});
  REQUIRE(run_until(base.get(), [&] { return at_1.size() == 2; }, 5000));
  CHECK(std::get<Checkpoint>(at_1[1]).seq == 8);
}

TEST_CASE("transport: a frame far over libevent's 4 KiB read arrives whole, read in few system calls",
          "[runtime][transport]") {
  Server srv;
  auto c5 = srv.k.crypto(5);
  std::vector<Message> at_client;
  TransportOptions hello;
  hello.send_hello = true;
  Transport client(srv.base.get(), 4, *c5, hello, [&](NodeId, Message&& m) { at_client.push_back(std::move(m)); });
  srv.connect(client);

  Reply big = reply_for(5, 1, 1u << 20);
  for (std::size_t i = 0; i < big.result.size(); ++i) big.result[i] = static_cast<std::uint8_t>(i * 31 + 7);
  big.result_digest = digest_of(big.result);
  srv.transport.send(Send{5, big});
  srv.transport.send(Send{5, reply_for(5, 2)});
  REQUIRE(run_until(srv.base.get(), [&] { return at_client.size() == 2; }, 10000));
  const Reply& got = std::get<Reply>(at_client[0]);
  CHECK(got.request_id == 1);
  CHECK(got.result == big.result);
  CHECK(std::get<Reply>(at_client[1]).request_id == 2);
  CHECK(client.stats().frames_rejected == 0);
  // libevent alone takes 4 KiB per readiness event: 256 events for this frame. Reading on past its 4 KiB
  // (Transport::read_socket) needs a few readv calls per 64 KiB chunk the kernel holds at a time.
  CHECK(client.stats().direct_reads >= 1);
  CHECK(client.stats().direct_reads < 128);
}

TEST_CASE("transport: a frame that arrives in pieces, then the peer's close, are both seen", "[runtime][transport]") {
  Server srv;
  auto c6 = srv.k.crypto(6);
  const int fd = raw_connect(srv.k);
  Request q = request_from(6, 1, 4);
  q.op = Bytes(20000, 3);  // a 20 KB request: a partial first piece, then more than libevent's 4 KiB at once
  const Bytes frame = encode_frame(q, 6, 0, *c6);
  const std::size_t first = 4096 + 100;
  REQUIRE(::write(fd, frame.data(), first) == static_cast<ssize_t>(first));
  run_until(srv.base.get(), [] { return false; }, 30);
  CHECK(srv.received.empty());
  REQUIRE(::write(fd, frame.data() + first, frame.size() - first) == static_cast<ssize_t>(frame.size() - first));
  ::close(fd);
  REQUIRE(run_until(
      srv.base.get(), [&] { return srv.received.size() == 1 && srv.transport.stats().connections_closed == 1; },
      5000));
  CHECK(srv.received[0].first == 6);
  CHECK(std::get<Request>(srv.received[0].second).op == q.op);
}

TEST_CASE("transport: with cork_reads, what the callbacks of one read send leaves in one write",
          "[runtime][transport]") {
  Server srv;
  auto c5 = srv.k.crypto(5);
  TransportOptions opts;
  opts.send_hello = true;
  opts.cork_reads = true;
  Transport* client_ptr = nullptr;
  Transport client(srv.base.get(), 4, *c5, opts, [&](NodeId, Message&& m) {
    // Every reply is answered at once with the next request, as a closed-loop client does.
    client_ptr->send(Send{0, request_from(5, std::get<Reply>(m).request_id + 100, 4)});
  });
  client_ptr = &client;
  srv.connect(client);
  const std::uint64_t writes_before = client.stats().direct_writes;
  // Three replies in one write of the server: one read at the client.
  srv.transport.cork();
  for (std::uint64_t rid = 1; rid <= 3; ++rid) srv.transport.send(Send{5, reply_for(5, rid)});
  srv.transport.uncork();
  REQUIRE(run_until(srv.base.get(), [&] { return srv.received.size() == 3; }, 5000));
  CHECK(client.stats().direct_writes - writes_before == 1);
  CHECK(client.stats().corked_frames == 2);
  for (std::size_t i = 0; i < 3; ++i) CHECK(std::get<Request>(srv.received[i].second).request_id == 101 + i);
}
