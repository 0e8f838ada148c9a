// bftfs cluster start|stop and bftfs status: a local cluster of replica processes in the background, for
// demos, benchmarks and integration tests. Layout under DIR: cluster.conf, keys/, r<i>/ (data), r<i>.log,
// r<i>.pid.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "replica/clock.h"
#include "common/config.h"
#include "replica/cli_common.h"
#include "replica/status_file.h"

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

// True if `pid` is alive and is a `bftfs replica` process (guards against a recycled pid).
bool is_our_replica(pid_t pid) {
  if (pid <= 0 || ::kill(pid, 0) != 0) return false;
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string cmd = ss.str();
  for (auto& c : cmd) {
    if (c == '\0') c = ' ';
  }
  return cmd.find("bftfs") != std::string::npos && cmd.find(" replica ") != std::string::npos;
}

std::string tail_of(const std::string& path, std::size_t bytes) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  return s.size() > bytes ? s.substr(s.size() - bytes) : s;
}

int cluster_start(int argc, char** argv) {
  ArgParser p("cluster start",
              "Starts the n replicas of the cluster in DIR in the background (running keygen first if DIR has no\n"
              "cluster.conf), each with data directory DIR/r<i>, log DIR/r<i>.log and pid file DIR/r<i>.pid, and\n"
              "waits until every replica reports that it runs.");
  p.option("dir", "DIR", "cluster directory").required("dir");
  p.option("f", "F", "faults tolerated, for a new cluster", "1");
  p.option("clients", "M", "client identities, for a new cluster", "16");
  p.option("base-port", "PORT", "port of replica 0, for a new cluster", "7000");
  p.option("service", "NAME", "replicated service", "counter");
  p.flag("no-batching", "one request per pre-prepare");
  p.option("batch-max", "N", "requests per pre-prepare", "64");
  p.option("batch-window", "W", "batches in flight before requests wait to be batched", "1");
  p.flag("no-fsync", "replicas do not fdatasync their logs (NOT durable; measurements only)");
  p.flag("shim", "replicas run the service behind the PBFT-CS shim");
  p.flag("early-replies", "PBFT-CS: the primary sends early speculative replies");
  p.option("corrupt-early-replies", "FRACTION", "fault injection: the primary corrupts this fraction of early replies",
           "0");
  p.option("log-level", "LEVEL", "replicas' log level", "info");
  p.option("timeout-s", "S", "how long to wait for the replicas to come up", "15");
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
  for (NodeId i = 0; i < config.n; ++i) {
    const pid_t pid = read_pid(pid_path(dir, i));
    if (is_our_replica(pid)) {
      error("cluster start", "replica " + std::to_string(i) + " is already running (pid " + std::to_string(pid) +
                                 "); run `bftfs cluster stop --dir " + dir + "` first");
      return kExitFailure;
    }
  }
  const std::string exe = self_executable();
  std::vector<pid_t> pids(config.n, 0);
  for (NodeId i = 0; i < config.n; ++i) {
    const std::string data = data_path(dir, i);
    ::mkdir(data.c_str(), 0755);
    ::unlink((data + "/status.json").c_str());  // readiness is judged on this incarnation's file only
    std::vector<std::string> args = {exe,    "replica", "--config",   conf, "--id", std::to_string(i), "--data",
                                     data,   "--service", p.get("service"), "--log-level", p.get("log-level"),
                                     "--batch-max", p.get("batch-max"), "--batch-window", p.get("batch-window")};
    if (p.has("no-batching")) args.push_back("--no-batching");
    if (p.has("no-fsync")) args.push_back("--no-fsync");
    if (p.has("shim")) args.push_back("--shim");
    if (p.has("early-replies")) args.push_back("--early-replies");
    if (p.get("corrupt-early-replies") != "0") {
      args.push_back("--corrupt-early-replies");
      args.push_back(p.get("corrupt-early-replies"));
    }
    for (auto& a : wan_arguments(p)) args.push_back(std::move(a));
    const pid_t pid = ::fork();
    if (pid < 0) {
      error("cluster start", std::string("fork: ") + std::strerror(errno));
      return kExitFailure;
    }
    if (pid == 0) {
      ::setsid();  // survive the terminal and this command
      const int logfd = ::open(log_path(dir, i).c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      const int nullfd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (logfd < 0 || nullfd < 0) _exit(127);
      ::dup2(nullfd, 0);
      ::dup2(logfd, 1);
      ::dup2(logfd, 2);
      std::vector<char*> cargv;
      for (auto& a : args) cargv.push_back(a.data());
      cargv.push_back(nullptr);
      ::execv(exe.c_str(), cargv.data());
      _exit(127);
    }
    pids[i] = pid;
    std::ofstream(pid_path(dir, i)) << pid << "\n";
  }
  // Wait for every replica's status.json (written once its loop runs) naming its pid.
  const std::uint64_t deadline = mono_ms() + timeout_s * 1000;
  std::vector<bool> up(config.n, false);
  for (;;) {
    bool all = true;
    for (NodeId i = 0; i < config.n; ++i) {
      if (up[i]) continue;
      int status = 0;
      if (::waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        error("cluster start", "replica " + std::to_string(i) + " exited during start-up; end of " +
                                   log_path(dir, i) + ":\n" + tail_of(log_path(dir, i), 2000));
        return kExitFailure;
      }
      std::map<std::string, std::string> st;
      if (read_status_file(data_path(dir, i) + "/status.json", st).empty() && st["running"] == "true" &&
          st["pid"] == std::to_string(pids[i])) {
        up[i] = true;
        std::printf("replica %u pid %d listening %s:%u data %s log %s\n", i, pids[i], config.replicas[i].host.c_str(),
                    config.replicas[i].port, data_path(dir, i).c_str(), log_path(dir, i).c_str());
      } else {
        all = false;
      }
    }
    if (all) break;
    if (mono_ms() > deadline) {
      error("cluster start", "replicas did not come up within " + std::to_string(timeout_s) + " s (see " + dir +
                                 "/r*.log); stop them with `bftfs cluster stop --dir " + dir + "`");
      return kExitFailure;
    }
    sleep_ms(20);
  }
  std::fflush(stdout);
  return kExitOk;
}

int cluster_stop(int argc, char** argv) {
  ArgParser p("cluster stop", "Stops the replicas started by `cluster start` in DIR: SIGTERM, then SIGKILL after a timeout.");
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
  std::vector<pid_t> pids(config.n, 0);
  for (NodeId i = 0; i < config.n; ++i) {
    const pid_t pid = read_pid(pid_path(dir, i));
    if (!is_our_replica(pid)) {
      ::unlink(pid_path(dir, i).c_str());
      continue;
    }
    pids[i] = pid;
    ::kill(pid, SIGTERM);
  }
  const std::uint64_t deadline = mono_ms() + timeout_s * 1000;
  int rc = kExitOk;
  for (NodeId i = 0; i < config.n; ++i) {
    if (pids[i] == 0) {
      std::printf("replica %u not running\n", i);
      continue;
    }
    bool killed = false;
    while (::kill(pids[i], 0) == 0 && is_our_replica(pids[i])) {
      if (mono_ms() > deadline) {
        ::kill(pids[i], SIGKILL);
        killed = true;
        sleep_ms(50);
        if (::kill(pids[i], 0) == 0 && is_our_replica(pids[i])) {
          error("cluster stop", "replica " + std::to_string(i) + " (pid " + std::to_string(pids[i]) + ") survives SIGKILL");
          rc = kExitFailure;
        }
        break;
      }
      sleep_ms(10);
    }
    ::unlink(pid_path(dir, i).c_str());
    std::printf("replica %u (pid %d) stopped%s\n", i, pids[i], killed ? " with SIGKILL" : "");
  }
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
  ArgParser p("status", "Prints every replica's DIR/r<i>/status.json as a table.");
  p.option("dir", "DIR", "cluster directory").required("dir");
  if (auto rc = p.parse(argc, argv, 2)) return *rc;
  const std::string dir = p.get("dir");
  ClusterConfig config;
  if (std::string err = load_cluster(dir + "/cluster.conf", config); !err.empty()) {
    error("status", err);
    return kExitFailure;
  }
  std::printf("%-3s %-8s %-8s %6s %7s %10s %10s %8s %10s %9s %7s\n", "id", "state", "pid", "view", "primary",
              "executed", "committed", "stable", "requests", "rejected", "age_s");
  const std::uint64_t now_ms = static_cast<std::uint64_t>(::time(nullptr)) * 1000;
  int rc = kExitOk;
  for (NodeId i = 0; i < config.n; ++i) {
    std::map<std::string, std::string> st;
    if (std::string err = read_status_file(data_path(dir, i) + "/status.json", st); !err.empty()) {
      std::printf("%-3u %-8s\n", i, "no-status");
      rc = kExitFailure;
      continue;
    }
    const pid_t pid = static_cast<pid_t>(std::atoll(st["pid"].c_str()));
    std::string state = st["running"] == "true" ? (::kill(pid, 0) == 0 ? "running" : "dead") : "stopped";
    if (state != "running") rc = kExitFailure;
    const std::uint64_t updated = std::strtoull(st["updated_unix_ms"].c_str(), nullptr, 10);
    const double age = now_ms > updated ? static_cast<double>(now_ms - updated) / 1e3 : 0.0;
    std::printf("%-3u %-8s %-8s %6s %7s %10s %10s %8s %10s %9s %7.1f\n", i, state.c_str(), st["pid"].c_str(),
                st["view"].c_str(), st["primary"].c_str(), st["last_executed"].c_str(), st["last_committed"].c_str(),
                st["stable_checkpoint"].c_str(), st["requests_executed"].c_str(), st["frames_rejected"].c_str(), age);
  }
  return rc;
}

}  // namespace bftfs::cli
