// SnapshotStore on files (protocol/service.h): each name is one file in a directory, replaced atomically.
// put() writes <name>.tmp, fsyncs it, renames it over <name> and fsyncs the directory, so after a crash a
// name holds either its old or its new bytes, never a mix.
#pragma once

#include <memory>
#include <string>

#include "protocol/service.h"
#include "os/unique_fd.h"

namespace bftfs {

class FileSnapshotStore final : public SnapshotStore {
 public:
  // Creates `dir` if needed. Returns "" or an error; on error `out` is null.
  [[nodiscard]] static std::string open(const std::string& dir, std::unique_ptr<FileSnapshotStore>& out);

  // Names are chosen by services (our code): non-empty, no '/', not starting with '.' (asserted).
  // An I/O error aborts the process: a replica that cannot persist must stop.
  void put(const std::string& name, std::span<const std::uint8_t> data) override;
  bool get(const std::string& name, Bytes& out) const override;

 private:
  explicit FileSnapshotStore(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
  UniqueFd dir_fd_;
};

}  // namespace bftfs
