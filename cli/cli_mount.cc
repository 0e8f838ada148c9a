// bftfs mount / bftfs umount: the FUSE client (client/fuse_client.h) over a relay or the local file service,
// and the unmount that waits for the daemon to finish.
#define FUSE_USE_VERSION FUSE_MAKE_VERSION(3, 14)
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

#include "cli/cli_common.h"
#include "client/fuse_client.h"
#include "client/local_backend.h"
#include "client/relay_backend.h"
#include "client/spec_run.h"
#include "common/log.h"
#include "storage/data_dir_lock.h"
#include "storage/file_snapshot_store.h"
#include "os/unique_fd.h"

namespace bftfs::cli {

namespace {

// The mount-point lock: a mount daemon holds an exclusive flock on a file named after its mount point for its
// whole life (inherited across fuse_daemonize's fork, released only when the process exits, after its writes
// are final and its state is saved). `bftfs umount` takes the lock after unmounting, so it returns only when
// the daemon is gone and a following mount of the same point or directory, or an rmdir, just works.
// The name is the FNV-1a hash of the mount point's path with its parent resolved (the mount point itself is
// never resolved: that would ask the file system, which may be hung).
const char* const kMountLockDir = "/tmp/.bftfs-mount-locks";

}  // namespace

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

namespace {

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

namespace {

struct MountArgs {
  std::string relay;  // --relay SOCK
  std::string local;  // --local DIR
  std::string mountpoint;
  bool foreground = false;
  std::vector<std::string> fuse_options;  // each -o OPTS
  std::string log_file;
  bool no_default_permissions = false;
  client::MountOptions mount;  // the timeouts and the status file
};

// Opens the --local state directory for this daemon alone. Returns "" or why it cannot be used.
std::string open_local_state(const std::string& dir, DataDirLock& lock, std::unique_ptr<FileSnapshotStore>& store) {
  // A daemon unmounted without `bftfs umount` (fusermount3 -u) may still be saving its state: give it a moment.
  std::string err = lock.acquire(dir);
  for (int i = 0; i < 60 && !err.empty(); ++i) {
    ::usleep(50 * 1000);
    err = lock.acquire(dir);
  }
  if (!err.empty()) return err;
  return FileSnapshotStore::open(dir, store);
}

// Appends the daemon's stderr (its log) to `path`.
void redirect_log(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd >= 0) {
    ::dup2(fd, 2);
    ::close(fd);
  }
}

int run_mount(MountArgs& a) {
  if (a.local.empty() == a.relay.empty()) {
    error("mount", "exactly one backend is required (--relay SOCK or --local DIR) (see bftfs mount --help)");
    return kExitUsage;
  }
  a.mount.default_permissions = !a.no_default_permissions;
  if (!a.mount.status_path.empty() && a.mount.status_path[0] != '/') {
    // The daemon detaches into "/": keep the path the user meant.
    char cwd[4096];
    if (::getcwd(cwd, sizeof cwd) != nullptr) a.mount.status_path = std::string(cwd) + "/" + a.mount.status_path;
  }
  struct stat st {};
  if (::stat(a.mountpoint.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    error("mount", a.mountpoint + " is not a directory");
    return kExitFailure;
  }
  // Declared first, so released last (after the state is saved and the other locks are gone).
  UniqueFd mount_lock = take_mount_lock(a.mountpoint);
  std::unique_ptr<FileSnapshotStore> store;
  // Two daemons on one --local directory would each save their own state over the other's: the second mount
  // fails instead (the lock is held until this process exits, after the state is saved).
  DataDirLock lock;
  if (!a.local.empty()) {
    if (std::string err = open_local_state(a.local, lock, store); !err.empty()) {
      error("mount", "--local " + a.local + ": " + err);
      return kExitFailure;
    }
  }
  std::string fuse_options;
  for (const std::string& o : a.fuse_options) fuse_options += (fuse_options.empty() ? "" : ",") + o;
  client::FuseClient fuse(a.mount);
  if (std::string err = fuse.mount(a.mountpoint, fuse_options); !err.empty()) {
    error("mount", err);
    return kExitFailure;
  }
  // Threads (the backend's) are started only after this: fork keeps only the calling thread.
  if (fuse_daemonize(a.foreground ? 1 : 0) != 0) return kExitFailure;
  if (!a.log_file.empty()) redirect_log(a.log_file);
  int rc = 0;
  if (store != nullptr) {
    LOG_INFO("", "mount: serving %s (local backend in %s)", a.mountpoint.c_str(), a.local.c_str());
    client::LocalBackend backend(store.get());  // its destructor saves the state into DIR
    rc = fuse.serve(backend);
  } else {
    LOG_INFO("", "mount: serving %s (relay %s)", a.mountpoint.c_str(), a.relay.c_str());
    client::RelayBackend backend(a.relay);
    // `bftfs run` on this mount (docs/SPECULATION.md §9): its supervisor connects here. Declared after the backend,
    // so destroyed before it (a run's requests go through it). Root only: the runs mount over the mount point.
    std::unique_ptr<client::ControlServer> control;
    if (::geteuid() == 0) {
      const client::MountOptions options = a.mount;
      const std::string path = mount_lock_path(a.mountpoint) + ".ctl";
      std::string err = client::ControlServer::start(
          path,
          [&backend, options](client::EventSink events) {
            return std::make_unique<client::SpecRun>(backend, options, std::move(events));
          },
          control);
      if (!err.empty()) LOG_WARN("", "mount: bftfs run will not speculate here: control socket %s: %s", path.c_str(), err.c_str());
    }
    // With the relay or the replicas down, the writes left at unmount may wait long (a hard mount): then
    // `bftfs umount` returns without waiting for this daemon (nothing of a later mount depends on it).
    rc = fuse.serve(backend, [&mount_lock] { mount_lock.reset(); });
  }
  LOG_INFO("", "mount: %s unmounted, exiting", a.mountpoint.c_str());
  return rc == 0 ? kExitOk : kExitFailure;
}

// Unmounts as a user: fusermount3 is the set-uid helper that may unmount a user's own FUSE mounts.
bool fusermount_unmount(const std::string& mountpoint, bool lazy) {
  const pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    if (lazy) {
      execlp("fusermount3", "fusermount3", "-u", "-z", mountpoint.c_str(), static_cast<char*>(nullptr));
    } else {
      execlp("fusermount3", "fusermount3", "-u", mountpoint.c_str(), static_cast<char*>(nullptr));
    }
    _exit(127);
  }
  int status = 0;
  return waitpid(pid, &status, 0) >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

int run_umount(const std::string& mountpoint, bool lazy) {
  if (geteuid() == 0) {
    if (::umount2(mountpoint.c_str(), lazy ? MNT_DETACH : 0) != 0) {
      error("umount", mountpoint + ": " + std::strerror(errno));
      return kExitFailure;
    }
  } else if (!fusermount_unmount(mountpoint, lazy)) {
    return kExitFailure;
  }
  if (!lazy) wait_for_daemon(mountpoint);  // a lazy unmount may stay busy: do not wait for it
  return kExitOk;
}

}  // namespace

void add_mount(CLI::App& root, Commands& out) {
  auto a = std::make_shared<MountArgs>();
  CLI::App* app = root.add_subcommand("mount",
      "mount the file system with FUSE (bftfs umount MNT to unmount)\n\n"
      "Mounts the bftfs file system at MNT (a FUSE daemon; it detaches unless -f), with one backend:\n"
      "--relay SOCK, a `bftfs relay` (the replicated file system; while it is unreachable, operations wait\n"
      "and retry: a hard mount), or --local DIR, the file service in this process, no network or\n"
      "replication (the FUSE passthrough baseline; its state is saved in DIR at unmount and loaded at mount).");
  app->footer("Semantics: close-to-open consistency, write-behind made final by close and fsync, hard-mount\n"
              "retries that an interrupt (e.g. Ctrl-C) ends with EINTR. Unmount with `bftfs umount MNT`.");
  app->add_option("MNT", a->mountpoint, "the mount point (a directory)")->type_name("")->required();
  app->add_option("--relay", a->relay, "backend: the relay listening on the Unix socket SOCK")->type_name("SOCK");
  app->add_option("--local", a->local, "backend: the file service in this process, its state kept in DIR")
      ->type_name("DIR");
  app->add_flag("-f", a->foreground, "stay in the foreground");
  app->add_option("-o", a->fuse_options, "extra FUSE mount options (comma list; may be given more than once)")
      ->type_name("OPTS")->allow_extra_args(false)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->default_str("");
  app->add_option("--attr-timeout", a->mount.attr_timeout_s, "seconds the kernel caches attributes")
      ->type_name("S")->check(number_up_to(86400));
  app->add_option("--entry-timeout", a->mount.entry_timeout_s, "seconds the kernel caches names")
      ->type_name("S")->check(number_up_to(86400));
  app->add_option("--negative-timeout", a->mount.negative_timeout_s, "seconds the kernel caches \"no such name\"")
      ->type_name("S")->check(number_up_to(86400));
  app->add_flag("--no-default-permissions", a->no_default_permissions,
                "let the service alone decide permissions (access() and open() ask it)");
  app->add_option("--log", a->log_file, "append the daemon's log to FILE (default: stderr while in the foreground)")
      ->type_name("FILE");
  app->add_option("--status", a->mount.status_path,
                  "write the mount's counters (FUSE requests, requests sent, cache hits) to FILE as JSON every "
                  "second and at exit")
      ->type_name("FILE");
  out.push_back({app, [a] { return run_mount(*a); }});
}

void add_umount(CLI::App& root, Commands& out) {
  auto mountpoint = std::make_shared<std::string>();
  auto lazy = std::make_shared<bool>(false);
  CLI::App* app = root.add_subcommand("umount",
      "unmount a bftfs mount and wait for its daemon\n\n"
      "Unmounts a bftfs mount and waits until its daemon has made its pending writes final and exited (so a\n"
      "following mount or rmdir works).");
  app->add_option("MNT", *mountpoint, "the mount point")->type_name("")->required();
  app->add_flag("-l,--lazy", *lazy,
                "detach now even if busy (the mount goes away when no longer used); does not wait");
  out.push_back({app, [mountpoint, lazy] { return run_umount(*mountpoint, *lazy); }});
}

}  // namespace bftfs::cli
