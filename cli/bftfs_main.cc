// bftfs: one executable for every daemon and tool of the project. Each subcommand registers its options with
// the root app (cli/cli_options.h), so `bftfs --help` and `bftfs <command> --help` come from one place.
#include <cstdio>
#include <cstring>

#include "cli/cli_common.h"

int main(int argc, char** argv) {
  using namespace bftfs::cli;
  CLI::App root("Byzantine-fault-tolerant replicated file system: daemons, clients and tools.", "bftfs");
  configure_root(root);
  Commands commands;
  add_keygen(root, commands);
  add_replica(root, commands);
  add_norep(root, commands);
  add_counter(root, commands);
  add_relay(root, commands);
  add_fsop(root, commands);
  add_cluster(root, commands);
  add_status(root, commands);
  add_mount(root, commands);
  add_umount(root, commands);
  add_run(root, commands);
  root.footer("bftfs <command> --help prints the options of a command.");
  if (argc < 2) {
    std::fputs(root.help().c_str(), stderr);
    return kExitUsage;
  }
  char help_flag[] = "--help";
  if (argc == 2 && std::strcmp(argv[1], "help") == 0) argv[1] = help_flag;  // `bftfs help` as before
  if (const auto rc = parse_command_line(root, argc, argv)) return *rc;
  for (const Command& c : commands) {
    if (c.app->parsed()) return c.run();
  }
  std::fputs(root.help().c_str(), stderr);  // a command with subcommands of its own and none given
  return kExitUsage;
}
