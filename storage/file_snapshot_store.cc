#include "storage/file_snapshot_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/assert.h"
#include "common/log.h"

namespace bftfs {
namespace {

void die(const char* what, const std::string& path) {
  LOG_ERROR("", "snapshot store: %s %s: %s; stopping (cannot persist)", what, path.c_str(), std::strerror(errno));
  std::abort();
}

bool valid_name(const std::string& name) {
  return !name.empty() && name[0] != '.' && name.find('/') == std::string::npos && !name.ends_with(".tmp");
}

}  // namespace

std::string FileSnapshotStore::open(const std::string& dir, std::unique_ptr<FileSnapshotStore>& out) {
  out.reset();
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return "cannot create directory " + dir + ": " + std::strerror(errno);
  }
  std::unique_ptr<FileSnapshotStore> s(new FileSnapshotStore(dir));
  s->dir_fd_.reset(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!s->dir_fd_.valid()) return "cannot open directory " + dir + ": " + std::strerror(errno);
  out = std::move(s);
  return "";
}

void FileSnapshotStore::put(const std::string& name, std::span<const std::uint8_t> data) {
  BFT_ASSERT(valid_name(name));
  const std::string path = dir_ + "/" + name;
  const std::string tmp = path + ".tmp";
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) die("cannot create", tmp);
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t w = ::write(fd.get(), data.data() + done, data.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) die("cannot write", tmp);
    done += static_cast<std::size_t>(w);
  }
  if (::fsync(fd.get()) != 0) die("cannot fsync", tmp);
  fd.reset();
  if (::rename(tmp.c_str(), path.c_str()) != 0) die("cannot rename", tmp);
  if (::fsync(dir_fd_.get()) != 0) die("cannot fsync directory", dir_);
}

bool FileSnapshotStore::get(const std::string& name, Bytes& out) const {
  BFT_ASSERT(valid_name(name));
  out.clear();
  const std::string path = dir_ + "/" + name;
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) return false;
    die("cannot open", path);
  }
  struct stat st{};
  if (::fstat(fd.get(), &st) != 0) die("cannot stat", path);
  out.resize(static_cast<std::size_t>(st.st_size));
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t r = ::read(fd.get(), out.data() + done, out.size() - done);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) die("cannot read", path);
    if (r == 0) break;
    done += static_cast<std::size_t>(r);
  }
  out.resize(done);
  return true;
}

}  // namespace bftfs
