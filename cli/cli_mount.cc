#define FUSE_USE_VERSION FUSE_MAKE_VERSION(3, 14)
#include "cli/cli_mount.h"

#include <fuse_lowlevel.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <memory>
#include <string>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/fuse_client.h"
#include "client/local_backend.h"
#include "client/relay_backend.h"
#include "common/log.h"
#include "storage/data_dir_lock.h"
#include "storage/file_snapshot_store.h"
#include "os/unique_fd.h"

namespace bftfs::client {

namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

const char* const kMountUsage =
    "usage: bftfs mount (--relay SOCK | --local DIR) MNT [options]\n"
    "\n"
    "Mounts the bftfs file system at MNT (a FUSE daemon; it detaches unless -f).\n"
    "\n"
    "backend (one of):\n"
    "  --relay SOCK           a `bftfs relay` listening on the Unix socket SOCK (the replicated file system);\n"
    "                         while it is unreachable, operations wait and retry (a hard mount)\n"
    "  --local DIR            the file service in this process, no network or replication (the FUSE\n"
    "                         passthrough baseline); its state is saved in DIR at unmount and loaded at mount\n"
    "options:\n"
    "  -f                     stay in the foreground\n"
    "  -o OPTS                extra FUSE mount options (comma list)\n"
    "  --attr-timeout S       seconds the kernel caches attributes (default 1)\n"
    "  --entry-timeout S      seconds the kernel caches names (default 1)\n"
    "  --negative-timeout S   seconds the kernel caches \"no such name\" (default 1)\n"
    "  --no-default-permissions  let the service alone decide permissions (access() and open() ask it)\n"
    "  --log FILE             append the daemon's log to FILE (default: stderr while in the foreground)\n"
    "  --status FILE          write the mount's counters (FUSE requests, requests sent, cache hits) to FILE\n"
    "                         as JSON every second and at exit\n"
    "\n"
    "Semantics: close-to-open consistency, write-behind made final by close and fsync, hard-mount retries\n"
    "that an interrupt (e.g. Ctrl-C) ends with EINTR. Unmount with `bftfs umount MNT`.\n";

const char* const kUmountUsage =
    "usage: bftfs umount MNT [--lazy]\n"
    "\n"
    "Unmounts a bftfs mount and waits until its daemon has made its pending writes final and exited (so a\n"
    "following mount or rmdir works).\n"
    "  --lazy   detach now even if busy (the mount goes away when no longer used); does not wait\n";

bool parse_seconds(const char* s, double& out) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s, &end);
  if (errno != 0 || end == s || *end != '\0' || !(v >= 0) || v > 86400) return false;
  out = v;
  return true;
}

int usage_error(const char* usage, const std::string& message) {
  std::fprintf(stderr, "bftfs mount: %s\n\n%s", message.c_str(), usage);
  return kExitUsage;
}

// The mount-point lock: a mount daemon holds an exclusive flock on a file named after its mount point for its
// whole life (inherited across fuse_daemonize's fork, released only when the process exits, after its writes
// are final and its state is saved). `bftfs umount` takes the lock after unmounting, so it returns only when
// the daemon is gone and a following mount of the same point or directory, or an rmdir, just works.
// The name is the FNV-1a hash of the mount point's path with its parent resolved (the mount point itself is
// never resolved: that would ask the file system, which may be hung).
const char* const kMountLockDir = "/tmp/.bftfs-mount-locks";

std::string mount_lock_path(const std::string& mountpoint) {
  std::string path = mountpoint;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const std::size_t slash = path.rfind('/');
  const std::string parent = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  char* real = ::realpath(parent.c_str(), nullptr);
  std::string full = real != nullptr ? std::string(real) + "/" + base : path;
  std::free(real);
  std::uint64_t h = 14695981039346656037ull;
  for (const unsigned char c : full) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char name[64];
  std::snprintf(name, sizeof(name), "/%016llx.lock", static_cast<unsigned long long>(h));
  return std::string(kMountLockDir) + name;
}

// Takes the mount-point lock for this daemon (waits up to 3 s for a daemon that is just finishing). Returns
// the held fd, or an empty one (then logged: only `bftfs umount`'s wait is affected).
UniqueFd take_mount_lock(const std::string& mountpoint) {
  if (::mkdir(kMountLockDir, 01777) == 0) ::chmod(kMountLockDir, 01777);  // umask would clear bits
  const std::string path = mount_lock_path(mountpoint);
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (fd.get() < 0) {
    std::fprintf(stderr, "bftfs mount: warning: %s: %s (umount will not wait for this daemon)\n", path.c_str(),
                 std::strerror(errno));
    return UniqueFd();
  }
  for (int i = 0; i < 60; ++i) {
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) == 0) return fd;
    ::usleep(50 * 1000);
  }
  std::fprintf(stderr, "bftfs mount: warning: another bftfs daemon still holds %s (a lazily unmounted one?); "
               "umount will wait for it too\n", path.c_str());
  return UniqueFd();
}

// After an unmount: waits until the daemon that served `mountpoint` has exited (its lock is free).
void wait_for_daemon(const std::string& mountpoint) {
  const std::string path = mount_lock_path(mountpoint);
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return;  // no daemon ever locked it (or an older bftfs)
  // Usually the daemon is gone within moments; say why we wait only if it takes longer.
  for (int i = 0; i < 40; ++i) {
    if (::flock(fd.get(), LOCK_SH | LOCK_NB) == 0) return;
    ::usleep(50 * 1000);
  }
  std::fprintf(stderr, "bftfs umount: waiting for the daemon of %s to make its writes final and exit "
               "(Ctrl-C stops waiting; the daemon carries on)\n", mountpoint.c_str());
  while (::flock(fd.get(), LOCK_SH) != 0 && errno == EINTR) {
  }
}

}  // namespace

int cmd_mount(int argc, char** argv) {
  std::string relay_sock, local_dir, mountpoint, fuse_opts, log_file;
  bool foreground = false;
  MountOptions mo;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](std::string& out) {
      if (i + 1 >= argc) return false;
      out = argv[++i];
      return true;
    };
    std::string v;
    if (a == "--help" || a == "-h") {
      std::fputs(kMountUsage, stdout);
      return kExitOk;
    } else if (a == "--relay") {
      if (!value(relay_sock)) return usage_error(kMountUsage, "--relay needs a socket path");
    } else if (a == "--local") {
      if (!value(local_dir)) return usage_error(kMountUsage, "--local needs a directory");
    } else if (a == "-f") {
      foreground = true;
    } else if (a == "-o") {
      if (!value(v)) return usage_error(kMountUsage, "-o needs options");
      fuse_opts = fuse_opts.empty() ? v : fuse_opts + "," + v;
    } else if (a == "--attr-timeout" || a == "--entry-timeout" || a == "--negative-timeout") {
      double s = 0;
      if (!value(v) || !parse_seconds(v.c_str(), s)) return usage_error(kMountUsage, a + " needs seconds (0..86400)");
      (a == "--attr-timeout" ? mo.attr_timeout_s : a == "--entry-timeout" ? mo.entry_timeout_s : mo.negative_timeout_s) = s;
    } else if (a == "--no-default-permissions") {
      mo.default_permissions = false;
    } else if (a == "--log") {
      if (!value(log_file)) return usage_error(kMountUsage, "--log needs a file");
    } else if (a == "--status") {
      if (!value(mo.status_path)) return usage_error(kMountUsage, "--status needs a file");
    } else if (!a.empty() && a[0] == '-') {
      return usage_error(kMountUsage, "unknown option " + a);
    } else if (mountpoint.empty()) {
      mountpoint = a;
    } else {
      return usage_error(kMountUsage, "more than one mount point");
    }
  }
  if (mountpoint.empty()) return usage_error(kMountUsage, "no mount point");
  if (!mo.status_path.empty() && mo.status_path[0] != '/') {
    // The daemon detaches into "/": keep the path the user meant.
    char cwd[4096];
    if (::getcwd(cwd, sizeof cwd) != nullptr) mo.status_path = std::string(cwd) + "/" + mo.status_path;
  }
  if (local_dir.empty() == relay_sock.empty()) {
    return usage_error(kMountUsage, "exactly one backend is required (--relay SOCK or --local DIR)");
  }
  struct stat st {};
  if (::stat(mountpoint.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    std::fprintf(stderr, "bftfs mount: %s is not a directory\n", mountpoint.c_str());
    return kExitFailure;
  }

  // Declared first, so released last (after the state is saved and the other locks are gone).
  UniqueFd mount_lock = take_mount_lock(mountpoint);
  std::unique_ptr<FileSnapshotStore> store;
  // Two daemons on one --local directory would each save their own state over the other's: the second mount
  // fails instead (the lock is held until this process exits, after the state is saved).
  DataDirLock lock;
  if (!local_dir.empty()) {
    // A daemon unmounted without `bftfs umount` (fusermount3 -u) may still be saving its state: give it a moment.
    std::string lerr = lock.acquire(local_dir);
    for (int i = 0; i < 60 && !lerr.empty(); ++i) {
      ::usleep(50 * 1000);
      lerr = lock.acquire(local_dir);
    }
    if (!lerr.empty()) {
      std::fprintf(stderr, "bftfs mount: --local %s: %s\n", local_dir.c_str(), lerr.c_str());
      return kExitFailure;
    }
    const std::string err = FileSnapshotStore::open(local_dir, store);
    if (!err.empty()) {
      std::fprintf(stderr, "bftfs mount: --local %s: %s\n", local_dir.c_str(), err.c_str());
      return kExitFailure;
    }
  }

  FuseClient client(mo);
  const std::string merr = client.mount(mountpoint, fuse_opts);
  if (!merr.empty()) {
    std::fprintf(stderr, "bftfs mount: %s\n", merr.c_str());
    return kExitFailure;
  }
  // Threads (the backend's) are started only after this: fork keeps only the calling thread.
  if (fuse_daemonize(foreground ? 1 : 0) != 0) return kExitFailure;
  if (!log_file.empty()) {
    const int fd = ::open(log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 2);
      ::close(fd);
    }
  }
  int rc = 0;
  if (store != nullptr) {
    LOG_INFO("", "mount: serving %s (local backend in %s)", mountpoint.c_str(), local_dir.c_str());
    LocalBackend backend(store.get());  // its destructor saves the state into DIR
    rc = client.serve(backend);
  } else {
    LOG_INFO("", "mount: serving %s (relay %s)", mountpoint.c_str(), relay_sock.c_str());
    RelayBackend backend(relay_sock);
    // With the relay or the replicas down, the writes left at unmount may wait long (a hard mount): then
    // `bftfs umount` returns without waiting for this daemon (nothing of a later mount depends on it).
    rc = client.serve(backend, [&mount_lock] { mount_lock.reset(); });
  }
  LOG_INFO("", "mount: %s unmounted, exiting", mountpoint.c_str());
  return rc == 0 ? kExitOk : kExitFailure;
}

int cmd_umount(int argc, char** argv) {
  std::string mountpoint;
  bool lazy = false;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kUmountUsage, stdout);
      return kExitOk;
    } else if (a == "--lazy" || a == "-l") {
      lazy = true;
    } else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "bftfs umount: unknown option %s\n\n%s", a.c_str(), kUmountUsage);
      return kExitUsage;
    } else if (mountpoint.empty()) {
      mountpoint = a;
    } else {
      std::fprintf(stderr, "bftfs umount: more than one mount point\n\n%s", kUmountUsage);
      return kExitUsage;
    }
  }
  if (mountpoint.empty()) {
    std::fprintf(stderr, "bftfs umount: no mount point\n\n%s", kUmountUsage);
    return kExitUsage;
  }
  if (geteuid() == 0) {
    if (::umount2(mountpoint.c_str(), lazy ? MNT_DETACH : 0) != 0) {
      std::fprintf(stderr, "bftfs umount: %s: %s\n", mountpoint.c_str(), std::strerror(errno));
      return kExitFailure;
    }
    if (!lazy) wait_for_daemon(mountpoint);  // a lazy unmount may stay busy: do not wait for it
    return kExitOk;
  }
  // Not root: fusermount3 is the set-uid helper that may unmount a user's own FUSE mounts.
  const pid_t pid = fork();
  if (pid < 0) return kExitFailure;
  if (pid == 0) {
    if (lazy) {
      execlp("fusermount3", "fusermount3", "-u", "-z", mountpoint.c_str(), static_cast<char*>(nullptr));
    } else {
      execlp("fusermount3", "fusermount3", "-u", mountpoint.c_str(), static_cast<char*>(nullptr));
    }
    _exit(127);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return kExitFailure;
  if (!lazy) wait_for_daemon(mountpoint);
  return kExitOk;
}

}  // namespace bftfs::client
