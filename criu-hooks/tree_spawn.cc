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

// The directories a private tmpfs is mounted over.
constexpr const char* kPrivateDirs[] = {"/run", "/tmp"};

// The private directory `cwd` lies strictly under, or nullptr.
const char* private_parent(const std::string& cwd) {
  for (const char* dir : kPrivateDirs) {
    const std::size_t n = std::strlen(dir);
    if (cwd.size() > n && cwd.compare(0, n, dir) == 0 && cwd[n] == '/') return dir;
  }
  return nullptr;
}

// Recreates, inside the new tmpfs on `top`, the directories from `top` down to `cwd` with the modes and owners
// they have outside (read through `outside`, the directories as they were before the mount), then bind-mounts the
// old working directory `cwd_fd` on `cwd`.
std::string bind_back(const std::string& cwd, const char* top, const std::vector<struct stat>& outside, int cwd_fd) {
  std::size_t level = 0;
  for (std::size_t pos = std::strlen(top) + 1; pos <= cwd.size(); ++pos) {
    if (pos != cwd.size() && cwd[pos] != '/') continue;
    const std::string dir = cwd.substr(0, pos);
    BFT_ASSERT(level < outside.size());
    const struct stat& st = outside[level++];
    if (::mkdir(dir.c_str(), 0700) != 0) return errno_text("mkdir " + dir);
    if (::chown(dir.c_str(), st.st_uid, st.st_gid) != 0) return errno_text("chown " + dir);
    if (::chmod(dir.c_str(), st.st_mode & 07777) != 0) return errno_text("chmod " + dir);
  }
  const std::string source = "/proc/self/fd/" + std::to_string(cwd_fd);
  if (::mount(source.c_str(), cwd.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0)
    return errno_text("bind-mount the working directory on " + cwd);
  return "";
}

// The init's side of spawn_tree, before it executes the init binary; never returns.
[[noreturn]] void start_init(const std::string& init_binary, char* const* argv, const TreeStdio& stdio, int go_fd,
                             int exec_error_fd) {
  char go = 0;
  // The caller writes one byte once it has reaped the intermediate process that created this namespace: from then
  // on the caller is this process's parent, and the parent-death signal (kept across exec) refers to it.
  if (::read(go_fd, &go, 1) != 1) ::_exit(125);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::setsid() < 0) ::_exit(125);
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

std::string enter_private_mounts() {
  char buf[PATH_MAX];
  if (::getcwd(buf, sizeof buf) == nullptr) return errno_text("getcwd");
  const std::string cwd = buf;
  if (::unshare(CLONE_NEWNS) != 0) return errno_text("unshare(CLONE_NEWNS)");
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return errno_text("make / private");
  // Opened in the new namespace: a bind mount's source must belong to the namespace that mounts it.
  UniqueFd cwd_fd(::open(cwd.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!cwd_fd.valid()) return errno_text("open " + cwd);
  const char* top = private_parent(cwd);
  std::vector<struct stat> outside;
  if (top != nullptr) {
    for (std::size_t pos = std::strlen(top) + 1; pos <= cwd.size(); ++pos) {
      if (pos != cwd.size() && cwd[pos] != '/') continue;
      struct stat st{};
      if (::stat(cwd.substr(0, pos).c_str(), &st) != 0) return errno_text("stat " + cwd.substr(0, pos));
      outside.push_back(st);
    }
  }
  if (::mount("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755") != 0)
    return errno_text("mount tmpfs on /run");
  if (::mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777") != 0)
    return errno_text("mount tmpfs on /tmp");
  if (top != nullptr) {
    if (std::string err = bind_back(cwd, top, outside, cwd_fd.get()); !err.empty()) return err;
  }
  if (::chdir(cwd.c_str()) != 0) return errno_text("chdir " + cwd);
  return "";
}

std::string spawn_tree(const std::string& init_binary, const std::vector<std::string>& argv, const TreeStdio& stdio,
                       pid_t& init, int& exec_errno) {
  BFT_ASSERT(!argv.empty());
  std::vector<char*> cargv;
  cargv.push_back(const_cast<char*>(init_binary.c_str()));
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
    // The intermediate process: its next child is the new namespace's init. It reports the init's pid and exits,
    // so the init is reparented to the caller (a subreaper) and the caller's own pid namespace stays unchanged.
    pid_t child = -1;
    if (::unshare(CLONE_NEWPID) == 0) child = ::fork();
    if (child == 0) {
      go_w.reset();
      pid_r.reset();
      pid_w.reset();
      err_r.reset();
      start_init(init_binary, cargv.data(), stdio, go_r.get(), err_w.get());
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
    return errno_text("unshare(CLONE_NEWPID) or fork");
  }
  init = report;
  if (::write(go_w.get(), "g", 1) != 1) return errno_text("start the tree");
  go_w.reset();
  exec_errno = 0;
  int e = 0;
  ssize_t got = 0;
  while ((got = ::read(err_r.get(), &e, sizeof e)) < 0 && errno == EINTR) {
  }
  if (got == static_cast<ssize_t>(sizeof e)) exec_errno = e;
  return "";
}

}  // namespace bftfs::criu
