// WAN emulation (runtime/wan.h, the delay links of runtime/transport.h): the spec's parsers accept exactly the
// documented syntax, frames between sites arrive in order and never before the delay (each direction delayed
// once), frames within a site are not delayed, the links drop past their bound, and a delayed frame for a node
// without a connection is parked as an undelayed one would be. Nothing here asserts an upper bound on time.
#include <cstring>

#include "common/config.h"
#include "protocol/wire.h"
#include "os/clock.h"
#include "runtime/transport.h"
#include "runtime/wan.h"
#include "tests/unit/test_runtime_util.h"

using namespace bftfs;
using namespace bftfs::testing;

namespace {

struct Keys {
  TempDir dir;
  std::string conf;
  ClusterConfig config;
  Keys() {
    const std::uint16_t port = free_port_range(4);
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

TransportOptions wan_options(double delay_ms, std::map<NodeId, std::uint32_t> sites = {}) {
  TransportOptions o;
  o.wan.delay_ms = delay_ms;
  o.wan.sites = std::move(sites);
  return o;
}

Checkpoint checkpoint(std::uint64_t seq) {
  Checkpoint cp;
  cp.seq = seq;
  return cp;
}

std::string delay_error(const std::string& text) {
  double d = -1;
  return parse_wan_delay_ms(text, d);
}

std::string sites_error(const std::string& text) {
  std::map<NodeId, std::uint32_t> sites;
  return parse_wan_sites(text, sites);
}

}  // namespace

TEST_CASE("wan: a delay is decimal milliseconds in [0, 10000]", "[wan]") {
  double d = -1;
  CHECK(parse_wan_delay_ms("15", d).empty());
  CHECK(d == 15);
  CHECK(parse_wan_delay_ms("2.5", d).empty());
  CHECK(d == 2.5);
  CHECK(parse_wan_delay_ms("0", d).empty());
  CHECK(d == 0);
  CHECK(parse_wan_delay_ms("10000", d).empty());
  CHECK(d == 10000);
  CHECK(parse_wan_delay_ms("0.001", d).empty());
  CHECK(d == 0.001);

  CHECK(delay_error("").find("empty") != std::string::npos);
  for (const char* bad : {"-1", "+1", "abc", "1e3", "0x10", "nan", "inf", "1.", ".5", "1.2.3", " 1", "1 ", "1ms"}) {
    INFO(bad);
    CHECK(delay_error(bad).find("is not a delay in milliseconds") != std::string::npos);
  }
  for (const char* big : {"10000.5", "10001", "99999999999999999999"}) {
    INFO(big);
    CHECK(delay_error(big).find("out of range") != std::string::npos);
  }
  d = 7;
  CHECK_FALSE(parse_wan_delay_ms("x", d).empty());
  CHECK(d == 7);  // untouched on error
}

TEST_CASE("wan: a site list is NODE=SITE items, each node once", "[wan]") {
  std::map<NodeId, std::uint32_t> sites;
  REQUIRE(parse_wan_sites("4=0", sites).empty());
  CHECK(sites == std::map<NodeId, std::uint32_t>{{4, 0}});
  REQUIRE(parse_wan_sites("4=1,5=2,0=4294967295", sites).empty());
  CHECK(sites == std::map<NodeId, std::uint32_t>{{0, 4294967295u}, {4, 1}, {5, 2}});
  CHECK(format_wan_sites(sites) == "0=4294967295,4=1,5=2");

  CHECK(sites_error("").find("empty site list") != std::string::npos);
  CHECK(sites_error("4=0,,5=1").find("empty item") != std::string::npos);
  CHECK(sites_error("4=0,").find("empty item") != std::string::npos);
  CHECK(sites_error(",4=0").find("empty item") != std::string::npos);
  CHECK(sites_error("4").find("'4': expected NODE=SITE") != std::string::npos);
  CHECK(sites_error("=0").find("missing node") != std::string::npos);
  CHECK(sites_error("4=").find("missing site") != std::string::npos);
  CHECK(sites_error("a=0").find("node 'a' is not a decimal number") != std::string::npos);
  CHECK(sites_error("4=b").find("site 'b' is not a decimal number") != std::string::npos);
  CHECK(sites_error("4=0=1").find("site '0=1' is not a decimal number") != std::string::npos);
  CHECK(sites_error(" 4=0").find("is not a decimal number") != std::string::npos);
  CHECK(sites_error("-4=0").find("is not a decimal number") != std::string::npos);
  CHECK(sites_error("4294967296=0").find("out of range") != std::string::npos);
  CHECK(sites_error("4=99999999999").find("out of range") != std::string::npos);
  CHECK(sites_error("4=0,4=0").find("node 4 is given more than once") != std::string::npos);
  CHECK(sites_error("4=0,5=1,4=1").find("node 4 is given more than once") != std::string::npos);

  sites = {{9, 9}};
  CHECK_FALSE(parse_wan_sites("4=0,x", sites).empty());
  CHECK(sites == std::map<NodeId, std::uint32_t>{{9, 9}});  // untouched on error
}

TEST_CASE("wan: every node is its own site unless placed; only different sites are delayed", "[wan]") {
  WanSpec lan;
  CHECK_FALSE(lan.enabled());
  CHECK(lan.delay_ns(0, 4) == 0);
  CHECK(lan.describe() == "LAN");

  WanSpec uniform;
  uniform.delay_ms = 2.5;
  CHECK(uniform.enabled());
  CHECK(uniform.site(4) == 4);
  CHECK(uniform.delay_ns(4, 0) == 2500000);
  CHECK(uniform.delay_ns(0, 4) == 2500000);
  CHECK(uniform.delay_ns(1, 2) == 2500000);
  CHECK(uniform.delay_ns(3, 3) == 0);

  WanSpec primary_local = uniform;
  primary_local.sites = {{4, 0}};
  CHECK(primary_local.delay_ns(4, 0) == 0);
  CHECK(primary_local.delay_ns(0, 4) == 0);
  CHECK(primary_local.delay_ns(4, 1) == 2500000);
  CHECK(primary_local.describe() == "2.5 ms one-way between sites; sites 4=0");

  WanSpec primary_remote = uniform;
  primary_remote.sites = {{4, 1}};
  CHECK(primary_remote.delay_ns(4, 1) == 0);
  CHECK(primary_remote.delay_ns(4, 0) == 2500000);
}

TEST_CASE("wan: frames to another site arrive in order, each direction no earlier than the delay",
          "[runtime][transport][wan]") {
  Keys k;
  EventBasePtr base = make_event_base(true);
  REQUIRE(base != nullptr);
  auto c0 = k.crypto(0);
  auto c1 = k.crypto(1);
  constexpr double kDelayMs = 20;
  constexpr std::uint64_t kDelayNs = 20000000;
  constexpr std::uint64_t kFrames = 40;
  struct Arrival {
    std::uint64_t seq;
    std::uint64_t at_ns;
  };
  std::vector<Arrival> at_1;
  std::vector<Arrival> back_at_0;
  std::unique_ptr<Transport> one;
  Transport zero(base.get(), 4, *c0, wan_options(kDelayMs), [&](NodeId from, Message&& m) {
    REQUIRE(from == 1);
    back_at_0.push_back({std::get<Checkpoint>(m).seq, mono_ns()});
  });
  one = std::make_unique<Transport>(base.get(), 4, *c1, wan_options(kDelayMs), [&](NodeId from, Message&& m) {
    REQUIRE(from == 0);
    const std::uint64_t seq = std::get<Checkpoint>(m).seq;
    at_1.push_back({seq, mono_ns()});
    one->send(Send{0, checkpoint(seq)});  // echo: the way back is delayed by 1's own link
  });
  REQUIRE(zero.listen(k.config.replicas[0]).empty());
  REQUIRE(one->listen(k.config.replicas[1]).empty());
  REQUIRE(zero.connect(1, k.config.replicas[1]).empty());
  REQUIRE(one->connect(0, k.config.replicas[0]).empty());
  REQUIRE(run_until(base.get(), [&] { return zero.connected(1) && one->connected(0); }, 5000));

  std::vector<std::uint64_t> sent_ns(kFrames);
  for (std::uint64_t i = 0; i < kFrames; ++i) {
    sent_ns[i] = mono_ns();
    zero.send(Send{1, checkpoint(i)});
    // Spread the sends over several release times, so that due frames leave while others still wait.
    if (i % 8 == 7) run_until(base.get(), [] { return false; }, 3);
  }
  REQUIRE(run_until(base.get(), [&] { return back_at_0.size() == kFrames; }, 20000));
  REQUIRE(at_1.size() == kFrames);
  for (std::uint64_t i = 0; i < kFrames; ++i) {
    INFO("frame " << i);
    CHECK(at_1[i].seq == i);
    CHECK(back_at_0[i].seq == i);
    CHECK(at_1[i].at_ns - sent_ns[i] >= kDelayNs);
    CHECK(back_at_0[i].at_ns - at_1[i].at_ns >= kDelayNs);
  }
  CHECK(zero.stats().frames_delayed == kFrames);
  CHECK(one->stats().frames_delayed == kFrames);
  CHECK(zero.stats().delay_dropped == 0);
  CHECK(zero.stats().sends_dropped_no_connection == 0);
}

TEST_CASE("wan: frames within a site, or with no delay, take the direct path", "[runtime][transport][wan]") {
  Keys k;
  EventBasePtr base = make_event_base(true);
  auto c0 = k.crypto(0);
  auto c1 = k.crypto(1);
  // A delay far longer than the test may take: a frame that waited for it would never arrive.
  TransportOptions sender_options = wan_options(10000, {{1, 0}});
  SECTION("same site") {}
  SECTION("delay 0 (LAN), sites given") { sender_options.wan.delay_ms = 0; }
  SECTION("delay 0 (LAN), no sites") { sender_options = TransportOptions{}; }
  std::vector<std::uint64_t> at_1;
  Transport one(base.get(), 4, *c1, wan_options(10000, {{1, 0}}),
                [&](NodeId, Message&& m) { at_1.push_back(std::get<Checkpoint>(m).seq); });
  REQUIRE(one.listen(k.config.replicas[1]).empty());
  Transport zero(base.get(), 4, *c0, sender_options, [](NodeId, Message&&) {});
  REQUIRE(zero.connect(1, k.config.replicas[1]).empty());
  REQUIRE(run_until(base.get(), [&] { return zero.connected(1); }, 5000));
  for (std::uint64_t i = 0; i < 5; ++i) zero.send(Send{1, checkpoint(i)});
  CHECK(zero.stats().frames_delayed == 0);
  REQUIRE(run_until(base.get(), [&] { return at_1.size() == 5; }, 5000));
  CHECK(at_1 == std::vector<std::uint64_t>{0, 1, 2, 3, 4});
  CHECK(zero.stats().frames_delayed == 0);
  CHECK(zero.stats().frames_sent == 5);
}

TEST_CASE("wan: past their frame bound the delay links drop and count, and keep the rest in order",
          "[runtime][transport][wan]") {
  Keys k;
  EventBasePtr base = make_event_base(true);
  auto c0 = k.crypto(0);
  auto c1 = k.crypto(1);
  std::vector<std::uint64_t> at_1;
  Transport one(base.get(), 4, *c1, TransportOptions{},
                [&](NodeId, Message&& m) { at_1.push_back(std::get<Checkpoint>(m).seq); });
  REQUIRE(one.listen(k.config.replicas[1]).empty());
  TransportOptions o = wan_options(30);
  o.delay_frames_max = 3;
  Transport zero(base.get(), 4, *c0, o, [](NodeId, Message&&) {});
  REQUIRE(zero.connect(1, k.config.replicas[1]).empty());
  REQUIRE(run_until(base.get(), [&] { return zero.connected(1); }, 5000));
  for (std::uint64_t i = 0; i < 5; ++i) {
    const Bytes frame = encode_frame(checkpoint(i), 0, 1, *c0);
    CHECK(zero.send_frame(1, frame.data(), frame.size()) == (i < 3));
  }
  CHECK(zero.stats().frames_delayed == 3);
  CHECK(zero.stats().delay_dropped == 2);
  REQUIRE(run_until(base.get(), [&] { return at_1.size() == 3; }, 5000));
  CHECK(at_1 == std::vector<std::uint64_t>{0, 1, 2});
  // Released frames free their room.
  const Bytes frame = encode_frame(checkpoint(9), 0, 1, *c0);
  CHECK(zero.send_frame(1, frame.data(), frame.size()));
  REQUIRE(run_until(base.get(), [&] { return at_1.size() == 4; }, 5000));
  CHECK(at_1.back() == 9);
  CHECK(zero.stats().delay_dropped == 2);
}

TEST_CASE("wan: a delayed reply for a client without a connection is parked, then delivered",
          "[runtime][transport][wan]") {
  Keys k;
  EventBasePtr base = make_event_base(true);
  auto c0 = k.crypto(0);
  auto c4 = k.crypto(4);
  std::vector<Message> at_client;
  Transport server(base.get(), 4, *c0, wan_options(10), [](NodeId, Message&&) {});
  REQUIRE(server.listen(k.config.replicas[0]).empty());
  Reply reply;
  reply.client = 4;
  reply.request_id = 3;
  reply.flags = kReplyHasResult;
  reply.result = Bytes(8, 1);
  reply.result_digest = digest_of(reply.result);
  server.send(Send{4, reply});
  CHECK(server.stats().frames_delayed == 1);
  CHECK(server.stats().frames_parked == 0);  // not yet: it is still on its way
  // Released with no connection to client 4: parked, exactly as an undelayed send would be.
  REQUIRE(run_until(base.get(), [&] { return server.stats().frames_parked == 1; }, 5000));
  CHECK(server.stats().sends_dropped_no_connection == 0);

  TransportOptions client_options = wan_options(10);
  client_options.send_hello = true;
  Transport client(base.get(), 4, *c4, client_options, [&](NodeId, Message&& m) { at_client.push_back(std::move(m)); });
  REQUIRE(client.connect(0, k.config.replicas[0]).empty());
  REQUIRE(run_until(base.get(), [&] { return !at_client.empty(); }, 5000));
  CHECK(std::get<Reply>(at_client[0]).request_id == 3);
  CHECK(server.stats().parked_delivered == 1);
  CHECK(server.stats().frames_delayed == 1);  // delivering a parked frame does not delay it again
}
