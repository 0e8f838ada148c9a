// bftfs run: a command's process tree under checkpoint control (criu-hooks/supervisor.h).
//
// Without speculation (still to come) the tree runs unchecked and its output flows straight out; the hidden
// --test-* options take a checkpoint every N ms, keep one epoch uncommitted behind the open one, and roll back to
// it after chosen checkpoints, so that tests and measurements can exercise the mechanism end to end.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>

#include "cli/cli_common.h"
#include "common/log.h"
#include "criu-hooks/supervisor.h"
#include "os/clock.h"

namespace bftfs::cli {
namespace {

// The supervisor's own failures, distinct from the command's exit codes (as env(1) and timeout(1) do).
constexpr int kExitRunFailure = 125;

struct RunArgs {
  std::vector<std::string> command;
  bool stats = false;
  bool verbose = false;
  std::string criu;
  std::string images_dir;
  std::uint32_t criu_log_level = 2;
  std::uint32_t test_checkpoint_ms = 0;
  std::string test_rollback_after;
  std::string test_stats_json;
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

std::uint64_t quantile(std::vector<std::uint64_t> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5))];
}

double ms(std::uint64_t us) { return static_cast<double>(us) / 1000.0; }

void print_stats(const criu::SupervisorStats& s) {
  std::vector<std::uint64_t> wall, frozen, work, bytes, total, kill, tmp, restore;
  for (const auto& c : s.checkpoints) {
    wall.push_back(c.wall_us);
    frozen.push_back(c.frozen_us);
    work.push_back(c.frozen_work_us);
    bytes.push_back(c.image_bytes);
  }
  for (const auto& r : s.restores) {
    total.push_back(r.total_us);
    kill.push_back(r.kill_reap_us);
    tmp.push_back(r.tmp_us);
    restore.push_back(r.restore_us);
  }
  std::fprintf(stderr,
               "bftfs run: checkpoints %zu (%llu failed): dump p50 %.1f ms, max %.1f ms; frozen p50 %.1f ms, max "
               "%.1f ms (of which output cut and /tmp copy p50 %.1f ms); images p50 %.2f MiB\n",
               s.checkpoints.size(), static_cast<unsigned long long>(s.checkpoint_failures), ms(quantile(wall, 0.5)),
               ms(quantile(wall, 1)), ms(quantile(frozen, 0.5)), ms(quantile(frozen, 1)), ms(quantile(work, 0.5)),
               static_cast<double>(quantile(bytes, 0.5)) / (1 << 20));
  std::fprintf(stderr,
               "bftfs run: rollbacks %zu: p50 %.1f ms, max %.1f ms (kill and reap p50 %.1f ms, /tmp %.1f ms, restore "
               "%.1f ms)\n",
               s.restores.size(), ms(quantile(total, 0.5)), ms(quantile(total, 1)), ms(quantile(kill, 0.5)),
               ms(quantile(tmp, 0.5)), ms(quantile(restore, 0.5)));
  std::fprintf(stderr,
               "bftfs run: epochs committed %llu, discarded %llu; output released %llu bytes, dropped %llu, held at "
               "most %llu; stdin replayed %llu bytes\n",
               static_cast<unsigned long long>(s.epochs_committed), static_cast<unsigned long long>(s.epochs_discarded),
               static_cast<unsigned long long>(s.output_bytes_released),
               static_cast<unsigned long long>(s.output_bytes_dropped),
               static_cast<unsigned long long>(s.output_bytes_held_max),
               static_cast<unsigned long long>(s.stdin_bytes_replayed));
}

// Every checkpoint and restore with its costs, for tests and measurement scripts.
void write_stats_json(std::ofstream& out, const criu::SupervisorStats& s, int exit_code) {
  out << "{\"exit_code\": " << exit_code << ", \"checkpoint_failures\": " << s.checkpoint_failures
      << ", \"epochs_committed\": " << s.epochs_committed << ", \"epochs_discarded\": " << s.epochs_discarded
      << ", \"output_bytes_released\": " << s.output_bytes_released
      << ", \"output_bytes_dropped\": " << s.output_bytes_dropped
      << ", \"stdin_bytes_replayed\": " << s.stdin_bytes_replayed << ",\n \"checkpoints\": [";
  for (std::size_t i = 0; i < s.checkpoints.size(); ++i) {
    const auto& c = s.checkpoints[i];
    out << (i ? ",\n  " : "\n  ") << "{\"epoch\": " << c.epoch << ", \"wall_us\": " << c.wall_us
        << ", \"frozen_us\": " << c.frozen_us << ", \"freezing_us\": " << c.freezing_us
        << ", \"frozen_work_us\": " << c.frozen_work_us << ", \"image_bytes\": " << c.image_bytes << "}";
  }
  out << "],\n \"restores\": [";
  for (std::size_t i = 0; i < s.restores.size(); ++i) {
    const auto& r = s.restores[i];
    out << (i ? ",\n  " : "\n  ") << "{\"epoch\": " << r.epoch << ", \"total_us\": " << r.total_us
        << ", \"kill_reap_us\": " << r.kill_reap_us << ", \"tmp_us\": " << r.tmp_us
        << ", \"restore_us\": " << r.restore_us << "}";
  }
  out << "]}\n";
}

// The test driver: a checkpoint every `period_ms`; all epochs but the last two committed after each; after the
// checkpoints counted in `rollback_after`, one rollback to the epoch before the newest. Returns the exit code.
int drive_test_epochs(criu::Supervisor& sup, std::uint64_t period_ms, const std::set<std::uint64_t>& rollback_after) {
  std::uint64_t taken = 0;
  std::string last_error;  // a failure that repeats is reported once
  std::uint64_t next = mono_ms() + period_ms;
  while (!sup.tree_exited()) {
    const std::uint64_t now = mono_ms();
    if (now < next) {
      sup.pump(static_cast<int>(next - now));
      continue;
    }
    criu::EpochId id = 0;
    if (const std::string err = sup.begin_epoch(id); !err.empty()) {
      sup.pump(0);
      if (!sup.tree_exited() && err != last_error) error("run", "checkpoint failed: " + err);  // else it was exiting
      last_error = err;
      next = mono_ms() + period_ms;
      continue;
    }
    ++taken;
    std::vector<criu::EpochId> open = sup.uncommitted();
    while (open.size() > 2) {
      sup.commit_epoch(open.front());
      open.erase(open.begin());
    }
    if (rollback_after.count(taken) && open.size() == 2) {
      if (const std::string err = sup.rollback_to(open.front()); !err.empty()) {
        error("run", "rollback failed: " + err);
        return kExitRunFailure;
      }
    }
    next = mono_ms() + period_ms;
  }
  for (criu::EpochId e : sup.uncommitted()) sup.commit_epoch(e);
  return sup.finish();
}

int run_run(const RunArgs& a) {
  if (!a.test_rollback_after.empty() && a.test_checkpoint_ms == 0) {
    error("run", "--test-rollback-after needs --test-checkpoint-ms");
    return kExitUsage;
  }
  log_set_level(a.verbose ? LogLevel::kInfo : LogLevel::kWarn);
  std::set<std::uint64_t> rollback_after;
  for (const std::string& k : split_commas(a.test_rollback_after)) {
    rollback_after.insert(std::strtoull(k.c_str(), nullptr, 10));
  }
  criu::SupervisorOptions options;
  options.argv = a.command;
  const std::string self = self_executable();
  options.init_binary = self.substr(0, self.rfind('/') + 1) + "bftfs-run-init";
  options.images_dir = a.images_dir;
  options.criu_log_level = static_cast<int>(a.criu_log_level);
  options.pty = ::isatty(STDOUT_FILENO) == 1;
  options.criu_binary = find_executable(a.criu);
  if (options.criu_binary.empty()) {
    if (a.test_checkpoint_ms > 0) {
      error("run", "CRIU service binary '" + a.criu + "' not found (run `make deps`, or give --criu)");
      return kExitRunFailure;
    }
    options.criu_binary = a.criu;  // not needed: nothing checkpoints
  }
  // Opened before the supervisor makes /tmp private: the path is the user's.
  std::ofstream stats_json;
  if (!a.test_stats_json.empty()) {
    stats_json.open(a.test_stats_json);
    if (!stats_json) {
      error("run", "cannot write " + a.test_stats_json);
      return kExitRunFailure;
    }
  }
  std::unique_ptr<criu::Supervisor> sup;
  if (const std::string err = criu::Supervisor::start(options, sup); !err.empty()) {
    error("run", err);
    return kExitRunFailure;
  }
  if (sup->exec_errno() != 0) error("run", a.command.front() + ": " + std::strerror(sup->exec_errno()));
  const int code =
      a.test_checkpoint_ms > 0 ? drive_test_epochs(*sup, a.test_checkpoint_ms, rollback_after) : sup->finish();
  if (a.stats) print_stats(sup->stats());
  if (stats_json.is_open()) write_stats_json(stats_json, sup->stats(), code);
  return code;
}

}  // namespace

void add_run(CLI::App& root, Commands& out) {
  auto a = std::make_shared<RunArgs>();
  const char* env_criu = std::getenv("BFTFS_CRIU");
  a->criu = env_criu != nullptr && *env_criu != '\0' ? env_criu : "bftfs-criu";
  CLI::App* app = root.add_subcommand("run",
      "run a command under checkpoint control (the mechanism of speculative execution)\n\n"
      "Runs CMD's process tree in its own pid namespace and a private mount namespace with empty tmpfs mounts on\n"
      "/run and /tmp (a working directory under them is kept), with stdout and stderr through a pty when stdout is\n"
      "a terminal (else pipes) and stdin forwarded. The exit status is CMD's (128+N if signal N ended it); 125 when\n"
      "bftfs run itself fails, 126 or 127 when CMD cannot be executed. Put -- before CMD when it has options.");
  app->add_option("command", a->command, "the command and its arguments")
      ->type_name("CMD [ARGS...]")
      ->required()
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app->add_flag("--stats", a->stats, "print checkpoints, rollbacks and their costs to stderr at the end");
  app->add_flag("-v,--verbose", a->verbose, "log every checkpoint, commit and rollback to stderr");
  app->add_option("--criu", a->criu, "CRIU's service binary, a path or a name in PATH ($BFTFS_CRIU)")
      ->type_name("PATH");
  app->add_option("--images-dir", a->images_dir, "keep checkpoint images in DIR instead of memory")->type_name("DIR");
  app->add_option("--criu-log-level", a->criu_log_level, "CRIU's log level in the images' dump.log and restore.log")
      ->type_name("N")
      ->transform(decimal(0, 4));
  // Tests and measurements only: checkpoints and rollbacks without speculation. Hidden options have no name in
  // CLI11's messages, so their validators name them.
  app->add_option("--test-checkpoint-ms", a->test_checkpoint_ms)
      ->group("")
      ->transform(CLI::Validator(
          [](std::string& v) {
            std::string err = decimal(1, 3600000)(v);
            return err.empty() ? err : "--test-checkpoint-ms: " + err;
          },
          ""));
  app->add_option("--test-rollback-after", a->test_rollback_after)
      ->group("")
      ->check([](const std::string& v) -> std::string {
        const auto ks = split_commas(v);
        if (ks.empty()) return "--test-rollback-after: expected K[,K...]";
        for (const std::string& k : ks) {
          const bool number = !k.empty() && k.size() <= 9 && k.find_first_not_of("0123456789") == std::string::npos;
          if (!number || std::strtoull(k.c_str(), nullptr, 10) < 2)
            return "--test-rollback-after: each K must be a checkpoint number >= 2, got '" + k + "'";
        }
        return "";
      });
  app->add_option("--test-stats-json", a->test_stats_json)->group("");
  out.push_back({app, [a] { return run_run(*a); }});
}

}  // namespace bftfs::cli
