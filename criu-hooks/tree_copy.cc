#include "criu-hooks/tree_copy.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "os/unique_fd.h"

namespace bftfs::criu {
namespace {

std::string errno_text(const std::string& what, const std::string& path) {
  return what + " " + (path.empty() ? std::string(".") : path) + ": " + std::strerror(errno);
}

struct DirCloser {
  void operator()(DIR* d) const { ::closedir(d); }
};

// The names in a directory (not "." or ".."), read through a duplicate of `dir_fd`.
std::string list_names(int dir_fd, const std::string& path, std::vector<std::string>& out) {
  const int dup_fd = ::fcntl(dir_fd, F_DUPFD_CLOEXEC, 0);
  if (dup_fd < 0) return errno_text("dup", path);
  std::unique_ptr<DIR, DirCloser> dir(::fdopendir(dup_fd));
  if (!dir) {
    ::close(dup_fd);
    return errno_text("opendir", path);
  }
  ::rewinddir(dir.get());  // the duplicate shares its offset with `dir_fd`
  errno = 0;
  while (const dirent* e = ::readdir(dir.get())) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) out.emplace_back(e->d_name);
    errno = 0;
  }
  if (errno != 0) return errno_text("readdir", path);
  return "";
}

std::string join(const std::string& dir, const std::string& name) { return dir.empty() ? name : dir + "/" + name; }

std::string copy_bytes(int src, int dst, const std::string& path) {
  bool use_read_write = false;
  for (;;) {
    ssize_t n = 0;
    if (!use_read_write) {
      n = ::copy_file_range(src, nullptr, dst, nullptr, 1 << 30, 0);
      if (n < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP)) {
        use_read_write = true;
        continue;
      }
    } else {
      char buf[65536];
      n = ::read(src, buf, sizeof buf);
      for (ssize_t off = 0; n > 0 && off < n;) {
        const ssize_t w = ::write(dst, buf + off, static_cast<std::size_t>(n - off));
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return errno_text("write", path);
        off += w;
      }
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_text("copy", path);
    if (n == 0) return "";
  }
}

// Owner, then mode (chown clears set-id bits), then times, of the open file or directory `fd`.
std::string copy_attributes(int fd, const struct stat& st, const std::string& path) {
  if (::fchown(fd, st.st_uid, st.st_gid) != 0) return errno_text("chown", path);
  if (::fchmod(fd, st.st_mode & 07777) != 0) return errno_text("chmod", path);
  const timespec times[2] = {st.st_atim, st.st_mtim};
  if (::futimens(fd, times) != 0) return errno_text("set times of", path);
  return "";
}

// The same for `name` in `dir_fd`, which is a symbolic link (whose mode cannot change) or a special file.
std::string copy_attributes_at(int dir_fd, const char* name, const struct stat& st, const std::string& path) {
  if (::fchownat(dir_fd, name, st.st_uid, st.st_gid, AT_SYMLINK_NOFOLLOW) != 0) return errno_text("chown", path);
  if (!S_ISLNK(st.st_mode) && ::fchmodat(dir_fd, name, st.st_mode & 07777, 0) != 0) return errno_text("chmod", path);
  const timespec times[2] = {st.st_atim, st.st_mtim};
  if (::utimensat(dir_fd, name, times, AT_SYMLINK_NOFOLLOW) != 0) return errno_text("set times of", path);
  return "";
}

class Copier {
 public:
  Copier(dev_t dev, int dst_root) : dev_(dev), dst_root_(dst_root) {}

  // Copies the entries of directory `src` (relative path `path`) into directory `dst`.
  std::string copy_dir(int src, int dst, const std::string& path) {
    std::vector<std::string> names;
    if (std::string err = list_names(src, path, names); !err.empty()) return err;
    for (const std::string& name : names) {
      if (std::string err = copy_entry(src, dst, name, join(path, name)); !err.empty()) return err;
    }
    return "";
  }

 private:
  std::string copy_entry(int src, int dst, const std::string& name, const std::string& path) {
    struct stat st{};
    if (::fstatat(src, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return errno_text("stat", path);
    if (st.st_dev != dev_ || S_ISSOCK(st.st_mode)) return "";  // a mount point, or a socket
    if (S_ISDIR(st.st_mode)) return copy_subdir(src, dst, name, st, path);
    if (!S_ISLNK(st.st_mode) && st.st_nlink > 1) {
      const auto key = std::make_pair(st.st_dev, st.st_ino);
      if (const auto it = links_.find(key); it != links_.end()) {
        if (::linkat(dst_root_, it->second.c_str(), dst, name.c_str(), 0) != 0) return errno_text("link", path);
        return "";
      }
      links_.emplace(key, path);
    }
    if (S_ISREG(st.st_mode)) return copy_file(src, dst, name, st, path);
    if (S_ISLNK(st.st_mode)) {
      std::vector<char> target(static_cast<std::size_t>(st.st_size) + 1);
      const ssize_t n = ::readlinkat(src, name.c_str(), target.data(), target.size());
      if (n < 0 || static_cast<std::size_t>(n) >= target.size()) return errno_text("readlink", path);
      target[static_cast<std::size_t>(n)] = '\0';
      if (::symlinkat(target.data(), dst, name.c_str()) != 0) return errno_text("symlink", path);
    } else if (::mknodat(dst, name.c_str(), st.st_mode & S_IFMT, st.st_rdev) != 0) {
      return errno_text("mknod", path);
    }
    return copy_attributes_at(dst, name.c_str(), st, path);
  }

  std::string copy_subdir(int src, int dst, const std::string& name, const struct stat& st, const std::string& path) {
    if (::mkdirat(dst, name.c_str(), 0700) != 0 && errno != EEXIST) return errno_text("mkdir", path);
    UniqueFd s(::openat(src, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!s.valid()) return errno_text("open", path);
    UniqueFd d(::openat(dst, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!d.valid()) return errno_text("open the copy of", path);
    if (std::string err = copy_dir(s.get(), d.get(), path); !err.empty()) return err;
    return copy_attributes(d.get(), st, path);  // after the entries: creating them changed the times
  }

  std::string copy_file(int src, int dst, const std::string& name, const struct stat& st, const std::string& path) {
    UniqueFd s(::openat(src, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (!s.valid()) return errno_text("open", path);
    UniqueFd d(::openat(dst, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!d.valid()) return errno_text("create the copy of", path);
    if (std::string err = copy_bytes(s.get(), d.get(), path); !err.empty()) return err;
    return copy_attributes(d.get(), st, path);
  }

  dev_t dev_;
  int dst_root_;
  std::map<std::pair<dev_t, ino_t>, std::string> links_;  // a hard-linked inode -> where its first copy went
};

std::string clear_dir(int dir_fd, dev_t dev, const std::string& path) {
  std::vector<std::string> names;
  if (std::string err = list_names(dir_fd, path, names); !err.empty()) return err;
  for (const std::string& name : names) {
    const std::string sub = join(path, name);
    struct stat st{};
    if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return errno_text("stat", sub);
    if (st.st_dev != dev) continue;  // a mount point: kept, and with it the directories above it
    if (!S_ISDIR(st.st_mode)) {
      if (::unlinkat(dir_fd, name.c_str(), 0) != 0) return errno_text("remove", sub);
      continue;
    }
    UniqueFd d(::openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!d.valid()) return errno_text("open", sub);
    if (std::string err = clear_dir(d.get(), dev, sub); !err.empty()) return err;
    if (::unlinkat(dir_fd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOTEMPTY && errno != EBUSY)
      return errno_text("remove", sub);
  }
  return "";
}

}  // namespace

std::string copy_tree(int src_dir_fd, int dst_dir_fd) {
  struct stat st{};
  if (::fstat(src_dir_fd, &st) != 0) return errno_text("stat", "");
  Copier copier(st.st_dev, dst_dir_fd);
  if (std::string err = copier.copy_dir(src_dir_fd, dst_dir_fd, ""); !err.empty()) return err;
  return copy_attributes(dst_dir_fd, st, "");
}

std::string clear_tree(int dir_fd) {
  struct stat st{};
  if (::fstat(dir_fd, &st) != 0) return errno_text("stat", "");
  return clear_dir(dir_fd, st.st_dev, "");
}

}  // namespace bftfs::criu
