// How every `bftfs` subcommand declares and parses its options: one CLI11 app (the root, `bftfs`) with a
// subcommand per command, a help layout shared by all of them, and the validators the commands have in common.
//
// A command registers itself with an add_<command> function (cli/cli_common.h): it adds a subcommand to the
// root, binds each option to a field of its own options struct (each option with a one-line description and
// its value name), and returns the step that runs the command once the command line parsed. Parsing checks
// everything that can be checked without running anything (names, numbers, ranges, formats, options that need
// or exclude each other), so the run step starts from valid options.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/log.h"
#include "runtime/wan.h"

namespace bftfs::cli {

// A registered subcommand: its CLI11 app and the step that runs it after a successful parse, returning the
// process exit code (cli/cli_common.h).
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};
using Commands = std::vector<Command>;

// Sets up `root` as the `bftfs` app: the shared help layout, last-one-wins for repeated options, defaults shown
// in --help, exactly one subcommand.
void configure_root(CLI::App& root);

// Parses argv with `root`. Returns nullopt to go on and run the parsed command, or the exit code to return:
// 0 after printing the help asked for (to stdout), 2 after a usage error, printed on one line to stderr as
// "bftfs <command>: <what is wrong> (see bftfs <command> --help)".
std::optional<int> parse_command_line(CLI::App& root, int argc, char** argv);

// Validators. Each rejects a value with a message that `parse_command_line` prints after the option's name.

// A decimal integer in [min, max]: digits only (no sign, no base prefix; "010" is ten). A transform: it
// rewrites the value without leading zeros, because CLI11 itself would read "010" as octal.
CLI::Validator decimal(std::uint64_t min, std::uint64_t max);
// A number >= 0 as strtod reads it (so "1.5", "2e3" and "inf"; not "nan").
CLI::Validator non_negative_number();
// A number in [0, max] as strtod reads it.
CLI::Validator number_up_to(double max);
// A number in [0, 1] as strtod reads it.
CLI::Validator fraction();
// An octal number in [0, max] (permissions such as 0644).
CLI::Validator octal(std::uint32_t max);
// HOST:PORT (runtime/transport.h parse_host_port).
CLI::Validator host_port();
// One of `names`.
CLI::Validator one_of(std::vector<std::string> names);

// --log-level LEVEL (debug|info|warn|error) with the given default, bound to `out`.
CLI::Option* add_log_level(CLI::App& app, std::string& out, const std::string& help);
// The level a value accepted by add_log_level's validator stands for.
LogLevel log_level_of(const std::string& name);
// Reads an octal value accepted by octal().
std::uint32_t octal_value(const std::string& text);

// WAN emulation (runtime/wan.h), the same two options on every command that runs a node (replica, norep,
// counter, relay, cluster start): --wan-delay-ms D and --wan-site NODE=SITE[,NODE=SITE...], kept as given so
// that cluster start can pass them on unchanged.
struct WanArgs {
  std::string delay_ms = "0";
  std::string sites;  // empty: every node is its own site
};
void add_wan_options(CLI::App& app, WanArgs& out);
// The spec the options stand for (they passed their validators, so this cannot fail).
WanSpec wan_spec(const WanArgs& args);
// The options as given, for a child process that must run with the same spec (cluster start).
std::vector<std::string> wan_arguments(const WanArgs& args);

// The relay's 1% rule (PBFT-CS §3.4; relay/relay_daemon.h): --distrust-above PERMILLE and --distrust-window N,
// on `bftfs relay` and passed on by `cluster start`.
struct DistrustArgs {
  std::uint32_t above_permille = 10;
  std::uint32_t window = 100;
};
void add_distrust_options(CLI::App& app, DistrustArgs& out);
std::vector<std::string> distrust_arguments(const DistrustArgs& args);

}  // namespace bftfs::cli
