// Shared pieces of the `bftfs` command-line tool: a small option parser with --help, and the subcommand
// entry points. Exit codes: 0 success, 1 failure at run time, 2 usage error.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runtime/wan.h"

namespace bftfs::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

class ArgParser {
 public:
  ArgParser(std::string command, std::string summary);
  // --name VALUE; `def` empty means no default (has() is false unless given).
  ArgParser& option(const std::string& name, const std::string& value_name, const std::string& help,
                    const std::string& def = "");
  // --name (boolean).
  ArgParser& flag(const std::string& name, const std::string& help);
  // Marks an option as required.
  ArgParser& required(const std::string& name);

  // Parses argv[first..]. Returns nullopt to continue, or the exit code to return (after --help, or after
  // printing a usage error).
  std::optional<int> parse(int argc, char** argv, int first);

  bool has(const std::string& name) const;
  std::string get(const std::string& name) const;
  // Numeric accessors: on a malformed number print an error and set `ok` false.
  std::uint64_t get_u64(const std::string& name, bool& ok, std::uint64_t min = 0, std::uint64_t max = UINT64_MAX) const;
  double get_double(const std::string& name, bool& ok) const;
  std::string usage() const;
  const std::string& command() const { return command_; }

 private:
  struct Spec {
    std::string name;
    std::string value_name;  // empty for flags
    std::string help;
    std::string def;
    bool required = false;
  };
  std::string command_;
  std::string summary_;
  std::vector<Spec> specs_;
  std::map<std::string, std::string> values_;
};

// WAN emulation (runtime/wan.h), the same two options on every command that runs a node (replica, norep,
// counter, cluster start): --wan-delay-ms D and --wan-site NODE=SITE[,NODE=SITE...].
void add_wan_options(ArgParser& p);
// Reads them into `out` (parse_wan_delay_ms, parse_wan_sites); on a bad value prints which option is wrong and
// why, and returns false.
[[nodiscard]] bool get_wan_options(const ArgParser& p, WanSpec& out);
// Applies --log-level (debug|info|warn|error); prints the usage error as `command` and returns false otherwise.
[[nodiscard]] bool set_log_level(const std::string& command, const std::string& level);
// The options as given, for a child process that must run with the same spec (cluster start).
std::vector<std::string> wan_arguments(const ArgParser& p);

// Prints "bftfs <command>: <message>" to stderr.
void error(const std::string& command, const std::string& message);
// Splits "a,b,c".
std::vector<std::string> split_commas(const std::string& s);
// Absolute path of the running bftfs executable (for cluster start).
std::string self_executable();

int cmd_keygen(int argc, char** argv);
int cmd_replica(int argc, char** argv);
int cmd_norep(int argc, char** argv);
int cmd_counter(int argc, char** argv);
int cmd_cluster(int argc, char** argv);
int cmd_status(int argc, char** argv);
int cmd_relay(int argc, char** argv);
int cmd_fsop(int argc, char** argv);

// The nearest-rank q-quantile (0..1) of latencies in nanoseconds, in microseconds; 0 for none. Reorders `ns`.
double percentile_us(std::vector<std::uint64_t>& ns, double q);

}  // namespace bftfs::cli
