// The deterministic NFS-like file service (docs/FILESERVICE.md): a pure Service (protocol/service.h) that
// executes compound requests of file operations (services/fs/fs_codec.h) all or nothing, over objects kept in an
// ObjectStore (services/fs/object_store.h), with exact undo for tentative execution and incremental checkpoints.
//
// It runs behind the PBFT-CS shim; every result is at most kFsResultBytesMax (< shim::kInnerResultBytesMax).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "protocol/service.h"
#include "services/fs/checkpointed_store.h"
#include "services/fs/fs_codec.h"

namespace bftfs::fs {

inline constexpr std::uint32_t kBlockBytes = 64u * 1024;  // file data object size (and statfs bsize)
inline constexpr std::uint32_t kLinkMax = 65000;
inline constexpr std::uint64_t kRootIno = 1;

// Fixed for the life of the service; every replica must use the same options (as with ShimOptions).
struct FsOptions {
  std::uint64_t partitions = 1u << 16;          // P, >= 1
  std::uint64_t capacity_bytes = 64ull << 30;   // data capacity, counted in kBlockBytes blocks
  std::uint64_t inodes_max = 1u << 22;          // including the root
  std::uint64_t file_bytes_max = 1ull << 40;    // EFBIG beyond; <= 2^62
  std::uint32_t root_mode = 0755;
  std::uint32_t root_uid = 0;
  std::uint32_t root_gid = 0;
  // Positions a directory's entries may take (readdir cookies 3 .. 3 + dir_positions - 1), in 1 .. 2^63 - 3.
  // Production keeps the default, the most positions a kernel directory offset can name; tests make it tiny
  // to force collisions of names' positions (docs/FILESERVICE.md §7). A directory holds at most this many
  // entries (ENOSPC beyond).
  std::uint64_t dir_positions = (1ull << 63) - 3;
};

class FsService final : public Service {
 public:
  // State in memory (MemoryCheckpointedStore): `store` may be null (no durability). If it holds a snapshot
  // ("fs.ckpt"), the service starts from it (and stops the process if it is unusable, like the counter).
  FsService(SnapshotStore* store, FsOptions options = {});
  // State in `store` (e.g. the replica's DiskObjectStore), which must have options.partitions partitions. A store
  // without a checkpoint gets the initial state as checkpoint 0; otherwise the service starts from its latest.
  FsService(std::unique_ptr<CheckpointedStore> store, FsOptions options);
  ~FsService() override;
  FsService(const FsService&) = delete;
  FsService& operator=(const FsService&) = delete;

  // Service interface: see protocol/service.h.
  // execute: decodes a compound request (malformed -> Outcome::kMalformed, nothing changes) and runs its ops in
  // order; an op passes if its predicate matches (when it has one) or it succeeded (when it has none); the
  // first op that does not pass stops the request and everything the request changed is undone.
  Bytes execute(const ExecContext& ctx, std::span<const std::uint8_t> op) override;
  // Only requests whose every op is_read_only(); same results as execute would give, no change.
  bool execute_read_only(NodeId client, std::span<const std::uint8_t> op, Bytes& result) override;
  void commit_through(std::uint64_t seq) override;
  void rollback_to(std::uint64_t seq) override;
  CheckpointId checkpoint(std::uint64_t seq) override;
  void discard_checkpoints_below(std::uint64_t seq) override;
  CheckpointId recovered_checkpoint() const override;
  std::uint64_t partition_count() const override;
  const PartitionTree& checkpoint_tree(std::uint64_t seq) const override;
  Bytes read_partition(std::uint64_t seq, std::uint64_t index) const override;
  // Rejects (zero digest, state unchanged) an install whose partitions do not decode as file-service state.
  void begin_install(std::uint64_t target_seq) override;
  void install_partition(std::uint64_t index, std::span<const std::uint8_t> data) override;
  CheckpointId finish_install(std::uint64_t target_seq) override;
  // The store's corrupt partitions. A request that read corrupt bytes is undone and answered EIO, which the
  // engine never sends; execute_read_only answers nothing once any partition is corrupt.
  std::vector<std::uint64_t> damaged_partitions() const override;

  // ---- inspection (tests, simulator) ----
  // "" if the whole state is consistent (link counts, entry pairs, parents, usage counters, sizes), else the
  // first inconsistency. Walks every object: tests only.
  std::string check_invariants() const;
  std::uint64_t undo_records() const;
  std::uint64_t object_count() const;
  const FsOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bftfs::fs
