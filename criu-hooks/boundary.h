// The boundary of speculation around a supervised tree (docs/SPECULATION.md §8.2): what the tree can change is
// the file system it runs on (through its spec session) and nothing else outside.
//
// The supervisor leaves the host's namespaces for a mount and a network namespace of its own, which the tree
// and CRIU share (so CRIU never dumps them), and sets up there, in this order:
//   - every mount the host had is made read-only, each one on its own (so a mount that was read-only stays so),
//     except /proc, /sys and /dev/pts, which keep their modes (CRIU writes under /proc; ptys live in /dev/pts);
//     writes anywhere else outside the mount fail with EROFS, enforced by the kernel for every system call;
//   - the network namespace has only its loopback interface, up: connections out fail with ENETUNREACH, and
//     abstract Unix sockets are per namespace;
//   - every pathname Unix socket the host had bound outside the mount (read from /proc/net/unix before leaving
//     the host's network namespace) has /dev/null bind-mounted over it: connect() fails with ECONNREFUSED;
//   - /run is an empty tmpfs (CRIU caches its kernel probes in /run/criu.kdat: about 25 ms saved on every dump),
//     made read-only after CRIU's first dump (freeze_run()); below it, kInitPark is a tiny tmpfs that stays
//     writable, the init's working directory (tree_init_main.cc says why);
//   - the spec session (a FUSE connection the mount's daemon serves for this run) is mounted over the mount
//     point; in test mode the mount point may stay the directory it is, writable;
//   - /tmp, /var/tmp and /dev/shm are bind mounts of `<mount><run_dir>/{tmp,var-tmp,shm}`, so temporary files
//     are part of the speculation. When the mount point lies under one of them, that one cannot be replaced by a
//     directory on the mount (the mount would vanish from its own path): it becomes a private tmpfs holding only
//     the path down to the mount point, with the mount bound back at its path, and the supervisor copies it at
//     every checkpoint (private_tmp_root()) so that a rollback puts it back. Without a run directory (a daemon
//     that does not serve `bftfs run`: nothing is speculative) each of them is a private tmpfs instead.
// Checkpoint images go to a detached tmpfs (no path leads to it), handed to CRIU by descriptor.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "os/unique_fd.h"

namespace bftfs::criu {

// Where the tree's init waits (its working directory once it has forked the command): a tmpfs of a few inodes,
// writable, off the mount. CRIU's parasite creates, mounts a procfs on and removes `proc.crtools` in the working
// directory of the tree's root task at every dump (the tree sees the host's /proc, not its pid namespace's); on
// the mount those were a MKDIR, lookups and an RMDIR on the spec session per dump, replicated requests across a
// WAN when the stretch before the dump did not speculate (docs/SPECULATION.md §17).
inline constexpr const char* kInitPark = "/run/bftfs-init";

struct BoundaryPlan {
  std::string mount_point;  // absolute, as the host sees it: the bftfs mount (test mode: the working directory)
  std::string cwd;          // absolute, at or below mount_point
  std::string run_dir;      // the run directory inside the file system at mount_point (HELLO_OK), absolute; empty
                            // only without a spec session
  bool spec_session = true;        // mount a FUSE connection over mount_point (mount_spec_session())
  std::string fuse_options;        // extra kernel mount options for it (HELLO_OK)
  std::uint64_t images_bytes = 512ull << 20;  // the images tmpfs's size
};

class Boundary {
 public:
  // Leaves the host's mount and network namespaces and sets up everything but the spec session and the
  // temporary directories (which need the daemon serving the session). The calling process must be
  // single-threaded and must not have entered a boundary before. Returns "" or what failed.
  [[nodiscard]] static std::string enter(const BoundaryPlan& plan, std::unique_ptr<Boundary>& out);

  // Mounts a new FUSE connection over the mount point and sets `fuse` to its /dev/fuse descriptor, which the
  // daemon must serve (ATTACH) before anything reaches the mount. Precondition: plan.spec_session.
  [[nodiscard]] std::string mount_spec_session(UniqueFd& fuse);
  // Once the daemon serves the session (or without one): the temporary directories, and the working directory
  // resolved again through them. Returns "" or what failed.
  [[nodiscard]] std::string finish();

  // The images tmpfs's root (a detached mount).
  int images_root() const { return images_.get(); }
  // The temporary directory that is a private tmpfs (the one the mount point lies under), or -1 when every
  // temporary directory is on the mount.
  int private_tmp_root() const { return private_tmp_.get(); }
  // The mount point's root as the tree sees it (for syncfs on the spec session), or -1.
  int mount_fd() const { return mount_fd_.get(); }
  // Makes /run read-only; CRIU has cached its probes there. Idempotent. Returns "" or what failed.
  [[nodiscard]] std::string freeze_run();

  // One line per element of the boundary, for `bftfs run -v`.
  const std::vector<std::string>& description() const { return description_; }

 private:
  Boundary() = default;
  [[nodiscard]] std::string make_private_tmp(const std::string& dir);
  [[nodiscard]] std::string plain_tmpfs(const std::string& dir);
  [[nodiscard]] std::string bind_temporary(const std::string& dir, const std::string& source);

  BoundaryPlan plan_;
  UniqueFd images_;
  UniqueFd private_tmp_;
  UniqueFd mount_fd_;
  bool run_frozen_ = false;
  std::vector<std::string> description_;
};

struct MountEntry {
  std::string mount_point;  // octal escapes decoded
  std::string fs_type;      // e.g. "fuse.bftfs"
};
// The mounts listed in a /proc/<pid>/mountinfo text, in order. Pure.
std::vector<MountEntry> mounts_of(const std::string& mountinfo);
// The innermost mount of type `fs_type` at or above the absolute path `path` in a mountinfo text, or "". Pure.
std::string mount_containing(const std::string& mountinfo, const std::string& path, const std::string& fs_type);
// The paths of the pathname Unix sockets listed in a /proc/net/unix text (abstract and unnamed ones left out).
// Pure.
std::vector<std::string> unix_socket_paths_of(const std::string& proc_net_unix);
// True when `path` is `dir` or lies below it (both absolute, without trailing slashes except "/"). Pure.
bool path_within(const std::string& path, const std::string& dir);

}  // namespace bftfs::criu
