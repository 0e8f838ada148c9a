// bftfs keygen: a new cluster's configuration and keys.
#include <cstdio>

#include "common/config.h"
#include "cli/cli_common.h"

namespace bftfs::cli {

int cmd_keygen(int argc, char** argv) {
  ArgParser p("keygen",
              "Writes DIR/cluster.conf and DIR/keys/node-<id>.key for n = 3f+1 replicas and the given number of\n"
              "clients, with fresh keys. Replica i listens on hosts[i % len(hosts)]:(base-port + i).");
  p.option("dir", "DIR", "output directory").required("dir");
  p.option("f", "F", "faults tolerated (n = 3f+1)", "1");
  p.option("clients", "M", "number of client identities", "16");
  p.option("hosts", "H1[,H2...]", "replica addresses", "127.0.0.1");
  p.option("base-port", "PORT", "port of replica 0", "7000");
  if (auto rc = p.parse(argc, argv, 2)) return *rc;
  bool ok = true;
  const auto f = p.get_u64("f", ok, 1, 21);
  const auto clients = p.get_u64("clients", ok, 1, 100000);
  const auto port = p.get_u64("base-port", ok, 1, 65535);
  if (!ok) return kExitUsage;
  const auto hosts = split_commas(p.get("hosts"));
  if (hosts.empty()) {
    error("keygen", "--hosts: no host given");
    return kExitUsage;
  }
  if (port + 3 * f >= 65536) {
    error("keygen", "--base-port: the replicas' ports would pass 65535");
    return kExitUsage;
  }
  const std::string err = generate_cluster(p.get("dir"), static_cast<std::uint32_t>(f),
                                           static_cast<std::uint32_t>(clients), hosts,
                                           static_cast<std::uint16_t>(port));
  if (!err.empty()) {
    error("keygen", err);
    return kExitFailure;
  }
  std::printf("wrote %s/cluster.conf: f=%llu n=%llu, %llu clients\n", p.get("dir").c_str(),
              static_cast<unsigned long long>(f), static_cast<unsigned long long>(3 * f + 1),
              static_cast<unsigned long long>(clients));
  return kExitOk;
}

}  // namespace bftfs::cli
