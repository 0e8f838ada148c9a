#include "storage/data_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "common/assert.h"

namespace bftfs {

std::string DataDirLock::acquire(const std::string& dir) {
  BFT_ASSERT(!fd_.valid());
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return "cannot create data directory " + dir + ": " + std::strerror(errno);
  }
  const std::string path = dir + "/LOCK";
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!fd.valid()) return "cannot open " + path + ": " + std::strerror(errno);
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) return "data directory " + dir + " is in use by another process";
    return "cannot lock " + path + ": " + std::strerror(errno);
  }
  fd_ = std::move(fd);
  return "";
}

}  // namespace bftfs
