// An exclusive lock on a data directory (flock on <dir>/LOCK), held for the life of the object. Two daemons
// appending to one write-ahead log would corrupt it; the second one fails to start instead.
#pragma once

#include <string>

#include "os/unique_fd.h"

namespace bftfs {

class DataDirLock {
 public:
  // Creates `dir` if needed and locks it. Returns "" or an error (in use by another process, I/O error).
  [[nodiscard]] std::string acquire(const std::string& dir);

 private:
  UniqueFd fd_;  // closing it releases the lock
};

}  // namespace bftfs
