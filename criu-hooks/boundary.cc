#include "criu-hooks/boundary.h"

#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/assert.h"

namespace bftfs::criu {
namespace {

std::string errno_text(const std::string& what) { return what + ": " + std::strerror(errno); }

// Mounts whose modes the boundary keeps: CRIU writes under /proc (ns_last_pid, the tasks' files), the pty
// slaves live in /dev/pts, and /sys holds the cgroup files CRIU may write.
constexpr const char* kKeptAsTheHosts[] = {"/proc", "/sys", "/dev/pts"};
// The temporary directories the tree gets from the run directory, and their names there.
constexpr std::pair<const char*, const char*> kTemporary[] = {{"/tmp", "tmp"}, {"/var/tmp", "var-tmp"},
                                                              {"/dev/shm", "shm"}};

std::string read_text(const char* path) {
  UniqueFd fd(::open(path, O_RDONLY | O_CLOEXEC));
  std::string out;
  if (!fd.valid()) return out;
  char buf[65536];
  for (ssize_t n; out.size() < (16u << 20) && (n = ::read(fd.get(), buf, sizeof buf)) > 0;) {
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

std::string set_attr(const std::string& path, std::uint64_t set, std::uint64_t clear) {
  mount_attr attr{};
  attr.attr_set = set;
  attr.attr_clr = clear;
  if (::mount_setattr(AT_FDCWD, path.c_str(), AT_SYMLINK_NOFOLLOW, &attr, sizeof attr) != 0)
    return errno_text(std::string(set ? "make read-only " : "make writable ") + path);
  return "";
}

std::string bring_loopback_up() {
  UniqueFd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) return errno_text("socket for the loopback interface");
  ifreq req{};
  std::strncpy(req.ifr_name, "lo", IFNAMSIZ - 1);
  if (::ioctl(s.get(), SIOCGIFFLAGS, &req) != 0) return errno_text("SIOCGIFFLAGS lo");
  req.ifr_flags = static_cast<short>(req.ifr_flags | IFF_UP);
  if (::ioctl(s.get(), SIOCSIFFLAGS, &req) != 0) return errno_text("SIOCSIFFLAGS lo");
  return "";
}

// The pathname sockets to mask: bound outside the mount, still there.
std::vector<std::string> host_sockets(const std::string& mount_point) {
  std::vector<std::string> out;
  for (const std::string& path : unix_socket_paths_of(read_text("/proc/net/unix"))) {
    struct stat st{};
    if (path_within(path, mount_point)) continue;
    if (::lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    bool seen = false;
    for (const std::string& p : out) seen = seen || p == path;
    if (!seen) out.push_back(path);
  }
  return out;
}

// Makes every mount read-only on its own, except those the boundary keeps as the host's. Returns how many it made
// read-only in `count`.
std::string make_host_read_only(std::size_t& count) {
  count = 0;
  std::vector<std::string> done;
  for (const MountEntry& e : mounts_of(read_text("/proc/self/mountinfo"))) {
    const std::string& mp = e.mount_point;
    bool kept = false;
    for (const char* k : kKeptAsTheHosts) kept = kept || path_within(mp, k);
    bool seen = false;
    for (const std::string& d : done) seen = seen || d == mp;
    if (kept || seen) continue;
    done.push_back(mp);
    if (std::string err = set_attr(mp, MOUNT_ATTR_RDONLY, 0); !err.empty()) return err;
    ++count;
  }
  return "";
}

std::string detached_tmpfs(std::uint64_t bytes, UniqueFd& out) {
  UniqueFd fs(::fsopen("tmpfs", FSOPEN_CLOEXEC));
  if (!fs.valid()) return errno_text("fsopen tmpfs");
  const std::string size = std::to_string(bytes);
  if (::fsconfig(fs.get(), FSCONFIG_SET_STRING, "size", size.c_str(), 0) != 0) return errno_text("tmpfs size");
  if (::fsconfig(fs.get(), FSCONFIG_SET_STRING, "mode", "0700", 0) != 0) return errno_text("tmpfs mode");
  if (::fsconfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0) return errno_text("create the tmpfs");
  UniqueFd mnt(::fsmount(fs.get(), FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC));
  if (!mnt.valid()) return errno_text("fsmount");
  // An ordinary directory descriptor of its root: CRIU opens the images through /proc/<pid>/fd/<fd>.
  out.reset(::openat(mnt.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!out.valid()) return errno_text("open the images tmpfs");
  return "";
}

}  // namespace

bool path_within(const std::string& path, const std::string& dir) {
  if (dir == "/") return !path.empty() && path.front() == '/';
  if (path.compare(0, dir.size(), dir) != 0) return false;
  return path.size() == dir.size() || path[dir.size()] == '/';
}

namespace {

// The space-separated field of `line` that starts at `from`, with mountinfo's \ooo escapes decoded; `from` moves
// past it.
std::string mountinfo_field(const std::string& line, std::size_t& from) {
  std::string out;
  std::size_t i = from;
  for (; i < line.size() && line[i] != ' '; ++i) {
    const bool octal = line[i] == '\\' && i + 3 < line.size() && line[i + 1] >= '0' && line[i + 1] <= '3' &&
                       line[i + 2] >= '0' && line[i + 2] <= '7' && line[i + 3] >= '0' && line[i + 3] <= '7';
    if (octal) {
      out.push_back(static_cast<char>((line[i + 1] - '0') * 64 + (line[i + 2] - '0') * 8 + (line[i + 3] - '0')));
      i += 3;
    } else {
      out.push_back(line[i]);
    }
  }
  from = i < line.size() ? i + 1 : i;
  return out;
}

}  // namespace

std::vector<MountEntry> mounts_of(const std::string& mountinfo) {
  std::vector<MountEntry> out;
  std::size_t pos = 0;
  while (pos < mountinfo.size()) {
    std::size_t eol = mountinfo.find('\n', pos);
    if (eol == std::string::npos) eol = mountinfo.size();
    const std::string line = mountinfo.substr(pos, eol - pos);
    pos = eol + 1;
    // "id parent major:minor root mount_point options [optional fields] - fs_type source super_options"
    std::size_t at = 0;
    for (int i = 0; i < 4; ++i) mountinfo_field(line, at);
    MountEntry e;
    e.mount_point = mountinfo_field(line, at);
    const std::size_t dash = line.find(" - ", at);
    if (dash == std::string::npos || e.mount_point.empty() || e.mount_point.front() != '/') continue;
    at = dash + 3;
    e.fs_type = mountinfo_field(line, at);
    out.push_back(std::move(e));
  }
  return out;
}

std::string mount_containing(const std::string& mountinfo, const std::string& path, const std::string& fs_type) {
  std::string best;
  for (const MountEntry& e : mounts_of(mountinfo)) {
    if (e.fs_type == fs_type && path_within(path, e.mount_point) && e.mount_point.size() > best.size())
      best = e.mount_point;
  }
  return best;
}

std::vector<std::string> unix_socket_paths_of(const std::string& text) {
  std::vector<std::string> out;
  std::size_t pos = text.find('\n');  // the header line
  while (pos != std::string::npos && pos < text.size()) {
    ++pos;
    std::size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    // "Num RefCount Protocol Flags Type St Inode Path": the path is the rest after the seventh field.
    std::size_t field = pos;
    for (int i = 0; i < 7 && field < eol; ++i) {
      while (field < eol && text[field] == ' ') ++field;
      while (field < eol && text[field] != ' ') ++field;
    }
    while (field < eol && text[field] == ' ') ++field;
    if (field < eol && text[field] == '/') out.push_back(text.substr(field, eol - field));
    pos = eol;
  }
  return out;
}

std::string Boundary::enter(const BoundaryPlan& plan, std::unique_ptr<Boundary>& out) {
  BFT_ASSERT(!plan.mount_point.empty() && plan.mount_point.front() == '/');
  BFT_ASSERT(path_within(plan.cwd, plan.mount_point));
  BFT_ASSERT(plan.run_dir.empty() ? !plan.spec_session : plan.run_dir.front() == '/');
  std::unique_ptr<Boundary> b(new Boundary());
  b->plan_ = plan;
  // Read in the host's network namespace: /proc/net/unix lists the sockets of the reader's namespace.
  const std::vector<std::string> sockets = host_sockets(plan.mount_point);
  if (::unshare(CLONE_NEWNS | CLONE_NEWNET) != 0) return errno_text("unshare(CLONE_NEWNS | CLONE_NEWNET)");
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return errno_text("make / private");
  if (std::string err = bring_loopback_up(); !err.empty()) return err;
  std::size_t read_only = 0;
  if (std::string err = make_host_read_only(read_only); !err.empty()) return err;
  b->description_.push_back("read-only: every mount of the host (" + std::to_string(read_only) +
                            "), except /proc, /sys and /dev/pts, which keep their modes");
  b->description_.push_back("network: loopback only");
  if (::mount("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755") != 0) return errno_text("tmpfs on /run");
  b->description_.push_back("/run: an empty tmpfs, read-only from the first checkpoint on");
  if (::mkdir(kInitPark, 0700) != 0) return errno_text(std::string("mkdir ") + kInitPark);
  if (::mount("tmpfs", kInitPark, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0700,size=16k,nr_inodes=4") != 0)
    return errno_text(std::string("tmpfs on ") + kInitPark);
  b->description_.push_back(std::string(kInitPark) + ": the init's working directory, a tmpfs of 4 inodes");
  for (const std::string& path : sockets) {
    if (::mount("/dev/null", path.c_str(), nullptr, MS_BIND, nullptr) != 0) return errno_text("mask " + path);
  }
  b->description_.push_back("masked host Unix sockets: " + std::to_string(sockets.size()));
  if (std::string err = detached_tmpfs(plan.images_bytes, b->images_); !err.empty()) return err;
  b->description_.push_back("images: a detached tmpfs of " + std::to_string(plan.images_bytes >> 20) + " MiB");
  if (!plan.spec_session) {
    // Test mode: the mount point is an ordinary directory that stays writable (its effects are not speculative).
    if (::mount(plan.mount_point.c_str(), plan.mount_point.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0)
      return errno_text("bind " + plan.mount_point);
    if (std::string err = set_attr(plan.mount_point, 0, MOUNT_ATTR_RDONLY); !err.empty()) return err;
    b->description_.push_back(plan.mount_point + ": writable, no spec session (nothing on it is speculative)");
  }
  out = std::move(b);
  return "";
}

std::string Boundary::mount_spec_session(UniqueFd& fuse) {
  BFT_ASSERT(plan_.spec_session);
  UniqueFd dev(::open("/dev/fuse", O_RDWR | O_CLOEXEC));
  if (!dev.valid()) return errno_text("open /dev/fuse");
  std::string options = "fd=" + std::to_string(dev.get()) + ",rootmode=40000,user_id=" + std::to_string(::getuid()) +
                        ",group_id=" + std::to_string(::getgid());
  if (!plan_.fuse_options.empty()) options += "," + plan_.fuse_options;
  if (::mount("bftfs", plan_.mount_point.c_str(), "fuse.bftfs", MS_NOSUID | MS_NODEV, options.c_str()) != 0)
    return errno_text("mount the spec session on " + plan_.mount_point + " (" + options + ")");
  description_.push_back(plan_.mount_point + ": the spec session (" + options + ")");
  fuse = std::move(dev);
  return "";
}

std::string Boundary::finish() {
  mount_fd_.reset(::open(plan_.mount_point.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!mount_fd_.valid()) return errno_text("open " + plan_.mount_point);
  for (const auto& [dir, name] : kTemporary) {
    struct stat st{};
    if (::stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
      description_.push_back(std::string(dir) + ": absent on the host, left out");
      continue;
    }
    std::string err;
    if (path_within(plan_.mount_point, dir)) {
      err = make_private_tmp(dir);
    } else if (plan_.run_dir.empty()) {
      err = plain_tmpfs(dir);
    } else {
      err = bind_temporary(dir, plan_.mount_point + plan_.run_dir + "/" + name);
    }
    if (!err.empty()) return err;
  }
  if (::chdir(plan_.cwd.c_str()) != 0) return errno_text("chdir " + plan_.cwd);
  return "";
}

std::string Boundary::bind_temporary(const std::string& dir, const std::string& source) {
  if (::mount(source.c_str(), dir.c_str(), nullptr, MS_BIND, nullptr) != 0)
    return errno_text("bind " + source + " on " + dir);
  // A bind takes the source mount's flags: a source on a read-only host mount (test mode) would stay read-only.
  if (std::string err = set_attr(dir, 0, MOUNT_ATTR_RDONLY); !err.empty()) return err;
  description_.push_back(dir + ": " + source);
  return "";
}

std::string Boundary::plain_tmpfs(const std::string& dir) {
  if (::mount("tmpfs", dir.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777") != 0)
    return errno_text("tmpfs on " + dir);
  description_.push_back(dir + ": a private tmpfs (no run directory: nothing is rolled back)");
  return "";
}

std::string Boundary::make_private_tmp(const std::string& dir) {
  // The directories from `dir` down to the mount point, as they are outside, to recreate them inside.
  std::vector<std::pair<std::string, struct stat>> path;
  for (std::size_t pos = dir.size() + 1; pos <= plan_.mount_point.size(); ++pos) {
    if (pos != plan_.mount_point.size() && plan_.mount_point[pos] != '/') continue;
    const std::string sub = plan_.mount_point.substr(0, pos);
    struct stat st{};
    if (::lstat(sub.c_str(), &st) != 0) return errno_text("stat " + sub);
    path.emplace_back(sub, st);
  }
  // Opened in this namespace: a bind mount's source must belong to the namespace that mounts it.
  UniqueFd mount(::open(plan_.mount_point.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!mount.valid()) return errno_text("open " + plan_.mount_point);
  if (::mount("tmpfs", dir.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777") != 0)
    return errno_text("tmpfs on " + dir);
  for (std::size_t i = 0; i < path.size(); ++i) {
    const auto& [sub, st] = path[i];
    if (::mkdir(sub.c_str(), 0700) != 0) return errno_text("mkdir " + sub);
    if (::chown(sub.c_str(), st.st_uid, st.st_gid) != 0) return errno_text("chown " + sub);
    if (::chmod(sub.c_str(), st.st_mode & 07777) != 0) return errno_text("chmod " + sub);
  }
  const std::string source = "/proc/self/fd/" + std::to_string(mount.get());
  if (::mount(source.c_str(), plan_.mount_point.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0)
    return errno_text("bind the mount back on " + plan_.mount_point);
  private_tmp_.reset(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!private_tmp_.valid()) return errno_text("open " + dir);
  description_.push_back(dir + ": a private tmpfs (the mount lies under it), copied at every checkpoint");
  return "";
}

std::string Boundary::freeze_run() {
  if (run_frozen_) return "";
  if (std::string err = set_attr("/run", MOUNT_ATTR_RDONLY, 0); !err.empty()) return err;
  run_frozen_ = true;
  return "";
}

}  // namespace bftfs::criu
