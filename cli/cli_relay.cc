// bftfs relay: the relay daemon (relay/relay_daemon.h) that FUSE mounts talk to.
#include <memory>

#include "cli/cli_common.h"
#include "common/assert.h"
#include "common/log.h"
#include "relay/relay_daemon.h"
#include "runtime/transport.h"

namespace bftfs::cli {
namespace {

struct RelayArgs {
  std::string config;
  NodeId id = 0;
  std::string socket;
  std::string socket_mode = "0660";
  bool norep = false;
  std::string norep_server;  // empty: replica 0's address
  bool no_speculate = false;
  DistrustArgs distrust;
  std::uint32_t window = 64;
  std::uint64_t mount_output_max_bytes = 64u << 20;
  std::uint64_t mount_in_flight_max = 1024;
  std::string status;
  std::string log_level = "info";
  WanArgs wan;
};

int run_relay(const RelayArgs& a) {
  log_set_level(log_level_of(a.log_level));
  RelayOptions o;
  o.config_path = a.config;
  o.id = a.id;
  o.socket_path = a.socket;
  o.socket_mode = static_cast<mode_t>(octal_value(a.socket_mode));
  o.norep = a.norep;
  if (!a.norep_server.empty()) {
    const std::string err = parse_host_port(a.norep_server, o.norep_server);
    BFT_ASSERT(err.empty());  // checked by the option's validator
  }
  o.speculate = !a.no_speculate;
  o.distrust_above_permille = a.distrust.above_permille;
  o.distrust_window = a.distrust.window;
  o.window = a.window;
  o.conn_output_bytes_max = a.mount_output_max_bytes;
  o.conn_in_flight_max = a.mount_in_flight_max;
  o.status_path = a.status;
  o.wan = wan_spec(a.wan);
  o.handle_signals = true;
  std::unique_ptr<RelayDaemon> relay;
  if (std::string err = RelayDaemon::create(o, relay); !err.empty()) {
    error("relay", err);
    return kExitFailure;
  }
  relay->run();
  return kExitOk;
}

}  // namespace

void add_relay(CLI::App& root, Commands& out) {
  auto a = std::make_shared<RelayArgs>();
  CLI::App* app = root.add_subcommand("relay",
      "run the relay that FUSE mounts talk to (Unix socket -> PBFT-CS requests)\n\n"
      "Runs the relay: a daemon that FUSE mounts (bftfs mount) talk to over the Unix socket SOCKET. It is\n"
      "client ID of the cluster in CONFIG and turns each file operation into a PBFT-CS request to replicas\n"
      "that run `--service fs --shim` (with --norep: a request to the NO-REP server). Reads use the\n"
      "read-only optimization; many requests are in flight; unreachable replicas are retried forever.\n"
      "The protocol is docs/RELAY.md. Stops cleanly on SIGTERM or SIGINT (removing the socket).");
  app->add_option("--config", a->config, "cluster.conf written by keygen")->type_name("FILE")->required();
  app->add_option("--id", a->id, "the relay's client id (one of the configuration's clients)")
      ->type_name("I")->required()->transform(decimal(0, 0xFFFFFFFEu));
  app->add_option("--socket", a->socket, "Unix socket to listen on")->type_name("PATH")->required();
  app->add_option("--socket-mode", a->socket_mode, "permissions of the socket (octal)")
      ->type_name("MODE")->check(octal(0777));
  CLI::Option* norep = app->add_flag("--norep", a->norep,
                                     "talk to the NO-REP server (bftfs norep --service fs) instead of PBFT replicas");
  app->add_option("--norep-server", a->norep_server, "the NO-REP server's address (default: replica 0's address)")
      ->type_name("HOST:PORT")->check(host_port())->needs(norep);
  app->add_flag("--no-speculate", a->no_speculate, "never deliver first replies (mounts asking for FIRST get only FINAL)");
  add_distrust_options(*app, a->distrust);
  app->add_option("--window", a->window, "requests on the wire at once (<= the replicas' client window)")
      ->type_name("N")->transform(decimal(1, 1024));
  app->add_option("--mount-output-max-bytes", a->mount_output_max_bytes,
                  "a mount with more than N bytes of replies unread is disconnected")
      ->type_name("N")->transform(decimal(1u << 16, 1ull << 34));
  app->add_option("--mount-in-flight-max", a->mount_in_flight_max,
                  "a mount with N requests in flight is not read until some complete")
      ->type_name("N")->transform(decimal(1, 1u << 20));
  app->add_option("--status", a->status, "rewrite FILE with the relay's status every 500 ms (for bftfs status)")
      ->type_name("FILE");
  add_log_level(*app, a->log_level, "debug|info|warn|error");
  add_wan_options(*app, a->wan);
  out.push_back({app, [a] { return run_relay(*a); }});
}

}  // namespace bftfs::cli
