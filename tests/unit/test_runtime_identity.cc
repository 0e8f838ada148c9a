// A replica's data directory keeps the service configuration it was created with: a restart with another
// service, or with the shim switched on or off, is refused with a clear error instead of reading another
// configuration's snapshots and log as its own.
#include <catch2/catch.hpp>

#include <memory>
#include <string>

#include "common/config.h"
#include "replica/replica_runtime.h"
#include "tests/unit/test_runtime_util.h"

using namespace bftfs;
using namespace bftfs::testing;

namespace {

std::string start_once(const std::string& conf, const std::string& data, const std::string& service, bool shim) {
  ReplicaRuntimeOptions o;
  o.config_path = conf;
  o.id = 0;
  o.data_dir = data;
  o.service = service;
  o.shim = shim;
  std::unique_ptr<ReplicaRuntime> rt;
  return ReplicaRuntime::create(o, rt);  // created and destroyed without running: enough to open the directory
}

}  // namespace

TEST_CASE("a replica's data directory refuses another service configuration", "[runtime]") {
  TempDir dir;
  REQUIRE(generate_cluster(dir.path, 1, 2, {"127.0.0.1"}, free_port_range(4)).empty());
  const std::string conf = dir.path + "/cluster.conf";
  const std::string data = dir.path + "/r0";
  REQUIRE(start_once(conf, data, "fs", true).empty());
  CHECK(start_once(conf, data, "fs", true).empty());  // the same configuration starts again

  const std::string other_service = start_once(conf, data, "counter", true);
  CHECK(other_service.find("service=fs shim=1") != std::string::npos);
  CHECK(other_service.find("service=counter shim=1") != std::string::npos);
  const std::string no_shim = start_once(conf, data, "fs", false);
  CHECK(no_shim.find("not 'service=fs shim=0'") != std::string::npos);

  // A new directory takes whatever it is first started with.
  CHECK(start_once(conf, dir.path + "/r0-new", "counter", false).empty());
}
