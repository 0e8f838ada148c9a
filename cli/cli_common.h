// Shared pieces of the `bftfs` command-line tool: exit codes, error printing, small helpers, and the functions
// that register each subcommand with the root app (cli/cli_options.h says how options are declared).
// Exit codes: 0 success, 1 failure at run time, 2 usage error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/cli_options.h"

namespace bftfs::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

// Each adds its subcommand (and its options) to `root` and appends the step that runs it to `out`. The
// subcommand's description starts with a one-line summary (the line `bftfs --help` shows).
void add_keygen(CLI::App& root, Commands& out);          // cli_keygen.cc
void add_replica(CLI::App& root, Commands& out);         // cli_daemons.cc
void add_norep(CLI::App& root, Commands& out);           // cli_daemons.cc
void add_counter(CLI::App& root, Commands& out);         // cli_counter.cc
void add_relay(CLI::App& root, Commands& out);           // cli_relay.cc
void add_fsop(CLI::App& root, Commands& out);            // cli_fsop.cc
void add_cluster(CLI::App& root, Commands& out);         // cli_cluster.cc (cluster start and cluster stop)
void add_status(CLI::App& root, Commands& out);          // cli_status.cc
void add_mount(CLI::App& root, Commands& out);           // cli_mount.cc
void add_umount(CLI::App& root, Commands& out);          // cli_mount.cc
void add_run(CLI::App& root, Commands& out);             // cli_run.cc

// Prints "bftfs <command>: <message>" to stderr.
void error(const std::string& command, const std::string& message);
// Splits "a,b,c", dropping empty items.
std::vector<std::string> split_commas(const std::string& s);
// Absolute path of the running bftfs executable (for cluster start).
std::string self_executable();

// The nearest-rank q-quantile (0..1) of latencies in nanoseconds, in microseconds; 0 for none. Reorders `ns`.
double percentile_us(std::vector<std::uint64_t>& ns, double q);

}  // namespace bftfs::cli
