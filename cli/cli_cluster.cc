// bftfs cluster start|stop and bftfs status: a local cluster of processes in the background, for demos,
// benchmarks and integration tests. Layout under DIR: cluster.conf, keys/, r<i>/ (data), r<i>.log, r<i>.pid for
// replicas; norep/ (data), norep.log, norep.pid for a NO-REP server (--norep); and for the file service a relay
// (relay.sock, relay.log, relay.pid, relay.status.json) that mounts connect to.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <vector>
#include <algorithm>
#include <fstream>
#include <sstream>

#include "os/clock.h"
#include "common/config.h"
#include "cli/cli_common.h"
#include "runtime/status_file.h"

namespace bftfs::cli {
namespace {

void sleep_ms(int ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, nullptr);
}

bool file_exists(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0;
}

std::string pid_path(const std::string& dir, NodeId i) { return dir + "/r" + std::to_string(i) + ".pid"; }
std::string data_path(const std::string& dir, NodeId i) { return dir + "/r" + std::to_string(i); }
std::string log_path(const std::string& dir, NodeId i) { return dir + "/r" + std::to_string(i) + ".log"; }

// The pid in a pid file, or 0.
pid_t read_pid(const std::string& path) {
  std::ifstream in(path);
  long pid = 0;
  if (!(in >> pid) || pid <= 0) return 0;
  return static_cast<pid_t>(pid);
}

std::string norep_data_path(const std::string& dir) { return dir + "/norep"; }
std::string relay_socket_path(const std::string& dir) { return dir + "/relay.sock"; }
std::string relay_status_path(const std::string& dir) { return dir + "/relay.status.json"; }

// True if `pid` is alive and is a `bftfs <role>` process (guards against a recycled pid).
bool is_our_process(pid_t pid, const char* role) {
  if (pid <= 0 || ::kill(pid, 0) != 0) return false;
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string cmd = ss.str();
  for (auto& c : cmd) {
    if (c == '\0') c = ' ';
  }
  return cmd.find("bftfs") != std::string::npos && cmd.find(std::string(" ") + role + " ") != std::string::npos;
}

bool is_our_replica(pid_t pid) { return is_our_process(pid, "replica"); }

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

// Waits until every daemon is ready; returns false (after printing which one failed and the end of its log) if
// one exits or the deadline passes.
bool wait_ready(std::vector<Daemon>& daemons, std::uint64_t timeout_s, const std::string& dir) {
  const std::uint64_t deadline = mono_ms() + timeout_s * 1000;
  for (;;) {
    bool all = true;
    for (Daemon& d : daemons) {
      if (d.up) continue;
      int status = 0;
      if (::waitpid(d.pid, &status, WNOHANG) == d.pid) {
        error("cluster start", d.name + " exited during start-up; end of " + d.log_path + ":\n" + tail_of(d.log_path, 2000));
        return false;
      }
      std::map<std::string, std::string> st;
      if (read_status_file(d.status_path, st).empty() && st["running"] == "true" && st["pid"] == std::to_string(d.pid)) {
        d.up = true;
        std::printf("%s\n", d.ready_line.c_str());
      } else {
        all = false;
      }
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

int cluster_start(int argc, char** argv) {
  ArgParser p("cluster start",
              "Starts the n replicas of the cluster in DIR in the background (running keygen first if DIR has no\n"
              "cluster.conf), each with data directory DIR/r<i>, log DIR/r<i>.log and pid file DIR/r<i>.pid, and\n"
              "waits until every replica reports that it runs. With --service fs the replicas run the shim and a\n"
              "relay listens on DIR/relay.sock (log DIR/relay.log) for `bftfs mount --relay DIR/relay.sock MNT`.\n"
              "With --norep one NO-REP server (DIR/norep, DIR/norep.log) runs instead of the replicas, and for fs a\n"
              "relay in NO-REP mode on DIR/relay.sock.");
  p.option("dir", "DIR", "cluster directory").required("dir");
  p.option("f", "F", "faults tolerated, for a new cluster", "1");
  p.option("clients", "M", "client identities, for a new cluster", "16");
  p.option("base-port", "PORT", "port of replica 0, for a new cluster", "7000");
  p.option("service", "NAME", "replicated service", "counter");
  p.flag("no-batching", "one request per pre-prepare");
  p.option("batch-max", "N", "requests per pre-prepare", "64");
  p.option("batch-window", "W", "batches in flight before requests wait to be batched", "1");
  p.flag("no-fsync", "replicas do not fdatasync their logs (NOT durable; measurements only)");
  p.flag("no-piggyback-commits", "replicas send each COMMIT at once (for measuring the piggybacking)");
  p.flag("no-batch-hold", "the primary does not wait for the clients it just answered before the next batch "
         "(for measuring the batch hold)");
  p.flag("no-quiet-primary", "the primary persists, COMMITs and votes for every batch (for measuring the quiet primary)");
  p.flag("shim", "replicas run the service behind the PBFT-CS shim");
  p.flag("early-replies", "PBFT-CS: the primary sends early speculative replies");
  p.option("corrupt-early-replies", "FRACTION", "fault injection: the primary corrupts this fraction of early replies",
           "0");
  p.option("log-level", "LEVEL", "replicas' log level", "info");
  p.option("timeout-s", "S", "how long to wait for the replicas to come up", "15");
  p.flag("norep", "start one NO-REP server (the unreplicated baseline) instead of the replicas");
  p.flag("norep-durable", "with --norep: the server logs every request before replying (bftfs norep --durable)");
  p.flag("no-relay", "with --service fs: do not start the relay");
  p.option("relay-id", "ID", "the relay's client id (default: the configuration's last client)");
  p.flag("relay-no-speculate", "the relay never delivers first replies");
  add_wan_options(p);  // passed on to every replica
  if (auto rc = p.parse(argc, argv, 3)) return *rc;
  bool ok = true;
  WanSpec wan;
  ok = get_wan_options(p, wan);
  const auto f = p.get_u64("f", ok, 1, 21);
  const auto clients = p.get_u64("clients", ok, 1, 100000);
  const auto port = p.get_u64("base-port", ok, 1, 65535 - 64);
  const auto timeout_s = p.get_u64("timeout-s", ok, 1, 3600);
  p.get_u64("batch-max", ok, 1, 1024);
  p.get_u64("batch-window", ok, 1, 1024);
  if (!ok) return kExitUsage;
  const std::string dir = p.get("dir");
  const std::string conf = dir + "/cluster.conf";
  if (!file_exists(conf)) {
    if (std::string err = generate_cluster(dir, static_cast<std::uint32_t>(f), static_cast<std::uint32_t>(clients),
                                           {"127.0.0.1"}, static_cast<std::uint16_t>(port));
        !err.empty()) {
      error("cluster start", err);
      return kExitFailure;
    }
    std::printf("generated %s (f=%llu)\n", conf.c_str(), static_cast<unsigned long long>(f));
  }
  ClusterConfig config;
  if (std::string err = load_cluster(conf, config); !err.empty()) {
    error("cluster start", err);
    return kExitFailure;
  }
  const bool norep = p.has("norep");
  const bool fs_service = p.get("service") == "fs";
  const bool relay = fs_service && !p.has("no-relay");
  NodeId relay_id = config.clients.empty() ? 0 : config.clients.back();
  if (p.has("relay-id")) relay_id = static_cast<NodeId>(p.get_u64("relay-id", ok, 0, 0xFFFFFFFEu));
  if (!ok) return kExitUsage;
  if (relay && std::find(config.clients.begin(), config.clients.end(), relay_id) == config.clients.end()) {
    error("cluster start", "the relay needs a client id of the configuration; " + std::to_string(relay_id) + " is not one");
    return kExitFailure;
  }
  for (NodeId i = 0; i < config.n; ++i) {
    const pid_t pid = read_pid(pid_path(dir, i));
    if (is_our_replica(pid)) {
      error("cluster start", "replica " + std::to_string(i) + " is already running (pid " + std::to_string(pid) +
                                 "); run `bftfs cluster stop --dir " + dir + "` first");
      return kExitFailure;
    }
  }
  for (const char* role : {"norep", "relay"}) {
    const pid_t pid = read_pid(dir + "/" + role + ".pid");
    if (is_our_process(pid, role)) {
      error("cluster start", std::string(role) + " is already running (pid " + std::to_string(pid) +
                                 "); run `bftfs cluster stop --dir " + dir + "` first");
      return kExitFailure;
    }
  }
  const std::string exe = self_executable();
  // `bftfs status` shows what has a status file: forget the processes of an earlier start in another mode.
  ::unlink(relay_status_path(dir).c_str());
  if (norep) {
    for (NodeId i = 0; i < config.n; ++i) ::unlink((data_path(dir, i) + "/status.json").c_str());
  } else {
    ::unlink((norep_data_path(dir) + "/status.json").c_str());
  }
  std::vector<Daemon> servers;
  if (norep) {
    const std::string data = norep_data_path(dir);
    ::mkdir(data.c_str(), 0755);
    ::unlink((data + "/status.json").c_str());  // readiness is judged on this incarnation's file only
    std::vector<std::string> args = {exe, "norep", "--config", conf, "--data", data, "--service", p.get("service"),
                                     "--log-level", p.get("log-level")};
    if (p.has("norep-durable")) args.push_back("--durable");
    for (auto& a : wan_arguments(p)) args.push_back(std::move(a));
    Daemon d{"norep", spawn(args, dir + "/norep.log", dir + "/norep.pid"), data + "/status.json", dir + "/norep.log", "", false};
    if (d.pid < 0) return kExitFailure;
    d.ready_line = "norep pid " + std::to_string(d.pid) + " listening " + config.replicas[0].host + ":" +
                   std::to_string(config.replicas[0].port) + " data " + data + " log " + d.log_path;
    servers.push_back(std::move(d));
  } else {
    for (NodeId i = 0; i < config.n; ++i) {
      const std::string data = data_path(dir, i);
      ::mkdir(data.c_str(), 0755);
      ::unlink((data + "/status.json").c_str());  // readiness is judged on this incarnation's file only
      std::vector<std::string> args = {exe,    "replica", "--config",   conf, "--id", std::to_string(i), "--data",
                                       data,   "--service", p.get("service"), "--log-level", p.get("log-level"),
                                       "--batch-max", p.get("batch-max"), "--batch-window", p.get("batch-window")};
      if (p.has("no-batching")) args.push_back("--no-batching");
      if (p.has("no-fsync")) args.push_back("--no-fsync");
      if (p.has("no-piggyback-commits")) args.push_back("--no-piggyback-commits");
      if (p.has("no-batch-hold")) args.push_back("--no-batch-hold");
      if (p.has("no-quiet-primary")) args.push_back("--no-quiet-primary");
      // The relay speaks PBFT-CS, whose requests only the shim understands.
      if (p.has("shim") || relay) args.push_back("--shim");
      if (p.has("early-replies")) args.push_back("--early-replies");
      if (p.get("corrupt-early-replies") != "0") {
        args.push_back("--corrupt-early-replies");
        args.push_back(p.get("corrupt-early-replies"));
      }
      for (auto& a : wan_arguments(p)) args.push_back(std::move(a));
      Daemon d{"replica " + std::to_string(i), spawn(args, log_path(dir, i), pid_path(dir, i)), data + "/status.json",
               log_path(dir, i), "", false};
      if (d.pid < 0) return kExitFailure;
      d.ready_line = "replica " + std::to_string(i) + " pid " + std::to_string(d.pid) + " listening " +
                     config.replicas[i].host + ":" + std::to_string(config.replicas[i].port) + " data " + data +
                     " log " + d.log_path;
      servers.push_back(std::move(d));
    }
  }
  // Wait for every server's status.json (written once its loop runs) naming its pid.
  if (!wait_ready(servers, timeout_s, dir)) return kExitFailure;
  if (relay) {
    // After the servers, so its first requests find them listening (it would retry anyway).
    ::unlink(relay_status_path(dir).c_str());
    std::vector<std::string> args = {exe, "relay", "--config", conf, "--id", std::to_string(relay_id), "--socket",
                                     relay_socket_path(dir), "--status", relay_status_path(dir), "--log-level",
                                     p.get("log-level")};
    if (norep) args.push_back("--norep");
    if (p.has("relay-no-speculate")) args.push_back("--no-speculate");
    for (auto& a : wan_arguments(p)) args.push_back(std::move(a));
    std::vector<Daemon> relays;
    Daemon d{"relay", spawn(args, dir + "/relay.log", dir + "/relay.pid"), relay_status_path(dir), dir + "/relay.log", "", false};
    if (d.pid < 0) return kExitFailure;
    d.ready_line = std::string("relay pid ") + std::to_string(d.pid) + " client " + std::to_string(relay_id) +
                   (norep ? " (NO-REP)" : "") + " socket " + relay_socket_path(dir) + " log " + d.log_path;
    relays.push_back(std::move(d));
    if (!wait_ready(relays, timeout_s, dir)) return kExitFailure;
  }
  std::fflush(stdout);
  return kExitOk;
}

// One process `cluster stop` stops: its name, pid file and role (the `bftfs <role>` it must be).
struct Stoppable {
  std::string name;
  std::string pid_file;
  const char* role;
};

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
    while (::kill(pids[k], 0) == 0 && is_our_process(pids[k], procs[k].role)) {
      if (mono_ms() > deadline) {
        ::kill(pids[k], SIGKILL);
        killed = true;
        sleep_ms(50);
        if (::kill(pids[k], 0) == 0 && is_our_process(pids[k], procs[k].role)) {
          error("cluster stop", procs[k].name + " (pid " + std::to_string(pids[k]) + ") survives SIGKILL");
          rc = kExitFailure;
        }
        break;
      }
      sleep_ms(10);
    }
    ::unlink(procs[k].pid_file.c_str());
    std::printf("%s (pid %d) stopped%s\n", procs[k].name.c_str(), pids[k], killed ? " with SIGKILL" : "");
  }
  return rc;
}

int cluster_stop(int argc, char** argv) {
  ArgParser p("cluster stop",
              "Stops everything `cluster start` started in DIR (the relay first, then the replicas or the NO-REP\n"
              "server): SIGTERM, then SIGKILL after a timeout.");
  p.option("dir", "DIR", "cluster directory").required("dir");
  p.option("timeout-s", "S", "seconds to wait after SIGTERM before SIGKILL", "10");
  if (auto rc = p.parse(argc, argv, 3)) return *rc;
  bool ok = true;
  const auto timeout_s = p.get_u64("timeout-s", ok, 0, 3600);
  if (!ok) return kExitUsage;
  const std::string dir = p.get("dir");
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

}  // namespace

int cmd_cluster(int argc, char** argv) {
  if (argc < 3 || std::string(argv[2]) == "--help" || std::string(argv[2]) == "-h") {
    std::FILE* out = argc < 3 ? stderr : stdout;
    std::fputs("usage: bftfs cluster start|stop --dir DIR [options]   (see bftfs cluster start --help)\n", out);
    return argc < 3 ? kExitUsage : kExitOk;
  }
  const std::string sub = argv[2];
  if (sub == "start") return cluster_start(argc, argv);
  if (sub == "stop") return cluster_stop(argc, argv);
  error("cluster", "unknown subcommand '" + sub + "' (expected start or stop)");
  return kExitUsage;
}

int cmd_status(int argc, char** argv) {
  ArgParser p("status",
              "Prints the status of a local cluster in DIR: every replica's DIR/r<i>/status.json (or the NO-REP\n"
              "server's DIR/norep/status.json) as a table, and the relay's DIR/relay.status.json. Exit 1 if a\n"
              "process that should run does not.");
  p.option("dir", "DIR", "cluster directory").required("dir");
  if (auto rc = p.parse(argc, argv, 2)) return *rc;
  const std::string dir = p.get("dir");
  ClusterConfig config;
  if (std::string err = load_cluster(dir + "/cluster.conf", config); !err.empty()) {
    error("status", err);
    return kExitFailure;
  }
  const std::uint64_t now_ms = static_cast<std::uint64_t>(::time(nullptr)) * 1000;
  const auto age_s = [now_ms](std::map<std::string, std::string>& st) {
    const std::uint64_t updated = std::strtoull(st["updated_unix_ms"].c_str(), nullptr, 10);
    return now_ms > updated ? static_cast<double>(now_ms - updated) / 1e3 : 0.0;
  };
  const auto state_of = [](std::map<std::string, std::string>& st) -> std::string {
    const pid_t pid = static_cast<pid_t>(std::atoll(st["pid"].c_str()));
    return st["running"] == "true" ? (::kill(pid, 0) == 0 ? "running" : "dead") : "stopped";
  };
  int rc = kExitOk;
  std::printf("%-5s %-8s %-8s %6s %7s %10s %10s %8s %10s %9s %7s\n", "id", "state", "pid", "view", "primary",
              "executed", "committed", "stable", "requests", "rejected", "age_s");
  // Servers: the replicas, unless this directory ran a NO-REP server and no replica.
  std::vector<std::pair<std::string, std::string>> servers;  // (id column, status file)
  const bool norep = file_exists(norep_data_path(dir) + "/status.json");
  if (!norep || file_exists(data_path(dir, 0) + "/status.json")) {
    for (NodeId i = 0; i < config.n; ++i) servers.emplace_back(std::to_string(i), data_path(dir, i) + "/status.json");
  }
  if (norep) servers.emplace_back("norep", norep_data_path(dir) + "/status.json");
  for (auto& [id, path] : servers) {
    std::map<std::string, std::string> st;
    if (std::string err = read_status_file(path, st); !err.empty()) {
      std::printf("%-5s %-8s\n", id.c_str(), "no-status");
      rc = kExitFailure;
      continue;
    }
    const std::string state = state_of(st);
    if (state != "running") rc = kExitFailure;
    std::printf("%-5s %-8s %-8s %6s %7s %10s %10s %8s %10s %9s %7.1f\n", id.c_str(), state.c_str(), st["pid"].c_str(),
                st["view"].c_str(), st["primary"].c_str(), st["last_executed"].c_str(), st["last_committed"].c_str(),
                st["stable_checkpoint"].c_str(), st["requests_executed"].c_str(), st["frames_rejected"].c_str(),
                age_s(st));
  }
  // The relay, if this cluster has one.
  std::map<std::string, std::string> st;
  if (read_status_file(relay_status_path(dir), st).empty()) {
    const std::string state = state_of(st);
    if (state != "running") rc = kExitFailure;
    std::printf("\n%-5s %-8s %-8s %-6s %7s %6s %9s %10s %10s %8s %8s %-9s %7s\n", "relay", "state", "pid", "mode",
                "client", "conns", "in_flight", "submitted", "completed", "refused", "retrans", "trusted", "age_s");
    std::printf("%-5s %-8s %-8s %-6s %7s %6s %9s %10s %10s %8s %8s %-9s %7.1f\n", "", state.c_str(), st["pid"].c_str(),
                st["mode"].c_str(), st["client_id"].c_str(), st["connections"].c_str(), st["in_flight"].c_str(),
                st["submitted"].c_str(), st["completed"].c_str(), st["refused"].c_str(), st["retransmissions"].c_str(),
                st["replicas_trusted"].c_str(), age_s(st));
    std::printf("socket %s\n", st["socket"].c_str());
  }
  return rc;
}

}  // namespace bftfs::cli
