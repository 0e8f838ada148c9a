// bftfs run: a command's process tree run ahead of agreement on the mount it works in (docs/SPECULATION.md §8;
// criu-hooks/run_driver.h does the work). This file turns the options into a RunOptions: the mount found from
// the working directory, its daemon's control socket next to the mount's lock file, the tree's terminal or pipes.
//
// Hidden options for tests: --test-control SOCKET talks to that socket instead of a mount's daemon (a test's fake
// daemon, harness/fake_spec_daemon.py), and the working directory then plays the mount: it stays writable and,
// unless --test-fuse, gets no spec session mounted over it. A socket nobody serves plays a daemon that does not
// speak the control protocol.
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

#include "cli/cli_common.h"
#include "common/log.h"
#include "criu-hooks/boundary.h"
#include "criu-hooks/criu_service.h"
#include "criu-hooks/run_driver.h"

namespace bftfs::cli {
namespace {

using criu::kExitRunFailure;

struct RunArgs {
  std::vector<std::string> command;
  bool stats = false;
  std::string stats_json;
  bool verbose = false;
  bool no_speculate = false;
  double checkpoint_share = 0.1;
  std::uint32_t max_epoch_ms = 1000;
  std::uint32_t model_mb = 512;
  std::uint32_t images_mb = 512;
  std::string trace;
  std::string criu;
  std::uint32_t criu_log_level = 2;
  std::string test_control;
  bool test_fuse = false;
};

std::vector<std::string> split_colons(const std::string& s) {
  std::vector<std::string> out;
  for (std::size_t pos = 0; pos <= s.size();) {
    const std::size_t end = std::min(s.find(':', pos), s.size());
    if (end > pos) out.push_back(s.substr(pos, end - pos));
    pos = end + 1;
  }
  return out;
}

// `name` if it names an executable file, else the first executable `name` in PATH; "" if none.
std::string find_executable(const std::string& name) {
  auto executable = [](const std::string& p) {
    struct stat st{};
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
  };
  if (name.find('/') != std::string::npos) return executable(name) ? name : "";
  const char* path = std::getenv("PATH");
  for (const std::string& dir : split_colons(path ? path : "/usr/local/bin:/usr/bin:/bin")) {
    const std::string candidate = dir + "/" + name;
    if (executable(candidate)) return candidate;
  }
  return "";
}

// Fills the mount, the control socket and the spec session of `o` from the working directory. Returns "" or
// why `bftfs run` cannot run here.
std::string locate_mount(const RunArgs& a, criu::RunOptions& o) {
  char buf[PATH_MAX];
  if (::getcwd(buf, sizeof buf) == nullptr) return std::string("getcwd: ") + std::strerror(errno);
  criu::BoundaryPlan& plan = o.supervisor.boundary;
  plan.cwd = buf;
  if (!a.test_control.empty()) {
    plan.mount_point = plan.cwd;
    plan.spec_session = a.test_fuse;
    o.control_socket = a.test_control;
    return "";
  }
  std::ifstream in("/proc/self/mountinfo");
  std::stringstream text;
  text << in.rdbuf();
  plan.mount_point = criu::mount_containing(text.str(), plan.cwd, "fuse.bftfs");
  if (plan.mount_point.empty()) return "the working directory " + plan.cwd + " is not on a bftfs mount";
  plan.spec_session = true;
  // A daemon that does not serve `bftfs run` has no socket there: the run driver then runs CMD without speculation.
  o.control_socket = mount_lock_path(plan.mount_point) + ".ctl";
  return "";
}

int run_run(const RunArgs& a) {
  log_set_level(a.verbose ? LogLevel::kInfo : LogLevel::kWarn);
  criu::RunOptions o;
  criu::SupervisorOptions& so = o.supervisor;
  so.argv = a.command;
  const std::string self = self_executable();
  so.init_binary = self.substr(0, self.rfind('/') + 1) + "bftfs-run-init";
  so.criu_log_level = static_cast<int>(a.criu_log_level);
  so.pty = ::isatty(STDOUT_FILENO) == 1;
  so.terminal_input = so.pty && ::isatty(STDIN_FILENO) == 1;
  so.boundary.images_bytes = static_cast<std::uint64_t>(a.images_mb) << 20;
  so.criu_binary = find_executable(a.criu);
  if (so.criu_binary.empty() || !criu::CriuService::available()) {
    // Fatal only where a daemon offers speculation (the run driver decides).
    o.criu_missing = so.criu_binary.empty() ? "CRIU service binary '" + a.criu + "' not found (run `make deps`, or "
                                              "give --criu); --no-speculate runs without it"
                                            : "this bftfs was built without libcriu (run `make deps`, then rebuild); "
                                              "--no-speculate runs without it";
    so.criu_binary = a.criu;  // never started: nothing checkpoints
  }
  if (std::string err = locate_mount(a, o); !err.empty()) {
    error("run", err);
    return kExitRunFailure;
  }
  o.policy.speculate = !a.no_speculate;
  o.policy.checkpoint_share = a.checkpoint_share;
  o.policy.max_epoch_us = static_cast<std::uint64_t>(a.max_epoch_ms) * 1000;
  o.trace_path = a.trace;
  o.stats = a.stats;
  o.stats_json_path = a.stats_json;
  o.verbose = a.verbose;
  o.model_mb = a.model_mb;
  return criu::run_speculatively(o);
}

}  // namespace

void add_run(CLI::App& root, Commands& out) {
  auto a = std::make_shared<RunArgs>();
  const char* env_criu = std::getenv("BFTFS_CRIU");
  a->criu = env_criu != nullptr && *env_criu != '\0' ? env_criu : "bftfs-criu";
  CLI::App* app = root.add_subcommand("run",
      "run a command ahead of agreement on the mount, with checkpoints, held output and rollback\n\n"
      "Runs CMD in the working directory, which must be on a bftfs mount, with its requests answered from\n"
      "predictions and checkpointed by CRIU; a failed prediction rolls it back. What it prints is held until the\n"
      "epoch that printed it committed. It can change nothing outside the mount (the rest is read-only; /tmp,\n"
      "/var/tmp and /dev/shm are on the mount) and has no network but loopback. The exit status is CMD's (128+N if\n"
      "signal N ended it), reported after the last commit; 125 when bftfs run itself fails, 126 or 127 when CMD\n"
      "cannot be executed. Put -- before CMD when it has options.");
  app->add_option("command", a->command, "the command and its arguments")
      ->type_name("CMD [ARGS...]")
      ->required()
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app->add_flag("-v,--verbose", a->verbose, "print the boundary, the policy's decisions, checkpoints and rollbacks");
  app->add_flag("--stats", a->stats, "print epochs, checkpoints, rollbacks and the latency hidden at the end");
  app->add_option("--stats-json", a->stats_json, "write the same as JSON, every checkpoint and rollback listed")
      ->type_name("FILE");
  app->add_flag("--no-speculate", a->no_speculate, "never checkpoint: the same boundary, every request waits");
  app->add_option("--checkpoint-share", a->checkpoint_share,
                  "checkpoints take at most this share of the run: an epoch runs at least the checkpoint cost / X")
      ->type_name("X")
      ->check(CLI::Range(0.001, 1.0));
  app->add_option("--max-epoch-ms", a->max_epoch_ms, "longest epoch (also bounds how long output is held)")
      ->type_name("N")
      ->transform(decimal(1, 600000));
  app->add_option("--model-mb", a->model_mb, "memory the daemon's local model may use")
      ->type_name("N")
      ->transform(decimal(16, 1 << 20));
  app->add_option("--images-mb", a->images_mb, "size of the tmpfs that holds checkpoint images")
      ->type_name("N")
      ->transform(decimal(16, 1 << 20));
  app->add_option("--trace", a->trace, "one line per seal, commit, rollback and output release")->type_name("FILE");
  app->add_option("--criu", a->criu, "CRIU's service binary, a path or a name in PATH ($BFTFS_CRIU)")
      ->type_name("PATH");
  app->add_option("--criu-log-level", a->criu_log_level, "CRIU's log level in the images' dump.log and restore.log")
      ->type_name("N")
      ->transform(decimal(0, 4));
  app->add_option("--test-control", a->test_control)->group("");
  app->add_flag("--test-fuse", a->test_fuse)->group("");
  out.push_back({app, [a] { return run_run(*a); }});
}

}  // namespace bftfs::cli
