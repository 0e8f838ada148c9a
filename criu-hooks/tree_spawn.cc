#include "criu-hooks/tree_spawn.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>

#include "common/assert.h"
#include "os/unique_fd.h"

namespace bftfs::criu {
namespace {

std::string errno_text(const std::string& what) { return what + ": " + std::strerror(errno); }

// The init's side of fork_tree, before it executes the init binary; never returns.
[[noreturn]] void start_init(const std::string& init_binary, char* const* argv, const std::string& cwd,
                             const TreeStdio& stdio, int go_fd, int exec_error_fd) {
  char go = 0;
  // The caller writes one byte once it has reaped the intermediate process that created these namespaces and made
  // the tree's mounts: from then on the caller is this process's parent, and the parent-death signal (kept across
  // exec) refers to it. End of file means the caller gave up.
  if (::read(go_fd, &go, 1) != 1) ::_exit(125);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::setsid() < 0) ::_exit(125);
  // The tree keeps CAP_SYS_ADMIN (when the invoker has it): the tree sees the host's /proc, not one of its own
  // pid namespace, so CRIU's parasite mounts a procfs of the task's pid namespace while it dumps each task,
  // which needs CAP_SYS_ADMIN in the task (measured: without it every dump fails "can't dump unprivileged task
  // whose /proc doesn't belong to it"). So a tree run as root could remount its way out of the boundary
  // (docs/SPECULATION.md §17: not a sandbox).
  if (::chdir(cwd.c_str()) != 0) {
    const int e = errno;
    [[maybe_unused]] const ssize_t w = ::write(exec_error_fd, &e, sizeof e);
    ::_exit(125);
  }
  // Out of the way first, so that no dup2 below overwrites a source it still needs.
  const int moved[4] = {::fcntl(stdio.in, F_DUPFD_CLOEXEC, 10), ::fcntl(stdio.out, F_DUPFD_CLOEXEC, 10),
                        ::fcntl(stdio.err, F_DUPFD_CLOEXEC, 10), ::fcntl(exec_error_fd, F_DUPFD_CLOEXEC, 10)};
  for (int target = 0; target < 4; ++target) {
    if (moved[target] < 0 || ::dup2(moved[target], target) < 0) ::_exit(125);
  }
  ::close_range(4, ~0u, 0);
  ::execv(init_binary.c_str(), argv);
  const int e = errno;
  [[maybe_unused]] const ssize_t w = ::write(3, &e, sizeof e);
  ::_exit(125);
}

}  // namespace

std::uint64_t pid_namespace_of(pid_t pid) {
  struct stat st{};
  const std::string path = "/proc/" + std::to_string(pid) + "/ns/pid";
  if (::stat(path.c_str(), &st) != 0) return 0;
  return static_cast<std::uint64_t>(st.st_ino);
}

std::string fork_tree(const std::string& init_binary, const std::string& park, const std::vector<std::string>& argv,
                      const std::string& cwd, const TreeStdio& stdio, PendingTree& out) {
  BFT_ASSERT(!argv.empty());
  std::vector<char*> cargv;
  cargv.push_back(const_cast<char*>(init_binary.c_str()));
  cargv.push_back(const_cast<char*>(park.c_str()));
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);

  int go[2], pid_pipe[2], exec_error[2];
  if (::pipe2(go, O_CLOEXEC) != 0) return errno_text("pipe");
  UniqueFd go_r(go[0]), go_w(go[1]);
  if (::pipe2(pid_pipe, O_CLOEXEC) != 0) return errno_text("pipe");
  UniqueFd pid_r(pid_pipe[0]), pid_w(pid_pipe[1]);
  if (::pipe2(exec_error, O_CLOEXEC) != 0) return errno_text("pipe");
  UniqueFd err_r(exec_error[0]), err_w(exec_error[1]);

  const pid_t middle = ::fork();
  if (middle < 0) return errno_text("fork");
  if (middle == 0) {
    // The intermediate process: its next child is the new namespaces' init. It reports the init's pid and exits,
    // so the init is reparented to the caller (a subreaper) and the caller's own namespaces stay unchanged.
    pid_t child = -1;
    if (::unshare(CLONE_NEWPID | CLONE_NEWIPC) == 0) child = ::fork();
    if (child == 0) {
      go_w.reset();
      pid_r.reset();
      pid_w.reset();
      err_r.reset();
      start_init(init_binary, cargv.data(), cwd, stdio, go_r.get(), err_w.get());
    }
    const pid_t report = child > 0 ? child : -errno;
    [[maybe_unused]] const ssize_t w = ::write(pid_w.get(), &report, sizeof report);
    ::_exit(0);
  }
  pid_w.reset();
  go_r.reset();
  err_w.reset();
  pid_t report = 0;
  const ssize_t n = ::read(pid_r.get(), &report, sizeof report);
  int status = 0;
  while (::waitpid(middle, &status, 0) < 0 && errno == EINTR) {
  }
  if (n != static_cast<ssize_t>(sizeof report)) return "the process that creates the pid namespace failed";
  if (report < 0) {
    errno = -report;
    return errno_text("unshare(CLONE_NEWPID | CLONE_NEWIPC) or fork");
  }
  out.init = report;
  out.pidns_ino = pid_namespace_of(report);
  if (out.pidns_ino == 0) return errno_text("the tree's pid namespace");
  out.go = std::move(go_w);
  out.exec_error = std::move(err_r);
  return "";
}

std::string release_tree(PendingTree& tree, int& exec_errno) {
  BFT_ASSERT(tree.go.valid());
  if (::write(tree.go.get(), "g", 1) != 1) return errno_text("start the tree");
  tree.go.reset();
  exec_errno = 0;
  int e = 0;
  ssize_t got = 0;
  while ((got = ::read(tree.exec_error.get(), &e, sizeof e)) < 0 && errno == EINTR) {
  }
  tree.exec_error.reset();
  if (got == static_cast<ssize_t>(sizeof e)) exec_errno = e;
  return "";
}

}  // namespace bftfs::criu
