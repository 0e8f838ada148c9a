// bftfs-run-init: the init of a tree under `bftfs run` (pid 1 of its pid namespace; criu-hooks/tree_spawn.h).
//
// fork_tree() executes it as `bftfs-run-init PARK CMD ARGS...` with fds 0-2 the command's stdin, stdout and
// stderr and fd 3 where a failed exec of the command is reported (its errno). It forks the command as pid 2 with
// only fds 0-2 and default signal handling, closes all its own fds (its image then holds no file, and it keeps no
// pipe or terminal open), moves to the directory PARK, reaps every process of the namespace, and exits with the
// command's exit code (128+N when signal N killed it); when it exits the kernel kills whatever is left in the
// namespace.
//
// Why PARK: at every dump CRIU's parasite, in the namespace's root task (this one), makes a directory
// `proc.crtools` in the task's working directory, mounts a procfs there and removes it. Left in the command's
// directory on the mount, that is a MKDIR, lookups and an RMDIR on the spec session per dump: replicated requests
// across a WAN when the stretch before the dump does not speculate, entries in the epoch when it does. PARK is a
// tiny tmpfs off the mount (criu-hooks/boundary.h, kInitPark). A PARK that cannot be entered is ignored: the
// dumps are then only slower.
//
// It is a separate, statically linked program because every task of the tree is dumped at every checkpoint: this
// one has a handful of mappings and a few pages (the bftfs executable as init made each dump about 10 ms slower).
// Signals sent to the tree reach the command as they would outside a pid namespace; the init itself, a
// namespace's init without handlers, ignores them.
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char** argv) {
  if (argc < 3 || ::fcntl(3, F_SETFD, FD_CLOEXEC) != 0) ::_exit(125);
  const pid_t cmd = ::fork();
  if (cmd < 0) ::_exit(125);
  if (cmd == 0) {
    // The supervisor's blocked and ignored signals survived the execs: the command starts clean.
    sigset_t none;
    ::sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int sig = 1; sig < NSIG; ++sig) {
      if (sig != SIGKILL && sig != SIGSTOP) ::signal(sig, SIG_DFL);
    }
    ::execvp(argv[2], argv + 2);
    const int e = errno;
    [[maybe_unused]] const ssize_t w = ::write(3, &e, sizeof e);
    ::_exit(e == ENOENT ? 127 : 126);
  }
  ::close_range(0, ~0u, 0);
  [[maybe_unused]] const int parked = ::chdir(argv[1]);
  for (;;) {
    int status = 0;
    const pid_t p = ::waitpid(-1, &status, 0);
    if (p == cmd) ::_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    if (p < 0 && errno == ECHILD) ::_exit(125);  // cannot happen: the command is our child until we reap it
  }
}
