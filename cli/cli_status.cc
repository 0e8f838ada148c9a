// bftfs status: the status files of a local cluster (cli/cli_cluster_dir.h) as a table.
#include <signal.h>
#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "cli/cli_cluster_dir.h"
#include "cli/cli_common.h"
#include "common/config.h"
#include "runtime/status_file.h"

namespace bftfs::cli {
namespace {

using Status = std::map<std::string, std::string>;

// Seconds since the process last rewrote its status file.
double age_s(Status& st) {
  const std::uint64_t now_ms = static_cast<std::uint64_t>(::time(nullptr)) * 1000;
  const std::uint64_t updated = std::strtoull(st["updated_unix_ms"].c_str(), nullptr, 10);
  return now_ms > updated ? static_cast<double>(now_ms - updated) / 1e3 : 0.0;
}

// "running", "dead" (the file says running but the pid is gone) or "stopped".
std::string state_of(Status& st) {
  const pid_t pid = static_cast<pid_t>(std::atoll(st["pid"].c_str()));
  return st["running"] == "true" ? (::kill(pid, 0) == 0 ? "running" : "dead") : "stopped";
}

// One row per server: the replicas, unless this directory ran a NO-REP server and no replica. Returns false if
// one that should run does not.
bool print_servers(const std::string& dir, const ClusterConfig& config) {
  std::printf("%-5s %-8s %-8s %6s %7s %10s %10s %8s %10s %9s %7s\n", "id", "state", "pid", "view", "primary",
              "executed", "committed", "stable", "requests", "rejected", "age_s");
  std::vector<std::pair<std::string, std::string>> servers;  // (id column, status file)
  const bool norep = file_exists(norep_data_path(dir) + "/status.json");
  if (!norep || file_exists(data_path(dir, 0) + "/status.json")) {
    for (NodeId i = 0; i < config.n; ++i) servers.emplace_back(std::to_string(i), data_path(dir, i) + "/status.json");
  }
  if (norep) servers.emplace_back("norep", norep_data_path(dir) + "/status.json");
  bool ok = true;
  for (auto& [id, path] : servers) {
    Status st;
    if (std::string err = read_status_file(path, st); !err.empty()) {
      std::printf("%-5s %-8s\n", id.c_str(), "no-status");
      ok = false;
      continue;
    }
    const std::string state = state_of(st);
    if (state != "running") ok = false;
    std::printf("%-5s %-8s %-8s %6s %7s %10s %10s %8s %10s %9s %7.1f\n", id.c_str(), state.c_str(), st["pid"].c_str(),
                st["view"].c_str(), st["primary"].c_str(), st["last_executed"].c_str(), st["last_committed"].c_str(),
                st["stable_checkpoint"].c_str(), st["requests_executed"].c_str(), st["frames_rejected"].c_str(),
                age_s(st));
  }
  return ok;
}

// The relay's row, if this cluster has one. Returns false if it should run and does not.
bool print_relay(const std::string& dir) {
  Status st;
  if (!read_status_file(relay_status_path(dir), st).empty()) return true;
  const std::string state = state_of(st);
  std::printf("\n%-5s %-8s %-8s %-6s %7s %6s %9s %10s %10s %8s %8s %-9s %7s\n", "relay", "state", "pid", "mode",
              "client", "conns", "in_flight", "submitted", "completed", "refused", "retrans", "trusted", "age_s");
  std::printf("%-5s %-8s %-8s %-6s %7s %6s %9s %10s %10s %8s %8s %-9s %7.1f\n", "", state.c_str(), st["pid"].c_str(),
              st["mode"].c_str(), st["client_id"].c_str(), st["connections"].c_str(), st["in_flight"].c_str(),
              st["submitted"].c_str(), st["completed"].c_str(), st["refused"].c_str(), st["retransmissions"].c_str(),
              st["replicas_trusted"].c_str(), age_s(st));
  std::printf("socket %s\n", st["socket"].c_str());
  return state == "running";
}

int run_status(const std::string& dir) {
  ClusterConfig config;
  if (std::string err = load_cluster(dir + "/cluster.conf", config); !err.empty()) {
    error("status", err);
    return kExitFailure;
  }
  const bool servers_ok = print_servers(dir, config);
  const bool relay_ok = print_relay(dir);
  return servers_ok && relay_ok ? kExitOk : kExitFailure;
}

}  // namespace

void add_status(CLI::App& root, Commands& out) {
  auto dir = std::make_shared<std::string>();
  CLI::App* app = root.add_subcommand("status",
      "print the status of every replica and the relay of a local cluster\n\n"
      "Prints the status of a local cluster in DIR: every replica's DIR/r<i>/status.json (or the NO-REP\n"
      "server's DIR/norep/status.json) as a table, and the relay's DIR/relay.status.json. Exit 1 if a\n"
      "process that should run does not.");
  app->add_option("--dir", *dir, "cluster directory")->type_name("DIR")->required();
  out.push_back({app, [dir] { return run_status(*dir); }});
}

}  // namespace bftfs::cli
