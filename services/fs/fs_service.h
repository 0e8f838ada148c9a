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
#include <vector>

#include "protocol/service.h"
#include "services/fs/checkpointed_store.h"
#include "services/fs/fs_codec.h"

namespace bftfs::fs {

inline constexpr std::uint32_t kBlockBytes = 64u * 1024;  // file data object size (and statfs bsize)
inline constexpr std::uint32_t kLinkMax = 65000;
inline constexpr std::uint64_t kRootIno = 1;

// Limits of the speculation streams (docs/SPECULATION.md §5.9), the same on every replica.
inline constexpr std::uint32_t kStreamsPerClientMax = 64;
inline constexpr std::uint64_t kPoolInodesMax = 65536;          // reserved and not yet used, per stream
inline constexpr std::uint64_t kStagedBytesMax = 16u << 20;     // staged parts' bytes, per stream
// A stream whose last RESERVE, STAGE or applied EPOCH is this many sequence numbers old is erased by the next
// RESERVE or applied EPOCH of the same client (a run that crashed leaks nothing for good).
inline constexpr std::uint64_t kStreamIdleSeqs = 1ull << 20;

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

// What FsService::execute_entry gives (docs/SPECULATION.md §5.3). Over a store that holds the whole state only
// `result` is ever set; over a partial store (the local model, spec/) the entry may instead end early, changing
// nothing.
struct EntryRun {
  Result result;                   // when complete()
  std::vector<ObjectKey> missing;  // keys, or starts of scans, the store could not answer (FETCH them)
  bool inconsistent = false;       // the store's facts contradict each other (drop the clean ones, fetch again)
  bool complete() const { return missing.empty() && !inconsistent; }
};

// Selects FsService's constructor over a partial store.
struct PartialState {};

// Whether `value` is a well-formed value of `key` (what a state-transfer install accepts). The local model checks
// fetched facts with it: the service never meets a value it cannot decode.
bool valid_object(const ObjectKey& key, const Bytes& value);

class FsService final : public Service {
 public:
  // State in memory (MemoryCheckpointedStore): `store` may be null (no durability). If it holds a snapshot
  // ("fs.ckpt"), the service starts from it (and stops the process if it is unusable, like the counter).
  FsService(SnapshotStore* store, FsOptions options = {});
  // State in `store` (e.g. the replica's DiskObjectStore), which must have options.partitions partitions. A store
  // without a checkpoint gets the initial state as checkpoint 0; otherwise the service starts from its latest.
  FsService(std::unique_ptr<CheckpointedStore> store, FsOptions options);
  // Over a store that holds part of the state (spec/'s CachingObjectStore): no initial state is put and nothing
  // is read at construction. Only execute_entry, commit_through, rollback_to and the inspection members may be
  // called; a read the store cannot answer ends the entry with EntryRun::missing.
  FsService(PartialState, std::unique_ptr<CheckpointedStore> store, FsOptions options);
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
  CheckpointId checkpoint(std::uint64_t seq, std::span<const std::uint8_t> engine_state = {}) override;
  void discard_checkpoints_below(std::uint64_t seq) override;
  CheckpointId recovered_checkpoint() const override;
  Bytes recovered_engine_state() const override;
  std::uint64_t partition_count() const override;
  const PartitionTree& checkpoint_tree(std::uint64_t seq) const override;
  Bytes read_partition(std::uint64_t seq, std::uint64_t index) const override;
  // Rejects (zero digest, state unchanged) an install whose partitions do not decode as file-service state.
  void begin_install(std::uint64_t target_seq) override;
  void install_partition(std::uint64_t index, std::span<const std::uint8_t> data) override;
  CheckpointId finish_install(std::uint64_t target_seq, std::span<const std::uint8_t> engine_state = {}) override;
  // The store's corrupt partitions. A request that read corrupt bytes is undone and answered EIO, which the
  // engine never sends; execute_read_only answers nothing once any partition is corrupt.
  std::vector<std::uint64_t> damaged_partitions() const override;

  // ---- speculation (docs/SPECULATION.md §5.3) ----
  // Runs `request` as an entry of stream (ctx.client, stream) runs inside an EPOCH: ops in order, all or
  // nothing, with the times its TIME ops set (op 0 is one) and inode numbers for creates from the front of the
  // stream's pool. Precondition: an entry's request (decode_request accepts it, op 0 is TIME, no op beyond
  // kEntryOpCodeMax); ctx.seq >= the last executed seq. Its changes stay, recorded for undo under ctx.seq
  // (the local model passes the epoch). The result depends only on the state, ctx.client, `stream` and
  // `request`, never on ctx.seq or ctx.timestamp_ns. Whether it matches an entry is fs::entry_matches.
  EntryRun execute_entry(const ExecContext& ctx, std::uint64_t stream, const Request& request);
  // Over a partial store: the keys an execution not yet committed changed (the overlay), in key order, and
  // whether one key is among them.
  std::vector<ObjectKey> uncommitted_keys() const;
  bool is_uncommitted(const ObjectKey& key) const;

  // ---- inspection (tests, simulator) ----
  // "" if the whole state is consistent (link counts, entry pairs, parents, usage counters, sizes), else the
  // first inconsistency. Walks every object: tests only.
  std::string check_invariants() const;
  std::uint64_t undo_records() const;
  std::uint64_t object_count() const;
  // A digest of every object (keys and values, partition by partition), leaving out the speculation streams'
  // objects (kinds kStream .. kStaged) unless `stream_objects`: two states with the same file tree give the same
  // digest without them. Walks every object: the simulator's all-or-nothing check (docs/SPECULATION.md §14).
  Digest objects_digest(bool stream_objects) const;
  const FsOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bftfs::fs
