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
// there) becomes a session leader without a controlling terminal and executes
// `self_exe` -- this program, by path, so that every mapping of the init belongs to the new mount namespace, as
// CRIU requires -- as tree_init_main(), which runs the command. The init is a child of the caller, which must be a
// child subreaper (it is reparented to the caller) and blocks SIGCHLD; it dies with the caller. Sets `init` to
// its pid as the caller sees it, and `exec_errno` to the errno of a failed exec of the init or of the command
// (the tree then exits at once with 127 for ENOENT, else 126; 125 if the init could not be executed) or 0.
[[nodiscard]] std::string spawn_tree(const std::string& self_exe, const std::vector<std::string>& argv,
                                     const TreeStdio& stdio, pid_t& init, int& exec_errno);

// argv[0] of the tree's init: a program whose argv[0] is this runs tree_init_main() instead of its usual main.
inline constexpr const char* kTreeInitArgv0 = "bftfs-run-init";

// The tree's init, as spawn_tree() executes it with argv = {kTreeInitArgv0, CMD, ARGS...}, fds 0-2 the
// command's stdin, stdout and stderr and fd 3 where a failed exec of the command is reported (an errno). It forks
// the command as pid 2 with only fds 0-2 and default signal handling, closes all its own fds (so its image holds
// no file), reaps every process of the namespace, and exits with the command's exit code (128+N when signal N
// killed it); when it exits the kernel kills whatever is left in the namespace. Never returns.
[[noreturn]] void tree_init_main(int argc, char** argv);

}  // namespace bftfs::criu
