// The tree's own namespaces: a pid namespace and an IPC namespace, whose init reaps the tree and runs the command
// (docs/SPECULATION.md §8.2). The tree shares the supervisor's mount and network namespaces, in which CRIU runs
// too, so CRIU never dumps them; it dumps the pid and IPC namespaces, and a restore recreates them, so the
// restored tree never collides with the pids of the one it replaces.
//
// The init is forked first and started later: the daemon needs the tree's pid namespace (ATTACH) before the spec
// session it serves can be used, and the mounts the tree sees are made in between (criu-hooks/boundary.h).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "os/unique_fd.h"

namespace bftfs::criu {

// The tree's standard streams. The caller keeps ownership.
struct TreeStdio {
  int in = -1;
  int out = -1;
  int err = -1;
};

// A forked init that waits for release_tree().
struct PendingTree {
  pid_t init = -1;             // as the caller sees it
  std::uint64_t pidns_ino = 0;  // st_ino of its /proc/<init>/ns/pid
  UniqueFd go;                 // one byte starts it
  UniqueFd exec_error;         // the errno of a failed exec arrives here
};

// Forks the tree's init in new pid and IPC namespaces: a session leader without a controlling terminal, with the
// caller's capabilities (CRIU's dump needs CAP_SYS_ADMIN in every task: tree_spawn.cc says why), with `stdio` as
// fds 0-2, dying with the caller (PR_SET_PDEATHSIG). It waits for release_tree(), then enters
// `cwd` (resolved then, after the caller's mounts) and executes `init_binary` (criu-hooks/tree_init_main.cc, a
// small static program: every task of the tree adds to the cost of each dump), which runs `argv` (argv[0] looked
// up in PATH) and then waits in the directory `park` (tree_init_main.cc says why). The caller must be a child
// subreaper (the init is reparented to it) and block SIGCHLD.
[[nodiscard]] std::string fork_tree(const std::string& init_binary, const std::string& park,
                                    const std::vector<std::string>& argv, const std::string& cwd,
                                    const TreeStdio& stdio, PendingTree& out);

// Starts a forked init. Sets `exec_errno` to the errno of a failed exec of the init or of the command (the tree
// then exits at once: 127 for ENOENT, else 126; 125 if the init itself could not be executed or enter `cwd`), or
// 0. Returns "" or what failed.
[[nodiscard]] std::string release_tree(PendingTree& tree, int& exec_errno);

// The st_ino of /proc/<pid>/ns/pid, or 0 if it cannot be read (the process is gone).
std::uint64_t pid_namespace_of(pid_t pid);

}  // namespace bftfs::criu
