// Where a supervised tree runs: a mount namespace it shares with its supervisor and with CRIU (so CRIU has no
// mounts to dump), with private tmpfs mounts on /run and /tmp, and a pid namespace of its own, whose init reaps
// the tree and runs the command. A restore then recreates the pid namespace, so the restored tree can never
// collide with the pids of the one it replaces.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace bftfs::criu {

// Moves the calling process, which must be single-threaded, into a new mount namespace whose mounts do not
// propagate back, with fresh tmpfs mounts on /run (CRIU keeps its kernel probe cache there, so a dump need not
// probe the kernel again) and /tmp (the tree's private scratch space, copied at every checkpoint). When the working
// directory lies under /run or /tmp, it is bind-mounted at its own path inside the new mount, with the
// directories above it recreated with their modes and owners, so the tree and CRIU reach it by the same path; the
// working directory /tmp or /run itself becomes the new, empty one. Returns "" or what failed.
[[nodiscard]] std::string enter_private_mounts();

// The tree's standard streams. The caller keeps ownership.
struct TreeStdio {
  int in = -1;
  int out = -1;
  int err = -1;
};

// Starts `argv` (argv[0] looked up in PATH) in a new pid namespace, after enter_private_mounts(). Its init (pid 1
// there) becomes a session leader without a controlling terminal and executes `init_binary`
// (criu-hooks/tree_init_main.cc, a small static program: every task of the tree adds to the cost of each dump),
// which runs the command. The init binary is executed by path inside the new mount namespace, so that all its
// mappings belong to mounts CRIU can see there. The init is a child of the caller, which must be a child subreaper
// (the init is reparented to it) and blocks SIGCHLD; it dies with the caller. Sets `init` to its pid as the caller
// sees it, and `exec_errno` to the errno of a failed exec of the init or of the command (the tree then exits at
// once with 127 for ENOENT, else 126; 125 if the init could not be executed) or 0.
[[nodiscard]] std::string spawn_tree(const std::string& init_binary, const std::vector<std::string>& argv,
                                     const TreeStdio& stdio, pid_t& init, int& exec_errno);

}  // namespace bftfs::criu
