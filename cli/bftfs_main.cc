// bftfs: one executable for every daemon and tool of the project. Each subcommand has --help.
#include <cstdio>
#include <cstring>
#include <string>

#include "cli/cli_mount.h"
#include "cli/cli_common.h"

namespace {

void print_usage(FILE* out) {
  std::fputs(
      "usage: bftfs <command> [options]    (bftfs <command> --help for its options)\n\n"
      "commands:\n"
      "  keygen     write cluster.conf and keys for a new cluster\n"
      "  replica    run one PBFT replica\n"
      "  norep      run the unreplicated (NO-REP) baseline server\n"
      "  counter    run counter clients against a cluster or a NO-REP server; prints latency or throughput\n"
      "  relay      run the relay that FUSE mounts talk to (Unix socket -> PBFT-CS requests)\n"
      "  fsop       one file operation by path through a relay, without FUSE (scripts, tests)\n"
      "  cluster    start or stop a local cluster in the background (cluster start|stop --help)\n"
      "  status     print the status of every replica and the relay of a local cluster\n"
      "  mount      mount the file system with FUSE (bftfs umount MNT to unmount)\n",
      out);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace bftfs::cli;
  if (argc < 2) {
    print_usage(stderr);
    return kExitUsage;
  }
  const std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    print_usage(stdout);
    return kExitOk;
  }
  if (cmd == "keygen") return cmd_keygen(argc, argv);
  if (cmd == "replica") return cmd_replica(argc, argv);
  if (cmd == "norep") return cmd_norep(argc, argv);
  if (cmd == "counter") return cmd_counter(argc, argv);
  if (cmd == "cluster") return cmd_cluster(argc, argv);
  if (cmd == "status") return cmd_status(argc, argv);
  if (cmd == "mount") return bftfs::client::cmd_mount(argc, argv);
  if (cmd == "umount") return bftfs::client::cmd_umount(argc, argv);
  if (cmd == "relay") return cmd_relay(argc, argv);
  if (cmd == "fsop") return cmd_fsop(argc, argv);
  std::fprintf(stderr, "bftfs: unknown command '%s'\n", cmd.c_str());
  print_usage(stderr);
  return kExitUsage;
}
