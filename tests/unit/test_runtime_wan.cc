// WAN emulation spec (replica/wan.h): the parsers accept exactly the documented syntax, and sites default to
// the node itself.
#include <catch2/catch.hpp>

#include "replica/wan.h"

using namespace bftfs;

namespace {

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
