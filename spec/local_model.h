// The local model of a speculating mount (docs/SPECULATION.md §6.3): the file service's own code (FsService)
// over a CachingObjectStore, with the cluster's FsOptions and no initial state. The tree's requests run here as
// entries of its stream; their answers are what the tree is told, and the replicas replay the same entries.
//
// Epochs are the undo unit: epoch e's entries execute with ExecContext::seq = e, so when e commits its undo
// records go (commit_through), and when epoch j fails everything from j on is undone (rollback_to(j - 1)). The
// overlay (what uncommitted epochs changed: names, data, attributes, the pool's front) is the set of keys with
// undo records; fetched facts never overwrite it.
//
// Pure: no I/O, no clocks, no threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "common/types.h"
#include "services/fs/fs_codec.h"
#include "services/fs/fs_service.h"
#include "spec/caching_store.h"

namespace bftfs::spec {

// How the facts of one FETCH result fared (CachingObjectStore::Insert, counted).
struct FactCounts {
  std::size_t kept = 0;
  std::size_t known = 0;
  std::size_t invalid = 0;
};

class LocalModel {
 public:
  // The model of stream `stream` of PBFT client `client` (the mount's relay identity), over `options` (the
  // cluster's: positions, capacities and limits must be the replicas').
  LocalModel(fs::FsOptions options, NodeId client, std::uint64_t stream);
  LocalModel(const LocalModel&) = delete;
  LocalModel& operator=(const LocalModel&) = delete;

  // Executes an entry's request (op 0 TIME; spec/entry_builder.h) in epoch `epoch`, which is at least the
  // epoch of every execution not rolled back. A complete run's changes stay in the overlay; an incomplete one
  // (EntryRun::missing: FETCH and insert, then run again) changed nothing.
  fs::EntryRun execute(std::uint64_t epoch, const fs::Request& request);

  // The facts of a FETCH result, where the model knows nothing (never over the overlay).
  FactCounts insert(const std::vector<fs::Fact>& facts);
  // A RESERVE result: the pool entries it appended, and every key of each reserved inode number absent (work
  // inside new files and directories needs no fetch). Knowledge these make stale is dropped: the superblock's
  // counters and the free-number records, unless the overlay holds them.
  void insert_reserved(const fs::OpResult& reserve);

  // Epochs up to `epoch` applied: their changes are the replicas' now (clean; fetched facts may replace them).
  void commit_through(std::uint64_t epoch);
  // Undoes every epoch after `epoch` (>= the last committed).
  void rollback_to(std::uint64_t epoch);
  // Forgets every clean object (after a rollback's restore: the re-run fetches consensus values).
  void drop_clean();
  // Bounds the bytes of the values the model keeps (0: no bound; `bftfs run --model-mb`): past it, clean data
  // blocks are forgotten, in key order, down to 3/4 of it, whenever facts arrive or epochs commit. Metadata is
  // kept (a restore's size checks need what the tree saw), and so is the overlay. What a tree wrote stays clean
  // in the model once committed; without a bound an unpack of 10 GB would keep 10 GB in the daemon.
  void set_memory_bound(std::uint64_t bytes);

  // The overlay: each key an uncommitted epoch changed, with its value now (null: absent), in key order.
  std::vector<std::pair<fs::ObjectKey, fs::Value>> dirty_objects() const;
  bool is_dirty(const fs::ObjectKey& key) const { return service_->is_uncommitted(key); }
  const CachingObjectStore& store() const { return *store_; }
  NodeId client() const { return client_; }
  std::uint64_t stream() const { return stream_; }

 private:
  void keep_bound();

  NodeId client_;
  std::uint64_t stream_;
  std::uint64_t memory_bound_ = 0;
  std::uint64_t evict_above_ = 0;  // keep_bound scans only past this (what could not be evicted, plus a margin)
  CachingObjectStore* store_;  // owned by service_
  std::unique_ptr<fs::FsService> service_;
};

}  // namespace bftfs::spec
