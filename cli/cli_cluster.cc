// bftfs cluster start|stop: a local cluster of processes in the background, for demos, benchmarks and
// integration tests, laid out in its directory as cli/cli_cluster_dir.h says.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <vector>

#include "cli/cli_cluster_dir.h"
#include "cli/cli_common.h"
#include "common/config.h"
#include "os/clock.h"
#include "runtime/status_file.h"

namespace bftfs::cli {
namespace {

struct ClusterStartArgs {
  std::string dir;
  std::uint32_t f = 1;
  std::uint32_t clients = 16;
  std::uint16_t base_port = 7000;
  std::string service = "counter";
  bool no_batching = false;
  std::uint32_t batch_max = 64;
  std::uint32_t batch_window = 1;
  bool no_fsync = false;
  bool no_piggyback_commits = false;
  bool no_batch_hold = false;
  bool no_quiet_primary = false;
  bool shim = false;
  bool early_replies = false;
  std::string corrupt_early_replies = "0";
  std::string log_level = "info";
  std::uint64_t timeout_s = 15;
  bool norep = false;
  bool norep_durable = false;
  bool no_relay = false;
  std::optional<NodeId> relay_id;  // default: the configuration's last client
  bool relay_no_speculate = false;
  DistrustArgs relay_distrust;  // the relay's 1% rule
  WanArgs wan;

  bool relay() const { return service == "fs" && !no_relay; }
};

std::string tail_of(const std::string& path, std::size_t bytes) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  return s.size() > bytes ? s.substr(s.size() - bytes) : s;
}

// Starts `args` (args[0] is the executable) in its own session with stdout and stderr appended to `log`, and
// writes its pid to `pid_file`. Returns the pid, or -1 (after printing why).
pid_t spawn(const std::vector<std::string>& args, const std::string& log, const std::string& pid_file) {
  const pid_t pid = ::fork();
  if (pid < 0) {
    error("cluster start", std::string("fork: ") + std::strerror(errno));
    return -1;
  }
  if (pid == 0) {
    ::setsid();  // survive the terminal and this command
    const int logfd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    const int nullfd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (logfd < 0 || nullfd < 0) _exit(127);
    ::dup2(nullfd, 0);
    ::dup2(logfd, 1);
    ::dup2(logfd, 2);
    std::vector<std::string> copy = args;
    std::vector<char*> cargv;
    for (auto& a : copy) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    ::execv(cargv[0], cargv.data());
    _exit(127);
  }
  std::ofstream(pid_file) << pid << "\n";
  return pid;
}

// A background process `cluster start` waits for: ready once its status file says it runs under this pid.
struct Daemon {
  std::string name;         // "replica 2", "norep", "relay"
  pid_t pid = 0;
  std::string status_path;
  std::string log_path;
  std::string ready_line;   // printed once it is ready
  bool up = false;
};

// Whether `d` is ready now (printing its ready line once it is); false with `exited` set if it died.
bool poll_ready(Daemon& d, bool& exited) {
  int status = 0;
  exited = ::waitpid(d.pid, &status, WNOHANG) == d.pid;
  if (exited) return false;
  std::map<std::string, std::string> st;
  if (!read_status_file(d.status_path, st).empty() || st["running"] != "true" || st["pid"] != std::to_string(d.pid)) {
    return false;
  }
  d.up = true;
  std::printf("%s\n", d.ready_line.c_str());
  return true;
}

// Waits until every daemon is ready; returns false (after printing which one failed and the end of its log) if
// one exits or the deadline passes.
bool wait_ready(std::vector<Daemon>& daemons, std::uint64_t timeout_s, const std::string& dir) {
  const std::uint64_t deadline = mono_ms() + timeout_s * 1000;
  for (;;) {
    bool all = true;
    for (Daemon& d : daemons) {
      bool exited = false;
      if (d.up || poll_ready(d, exited)) continue;
      if (exited) {
        error("cluster start", d.name + " exited during start-up; end of " + d.log_path + ":\n" + tail_of(d.log_path, 2000));
        return false;
      }
      all = false;
    }
    if (all) return true;
    if (mono_ms() > deadline) {
      error("cluster start", "not every process came up within " + std::to_string(timeout_s) + " s (see " + dir +
                                 "/*.log); stop them with `bftfs cluster stop --dir " + dir + "`");
      return false;
    }
    sleep_ms(20);
  }
}

// Loads DIR/cluster.conf, running keygen first if there is none. Returns "" or why it failed.
std::string load_or_generate(const ClusterStartArgs& a, ClusterConfig& config) {
  const std::string conf = a.dir + "/cluster.conf";
  if (!file_exists(conf)) {
    if (std::string err = generate_cluster(a.dir, a.f, a.clients, {"127.0.0.1"}, a.base_port); !err.empty()) return err;
    std::printf("generated %s (f=%u)\n", conf.c_str(), a.f);
  }
  return load_cluster(conf, config);
}

// "" if nothing of an earlier start still runs in DIR, or what does.
std::string still_running(const std::string& dir, const ClusterConfig& config) {
  const std::string stop_first = "; run `bftfs cluster stop --dir " + dir + "` first";
  for (NodeId i = 0; i < config.n; ++i) {
    const pid_t pid = read_pid(pid_path(dir, i));
    if (is_our_process(pid, "replica")) {
      return "replica " + std::to_string(i) + " is already running (pid " + std::to_string(pid) + ")" + stop_first;
    }
  }
  for (const char* role : {"norep", "relay"}) {
    const pid_t pid = read_pid(dir + "/" + role + ".pid");
    if (is_our_process(pid, role)) {
      return std::string(role) + " is already running (pid " + std::to_string(pid) + ")" + stop_first;
    }
  }
  return "";
}

// `bftfs status` shows what has a status file: forget the processes of an earlier start in another mode.
void forget_other_mode(const ClusterStartArgs& a, const ClusterConfig& config) {
  ::unlink(relay_status_path(a.dir).c_str());
  if (a.norep) {
    for (NodeId i = 0; i < config.n; ++i) ::unlink((data_path(a.dir, i) + "/status.json").c_str());
  } else {
    ::unlink((norep_data_path(a.dir) + "/status.json").c_str());
  }
}

std::vector<std::string> replica_arguments(const ClusterStartArgs& a, NodeId i) {
  std::vector<std::string> args = {self_executable(), "replica", "--config", a.dir + "/cluster.conf", "--id",
                                   std::to_string(i), "--data", data_path(a.dir, i), "--service", a.service,
                                   "--log-level", a.log_level, "--batch-max", std::to_string(a.batch_max),
                                   "--batch-window", std::to_string(a.batch_window)};
  const std::pair<bool, const char*> flags[] = {
      {a.no_batching, "--no-batching"},
      {a.no_fsync, "--no-fsync"},
      {a.no_piggyback_commits, "--no-piggyback-commits"},
      {a.no_batch_hold, "--no-batch-hold"},
      {a.no_quiet_primary, "--no-quiet-primary"},
      {a.shim || a.relay(), "--shim"},  // the relay speaks PBFT-CS, whose requests only the shim understands
      {a.early_replies, "--early-replies"},
  };
  for (const auto& [on, flag] : flags) {
    if (on) args.push_back(flag);
  }
  if (a.corrupt_early_replies != "0") {
    args.push_back("--corrupt-early-replies");
    args.push_back(a.corrupt_early_replies);
  }
  for (auto& w : wan_arguments(a.wan)) args.push_back(std::move(w));
  return args;
}

std::vector<std::string> norep_arguments(const ClusterStartArgs& a) {
  std::vector<std::string> args = {self_executable(), "norep", "--config", a.dir + "/cluster.conf", "--data",
                                   norep_data_path(a.dir), "--service", a.service, "--log-level", a.log_level};
  if (a.norep_durable) args.push_back("--durable");
  for (auto& w : wan_arguments(a.wan)) args.push_back(std::move(w));
  return args;
}

std::vector<std::string> relay_arguments(const ClusterStartArgs& a, NodeId relay_id) {
  std::vector<std::string> args = {self_executable(), "relay", "--config", a.dir + "/cluster.conf", "--id",
                                   std::to_string(relay_id), "--socket", relay_socket_path(a.dir), "--status",
                                   relay_status_path(a.dir), "--log-level", a.log_level};
  if (a.norep) args.push_back("--norep");
  if (a.relay_no_speculate) args.push_back("--no-speculate");
  for (auto& d : distrust_arguments(a.relay_distrust)) args.push_back(std::move(d));
  for (auto& w : wan_arguments(a.wan)) args.push_back(std::move(w));
  return args;
}

// Spawns one server (a replica, or the NO-REP server with i = -1) into `out`; false if it could not start.
bool spawn_server(const ClusterStartArgs& a, const ClusterConfig& config, int i, std::vector<Daemon>& out) {
  const bool norep = i < 0;
  const NodeId id = norep ? 0 : static_cast<NodeId>(i);
  const std::string data = norep ? norep_data_path(a.dir) : data_path(a.dir, id);
  const std::string log = norep ? a.dir + "/norep.log" : log_path(a.dir, id);
  const std::string name = norep ? "norep" : "replica " + std::to_string(id);
  ::mkdir(data.c_str(), 0755);
  ::unlink((data + "/status.json").c_str());  // readiness is judged on this incarnation's file only
  const auto args = norep ? norep_arguments(a) : replica_arguments(a, id);
  Daemon d{name, spawn(args, log, norep ? a.dir + "/norep.pid" : pid_path(a.dir, id)), data + "/status.json", log,
           "", false};
  if (d.pid < 0) return false;
  d.ready_line = name + " pid " + std::to_string(d.pid) + " listening " + config.replicas[id].host + ":" +
                 std::to_string(config.replicas[id].port) + " data " + data + " log " + d.log_path;
  out.push_back(std::move(d));
  return true;
}

// Starts the relay after the servers, so its first requests find them listening (it would retry anyway), and
// waits for it.
bool start_relay(const ClusterStartArgs& a, NodeId relay_id) {
  ::unlink(relay_status_path(a.dir).c_str());
  const std::string log = a.dir + "/relay.log";
  Daemon d{"relay", spawn(relay_arguments(a, relay_id), log, a.dir + "/relay.pid"), relay_status_path(a.dir), log,
           "", false};
  if (d.pid < 0) return false;
  d.ready_line = std::string("relay pid ") + std::to_string(d.pid) + " client " + std::to_string(relay_id) +
                 (a.norep ? " (NO-REP)" : "") + " socket " + relay_socket_path(a.dir) + " log " + d.log_path;
  std::vector<Daemon> relays;
  relays.push_back(std::move(d));
  return wait_ready(relays, a.timeout_s, a.dir);
}

int run_cluster_start(const ClusterStartArgs& a) {
  ClusterConfig config;
  if (std::string err = load_or_generate(a, config); !err.empty()) {
    error("cluster start", err);
    return kExitFailure;
  }
  const NodeId relay_id = a.relay_id.value_or(config.clients.empty() ? 0 : config.clients.back());
  if (a.relay() && std::find(config.clients.begin(), config.clients.end(), relay_id) == config.clients.end()) {
    error("cluster start", "the relay needs a client id of the configuration; " + std::to_string(relay_id) + " is not one");
    return kExitFailure;
  }
  if (std::string running = still_running(a.dir, config); !running.empty()) {
    error("cluster start", running);
    return kExitFailure;
  }
  forget_other_mode(a, config);
  std::vector<Daemon> servers;
  for (int i = a.norep ? -1 : 0; i < (a.norep ? 0 : static_cast<int>(config.n)); ++i) {
    if (!spawn_server(a, config, i, servers)) return kExitFailure;
  }
  // Wait for every server's status.json (written once its loop runs) naming its pid.
  if (!wait_ready(servers, a.timeout_s, a.dir)) return kExitFailure;
  if (a.relay() && !start_relay(a, relay_id)) return kExitFailure;
  std::fflush(stdout);
  return kExitOk;
}

// One process `cluster stop` stops: its name, pid file and role (the `bftfs <role>` it must be).
struct Stoppable {
  std::string name;
  std::string pid_file;
  const char* role;
};

// Waits for `pid` to exit, with SIGKILL at the deadline. Returns false if it survives SIGKILL; sets `killed`.
bool await_exit(const Stoppable& p, pid_t pid, std::uint64_t deadline_ms, bool& killed) {
  killed = false;
  while (::kill(pid, 0) == 0 && is_our_process(pid, p.role)) {
    if (mono_ms() > deadline_ms) {
      ::kill(pid, SIGKILL);
      killed = true;
      sleep_ms(50);
      if (::kill(pid, 0) == 0 && is_our_process(pid, p.role)) {
        error("cluster stop", p.name + " (pid " + std::to_string(pid) + ") survives SIGKILL");
        return false;
      }
      return true;
    }
    sleep_ms(10);
  }
  return true;
}

// SIGTERM to every running one, then waits for each (SIGKILL after the deadline); removes the pid files.
int stop_all(const std::vector<Stoppable>& procs, std::uint64_t timeout_s) {
  std::vector<pid_t> pids(procs.size(), 0);
  for (std::size_t k = 0; k < procs.size(); ++k) {
    const pid_t pid = read_pid(procs[k].pid_file);
    if (!is_our_process(pid, procs[k].role)) {
      ::unlink(procs[k].pid_file.c_str());
      continue;
    }
    pids[k] = pid;
    ::kill(pid, SIGTERM);
  }
  const std::uint64_t deadline = mono_ms() + timeout_s * 1000;
  int rc = kExitOk;
  for (std::size_t k = 0; k < procs.size(); ++k) {
    if (pids[k] == 0) {
      std::printf("%s not running\n", procs[k].name.c_str());
      continue;
    }
    bool killed = false;
    if (!await_exit(procs[k], pids[k], deadline, killed)) rc = kExitFailure;
    ::unlink(procs[k].pid_file.c_str());
    std::printf("%s (pid %d) stopped%s\n", procs[k].name.c_str(), pids[k], killed ? " with SIGKILL" : "");
  }
  return rc;
}

int run_cluster_stop(const std::string& dir, std::uint64_t timeout_s) {
  ClusterConfig config;
  if (std::string err = load_cluster(dir + "/cluster.conf", config); !err.empty()) {
    error("cluster stop", err);
    return kExitFailure;
  }
  int rc = kExitOk;
  // The relay first: it would otherwise log retransmissions to replicas that are going away.
  const bool relay_started = file_exists(dir + "/relay.pid");
  if (relay_started && stop_all({{"relay", dir + "/relay.pid", "relay"}}, timeout_s) != kExitOk) rc = kExitFailure;
  std::vector<Stoppable> servers;
  const bool norep_started = file_exists(dir + "/norep.pid");
  const bool replicas_started = !norep_started || file_exists(pid_path(dir, 0));
  if (replicas_started) {
    for (NodeId i = 0; i < config.n; ++i) servers.push_back({"replica " + std::to_string(i), pid_path(dir, i), "replica"});
  }
  if (norep_started) servers.push_back({"norep", dir + "/norep.pid", "norep"});
  if (stop_all(servers, timeout_s) != kExitOk) rc = kExitFailure;
  return rc;
}

// The options that choose what the replicas run and how they are tuned (passed on to `bftfs replica`).
void add_replica_options(CLI::App& app, ClusterStartArgs& a) {
  app.add_option("--service", a.service, "replicated service")->type_name("NAME");
  app.add_flag("--no-batching", a.no_batching, "one request per pre-prepare");
  app.add_option("--batch-max", a.batch_max, "requests per pre-prepare")->type_name("N")->transform(decimal(1, 1024));
  app.add_option("--batch-window", a.batch_window, "batches in flight before requests wait to be batched")
      ->type_name("W")->transform(decimal(1, 1024));
  app.add_flag("--no-fsync", a.no_fsync, "replicas do not fdatasync their logs (NOT durable; measurements only)");
  app.add_flag("--no-piggyback-commits", a.no_piggyback_commits,
               "replicas send each COMMIT at once (for measuring the piggybacking)");
  app.add_flag("--no-batch-hold", a.no_batch_hold,
               "the primary does not wait for the clients it just answered before the next batch (for measuring "
               "the batch hold)");
  app.add_flag("--no-quiet-primary", a.no_quiet_primary,
               "the primary persists, COMMITs and votes for every batch (for measuring the quiet primary)");
  app.add_flag("--shim", a.shim, "replicas run the service behind the PBFT-CS shim");
  app.add_flag("--early-replies", a.early_replies, "PBFT-CS: the primary sends early speculative replies");
  app.add_option("--corrupt-early-replies", a.corrupt_early_replies,
                 "fault injection: the primary corrupts this fraction of early and read-only replies")
      ->type_name("FRACTION")->check(fraction());
  add_log_level(app, a.log_level, "replicas' log level");
}

void add_cluster_start(CLI::App& cluster, Commands& out) {
  auto a = std::make_shared<ClusterStartArgs>();
  CLI::App* app = cluster.add_subcommand("start",
      "start a local cluster in the background\n\n"
      "Starts the n replicas of the cluster in DIR in the background (running keygen first if DIR has no\n"
      "cluster.conf), each with data directory DIR/r<i>, log DIR/r<i>.log and pid file DIR/r<i>.pid, and\n"
      "waits until every replica reports that it runs. With --service fs the replicas run the shim and a\n"
      "relay listens on DIR/relay.sock (log DIR/relay.log) for `bftfs mount --relay DIR/relay.sock MNT`.\n"
      "With --norep one NO-REP server (DIR/norep, DIR/norep.log) runs instead of the replicas, and for fs a\n"
      "relay in NO-REP mode on DIR/relay.sock.");
  app->add_option("--dir", a->dir, "cluster directory")->type_name("DIR")->required();
  app->add_option("--f", a->f, "faults tolerated, for a new cluster")->type_name("F")->transform(decimal(1, 21));
  app->add_option("--clients", a->clients, "client identities, for a new cluster")
      ->type_name("M")->transform(decimal(1, 100000));
  app->add_option("--base-port", a->base_port, "port of replica 0, for a new cluster")
      ->type_name("PORT")->transform(decimal(1, 65535 - 64));
  add_replica_options(*app, *a);
  app->add_option("--timeout-s", a->timeout_s, "how long to wait for the replicas to come up")
      ->type_name("S")->transform(decimal(1, 3600));
  app->add_flag("--norep", a->norep, "start one NO-REP server (the unreplicated baseline) instead of the replicas");
  app->add_flag("--norep-durable", a->norep_durable,
                "with --norep: the server logs every request before replying (bftfs norep --durable)");
  app->add_flag("--no-relay", a->no_relay, "with --service fs: do not start the relay");
  app->add_option("--relay-id", a->relay_id, "the relay's client id (default: the configuration's last client)")
      ->type_name("ID")->transform(decimal(0, 0xFFFFFFFEu));
  app->add_flag("--relay-no-speculate", a->relay_no_speculate, "the relay never delivers first replies");
  add_distrust_options(*app, a->relay_distrust);  // passed on to the relay
  add_wan_options(*app, a->wan);  // passed on to every process
  out.push_back({app, [a] { return run_cluster_start(*a); }});
}

void add_cluster_stop(CLI::App& cluster, Commands& out) {
  auto dir = std::make_shared<std::string>();
  auto timeout_s = std::make_shared<std::uint64_t>(10);
  CLI::App* app = cluster.add_subcommand("stop",
      "stop what cluster start started\n\n"
      "Stops everything `cluster start` started in DIR (the relay first, then the replicas or the NO-REP\n"
      "server): SIGTERM, then SIGKILL after a timeout.");
  app->add_option("--dir", *dir, "cluster directory")->type_name("DIR")->required();
  app->add_option("--timeout-s", *timeout_s, "seconds to wait after SIGTERM before SIGKILL")
      ->type_name("S")->transform(decimal(0, 3600));
  out.push_back({app, [dir, timeout_s] { return run_cluster_stop(*dir, *timeout_s); }});
}

}  // namespace

void add_cluster(CLI::App& root, Commands& out) {
  CLI::App* cluster = root.add_subcommand("cluster",
      "start or stop a local cluster in the background (cluster start|stop --help)\n\n"
      "A local cluster of replicas (or a NO-REP server) and, for the file service, a relay, for demos,\n"
      "benchmarks and integration tests.");
  cluster->require_subcommand(1);
  add_cluster_start(*cluster, out);
  add_cluster_stop(*cluster, out);
}

}  // namespace bftfs::cli
