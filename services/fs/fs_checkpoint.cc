// The file service's checkpoints and state-transfer installs (see fs_service_impl.h and docs/FILESERVICE.md §5).
#include "services/fs/fs_service_impl.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/assert.h"
#include "common/log.h"
#include "protocol/messages.h"

namespace bftfs::fs {

CheckpointId FsService::Impl::checkpoint(std::uint64_t seq) {
  BFT_ASSERT(!partial);
  BFT_ASSERT(!installing);
  BFT_ASSERT(last_executed <= seq);
  commit_through(seq);
  // Damage found earlier (say, by a peer's fetch) and not yet repaired: take nothing either, so that the
  // store's newest checkpoint stays the engine's newest (the base its repair diffs against).
  if (!store.corrupt_partitions().empty()) return CheckpointId{seq, Digest{}};
  const std::optional<CheckpointId> id = store.checkpoint(seq);
  if (!id.has_value()) return CheckpointId{seq, Digest{}};  // damaged (protocol/service.h): nothing taken
  return *id;
}

void FsService::Impl::begin_install() {
  BFT_ASSERT(!partial);
  BFT_ASSERT(!installing);
  installing = true;
  install_error.clear();
  staged_super = staged_root = std::nullopt;
  store.begin_install();
}

void FsService::Impl::install_partition(std::uint64_t p, std::span<const std::uint8_t> data) {
  BFT_ASSERT(installing);
  if (!install_error.empty()) return;
  if (p >= opt.partitions) {
    install_error = "partition index " + std::to_string(p) + " out of range";
    return;
  }
  if (data.size() > kPartitionBytesMax) {
    install_error = "partition " + std::to_string(p) + " over kPartitionBytesMax";
    return;
  }
  std::vector<std::pair<ObjectKey, Value>> objects;
  const std::string e = decode_partition(data, p, opt.partitions, value_ok, objects);
  if (!e.empty()) {
    install_error = "partition " + std::to_string(p) + ": " + e;
    return;
  }
  const auto has = [&](const ObjectKey& k) {
    return std::any_of(objects.begin(), objects.end(), [&](const auto& kv) { return kv.first == k; });
  };
  if (p == partition_of(ObjectKey::super(), opt.partitions)) staged_super = has(ObjectKey::super());
  if (p == partition_of(ObjectKey::inode(kRootIno), opt.partitions)) staged_root = has(ObjectKey::inode(kRootIno));
  store.stage_partition(p, std::move(objects));
}

CheckpointId FsService::Impl::finish_install(std::uint64_t target_seq) {
  BFT_ASSERT(installing);
  installing = false;
  // A partition not fetched is the base checkpoint's, which has both (every state has them).
  if (install_error.empty() && (staged_super == false || staged_root == false)) {
    install_error = "the superblock or the root directory is missing";
  }
  if (!install_error.empty()) {
    LOG_WARN("", "fs install of checkpoint %llu rejected: %s", static_cast<unsigned long long>(target_seq),
             install_error.c_str());
    store.abort_install();
    return CheckpointId{target_seq, Digest{}};
  }
  const CheckpointId id = store.finish_install(target_seq);  // this replica's changes since the base are gone
  undo.clear();
  touched.clear();
  committed = target_seq;
  last_executed = target_seq;
  return id;
}

}  // namespace bftfs::fs
