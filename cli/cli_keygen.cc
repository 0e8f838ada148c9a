// bftfs keygen: a new cluster's configuration and keys.
#include <cstdio>
#include <memory>

#include "cli/cli_common.h"
#include "common/config.h"

namespace bftfs::cli {
namespace {

struct KeygenArgs {
  std::string dir;
  std::uint32_t f = 1;
  std::uint32_t clients = 16;
  std::string hosts = "127.0.0.1";
  std::uint16_t base_port = 7000;
};

int run_keygen(const KeygenArgs& a) {
  const auto hosts = split_commas(a.hosts);
  if (hosts.empty()) {
    error("keygen", "--hosts: no host given");
    return kExitUsage;
  }
  if (a.base_port + 3 * a.f >= 65536) {
    error("keygen", "--base-port: the replicas' ports would pass 65535");
    return kExitUsage;
  }
  if (const std::string err = generate_cluster(a.dir, a.f, a.clients, hosts, a.base_port); !err.empty()) {
    error("keygen", err);
    return kExitFailure;
  }
  std::printf("wrote %s/cluster.conf: f=%u n=%u, %u clients\n", a.dir.c_str(), a.f, 3 * a.f + 1, a.clients);
  return kExitOk;
}

}  // namespace

void add_keygen(CLI::App& root, Commands& out) {
  auto a = std::make_shared<KeygenArgs>();
  CLI::App* app = root.add_subcommand("keygen",
      "write cluster.conf and keys for a new cluster\n\n"
      "Writes DIR/cluster.conf and DIR/keys/node-<id>.key for n = 3f+1 replicas and the given number of\n"
      "clients, with fresh keys. Replica i listens on hosts[i % len(hosts)]:(base-port + i).");
  app->add_option("--dir", a->dir, "output directory")->type_name("DIR")->required();
  app->add_option("--f", a->f, "faults tolerated (n = 3f+1)")->type_name("F")->transform(decimal(1, 21));
  app->add_option("--clients", a->clients, "number of client identities")->type_name("M")->transform(decimal(1, 100000));
  app->add_option("--hosts", a->hosts, "replica addresses")->type_name("H1[,H2...]");
  app->add_option("--base-port", a->base_port, "port of replica 0")->type_name("PORT")->transform(decimal(1, 65535));
  out.push_back({app, [a] { return run_keygen(*a); }});
}

}  // namespace bftfs::cli
