// Where the file service's state and its checkpoints live (docs/FILESERVICE.md §5, §6): an ObjectStore that also
// takes durable checkpoints of its objects, keeps the retained ones readable as partitions, installs partitions
// fetched by state transfer, and reports stored bytes that fail verification.
//
// Two implementations: MemoryCheckpointedStore below (objects in memory, each checkpoint one snapshot blob in a
// SnapshotStore: the simulator and the unit tests), and DiskObjectStore (storage/disk_object_store.h: values on
// disk with checksums kept apart, checkpoints as index versions; the replica daemon). FsService is written
// against this interface only, so both give the same results, digests and errnos.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "protocol/partition_tree.h"
#include "protocol/service.h"
#include "services/fs/object_store.h"

namespace bftfs::fs {

// Thrown by a store that holds only part of the state (the local model's CachingObjectStore, spec/) from get()
// or first_at_or_after() when it cannot answer: `key` is the key, or the start of the scan. FsService catches
// it at the request boundary and undoes the request (FsService::execute_entry's EntryRun::missing). A store
// that holds the whole state never throws it.
struct UnknownKey {
  ObjectKey key;
};

class CheckpointedStore : public ObjectStore {
 public:
  // ---- undo (FsService records the value a key had before its first change in an op) ----
  // The value of `key` for an undo record: get()'s answer, except that a partial store returns nullopt for a key
  // it does not know instead of throwing (a blind write needs no read). FETCH's trace does not report it.
  virtual std::optional<Value> get_for_undo(const ObjectKey& key) const { return get(key); }
  // Undoes a change to a key whose earlier value get_for_undo did not know: a partial store forgets the key
  // again. Never called on a store whose get_for_undo always knows.
  virtual void forget(const ObjectKey& key);

  // ---- verification ----
  // How many reads found bytes that failed their checksum. Such a get() returns null and such a partition
  // encoding is wrong; the caller compares this counter before and after to know (FsService aborts the request).
  virtual std::uint64_t corrupt_reads() const = 0;
  // Partitions in which a read failed verification, until an install replaces them.
  virtual const std::set<std::uint64_t>& corrupt_partitions() const = 0;

  // ---- checkpoints ----
  // False for a store that holds no checkpoint yet: the service puts its initial objects and takes checkpoint 0.
  virtual bool has_checkpoint() const = 0;
  // The newest checkpoint (taken, installed, or found when the store was opened). Precondition: has_checkpoint().
  virtual CheckpointId latest() const = 0;
  // Makes the current objects checkpoint `seq` (>= latest().seq), durable on return, retained until
  // discard_below(s > seq). Cost proportional to the partitions changed since latest(). Returns nullopt and
  // takes nothing (the changes stay pending) if a value read for it failed verification.
  virtual std::optional<CheckpointId> checkpoint(std::uint64_t seq) = 0;
  // Drops retained checkpoints below `seq`; latest() is always kept.
  virtual void discard_below(std::uint64_t seq) = 0;
  // Partition tree and partition bytes of a retained checkpoint. Precondition: retained. A read_partition that
  // meets a corrupt value returns bytes that do not match the tree (a fetcher rejects them) and marks the
  // partition corrupt.
  virtual const PartitionTree& tree(std::uint64_t seq) const = 0;
  virtual Bytes read_partition(std::uint64_t seq, std::uint64_t p) const = 0;

  // ---- install (state transfer) ----
  // Between begin_install and finish_install/abort_install the objects are not changed by the caller.
  virtual void begin_install() = 0;
  // Partition `p` of the target checkpoint (decoded and validated by the caller; keys in p, increasing).
  virtual void stage_partition(std::uint64_t p, std::vector<std::pair<ObjectKey, Value>> objects) = 0;
  // The objects become latest() with every staged partition replaced and every change since latest() undone;
  // that state is checkpoint `seq` (> latest().seq), durable on return. Staged partitions are no longer corrupt.
  virtual CheckpointId finish_install(std::uint64_t seq) = 0;
  virtual void abort_install() = 0;
};

// Everything in memory; durability (optional) is one snapshot blob per checkpoint in a SnapshotStore, named
// "fs.ckpt" (services/checkpoint_keeper_internal.h): correct but O(state) per checkpoint. Nothing it reads can
// fail verification (memory is trusted), so its corruption counters stay zero.
class MemoryCheckpointedStore final : public CheckpointedStore {
 public:
  // `snapshots` may be null (no durability). If it holds "fs.ckpt", that checkpoint is loaded (the process stops
  // if it is unusable, like every snapshot).
  MemoryCheckpointedStore(SnapshotStore* snapshots, std::uint64_t partitions);
  ~MemoryCheckpointedStore() override;
  MemoryCheckpointedStore(const MemoryCheckpointedStore&) = delete;
  MemoryCheckpointedStore& operator=(const MemoryCheckpointedStore&) = delete;

  std::uint64_t partition_count() const override;
  Value get(const ObjectKey& key) const override;
  std::uint64_t put(const ObjectKey& key, Value value) override;
  void erase(const ObjectKey& key) override;
  std::optional<ObjectKey> first_at_or_after(const ObjectKey& from) const override;
  void for_each_in_partition(std::uint64_t p,
                             const std::function<void(const ObjectKey&, const Value&)>& fn) const override;
  std::uint64_t partition_bytes(std::uint64_t p) const override;
  std::uint64_t object_count() const override;

  std::uint64_t corrupt_reads() const override { return 0; }
  const std::set<std::uint64_t>& corrupt_partitions() const override { return no_corrupt_; }

  bool has_checkpoint() const override;
  CheckpointId latest() const override;
  std::optional<CheckpointId> checkpoint(std::uint64_t seq) override;
  void discard_below(std::uint64_t seq) override;
  const PartitionTree& tree(std::uint64_t seq) const override;
  Bytes read_partition(std::uint64_t seq, std::uint64_t p) const override;
  void begin_install() override;
  void stage_partition(std::uint64_t p, std::vector<std::pair<ObjectKey, Value>> objects) override;
  CheckpointId finish_install(std::uint64_t seq) override;
  void abort_install() override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::set<std::uint64_t> no_corrupt_;
};

}  // namespace bftfs::fs
