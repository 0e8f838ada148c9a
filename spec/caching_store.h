// What a speculating mount knows of the replicated file system (docs/SPECULATION.md §6.3): a store of facts that
// the local model's FsService runs over. A fact says a key holds a value, a key is absent, or no key lies in an
// interval [from, next); the model's own changes are facts of the first two kinds. A read the facts do not
// answer throws fs::UnknownKey (the FsService turns it into EntryRun::missing, and the mount FETCHes).
//
// Facts come from FETCH results taken at different times, so together they may describe no single state; the
// replicas' replay of every entry checks whatever the model used, so a mixture costs at most a rollback.
// What is kept as known is never overwritten by a fetched fact (a fetch never undoes the tree's own changes).
//
// Pure: no I/O, no clocks, no threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "services/fs/checkpointed_store.h"
#include "services/fs/fs_codec.h"
#include "services/fs/object_store.h"

namespace bftfs::spec {

class CachingObjectStore final : public fs::CheckpointedStore {
 public:
  // `partitions`: the cluster's FsOptions::partitions (FsService checks that they agree).
  explicit CachingObjectStore(std::uint64_t partitions);
  CachingObjectStore(const CachingObjectStore&) = delete;
  CachingObjectStore& operator=(const CachingObjectStore&) = delete;

  // ---- knowledge ----
  enum class Insert : std::uint8_t {
    kKept,     // it told something the store did not know
    kKnown,    // the store already knew the key (or the interval): dropped
    kInvalid,  // a value that is not a well-formed value of its key: dropped (a lie, or a bug)
  };
  // Inserts a FETCH fact where the store knows nothing: a value or absence of an unknown key (or the value, or
  // the absence, of a key known only to exist: also as the start of a next fact); an interval, of which only the part not yet known counts (keys known inside it
  // keep what is known of them); the key that ends a next fact, known to exist.
  Insert insert(const fs::Fact& fact);
  // Sets what `key` holds (null: absent), replacing what was known: for facts newer than anything fetched
  // before (RESERVE's results). The caller keeps it off keys the model itself changed.
  void replace(const fs::ObjectKey& key, fs::Value value);
  // Every key in [from, to) absent, replacing what was known of them except the keys `keep` names.
  void replace_range_absent(const fs::ObjectKey& from, const fs::ObjectKey& to,
                            const std::function<bool(const fs::ObjectKey&)>& keep);
  // Forgets every key `keep` does not name, and every interval.
  void drop_except(const std::function<bool(const fs::ObjectKey&)>& keep);
  // Forgets what is known of `key` (memory pressure, or a stale fact). The caller keeps it off keys the model
  // itself changed.
  void evict(const fs::ObjectKey& key);
  // Forgets the value of data blocks (kData) that `keep` does not name, in key order, until the values known
  // take at most `target` bytes; each stays known to exist (a later read FETCHes it). Returns the blocks dropped.
  std::size_t evict_data(std::uint64_t target, const std::function<bool(const fs::ObjectKey&)>& keep);
  // The bytes of every value known (what the model's memory bound counts).
  std::uint64_t value_bytes() const { return value_bytes_; }
  // Whether get(key) would answer without throwing, and what (tests).
  bool knows(const fs::ObjectKey& key) const;
  std::size_t known_keys() const { return known_.size(); }
  std::size_t intervals() const { return empty_.size(); }

  // ---- ObjectStore: what FsService reads and changes ----
  std::uint64_t partition_count() const override { return partitions_; }
  // The value, or null if known absent; throws fs::UnknownKey if not known.
  fs::Value get(const fs::ObjectKey& key) const override;
  // Partition sizes are not known: returns 0 (a partition that would overflow on the replicas makes their
  // replay fail, and the epoch rolls back).
  std::uint64_t put(const fs::ObjectKey& key, fs::Value value) override;
  void erase(const fs::ObjectKey& key) override;
  // The least key >= `from` when the facts tell it; throws fs::UnknownKey naming where they stop.
  std::optional<fs::ObjectKey> first_at_or_after(const fs::ObjectKey& from) const override;
  // The keys known present with a known value, of partition p (tests).
  void for_each_in_partition(std::uint64_t p,
                             const std::function<void(const fs::ObjectKey&, const fs::Value&)>& fn) const override;
  std::uint64_t partition_bytes(std::uint64_t p) const override;
  std::uint64_t object_count() const override;

  // ---- CheckpointedStore: undo works; a model takes no checkpoints ----
  std::optional<fs::Value> get_for_undo(const fs::ObjectKey& key) const override;
  void forget(const fs::ObjectKey& key) override;
  std::uint64_t corrupt_reads() const override { return 0; }
  const std::set<std::uint64_t>& corrupt_partitions() const override { return no_corrupt_; }
  bool has_checkpoint() const override { return false; }
  CheckpointId latest() const override;
  Bytes latest_engine_state() const override;
  std::optional<CheckpointId> checkpoint(std::uint64_t seq, std::span<const std::uint8_t> engine_state = {}) override;
  void discard_below(std::uint64_t seq) override;
  const PartitionTree& tree(std::uint64_t seq) const override;
  Bytes read_partition(std::uint64_t seq, std::uint64_t p) const override;
  void begin_install() override;
  void stage_partition(std::uint64_t p, std::vector<std::pair<fs::ObjectKey, fs::Value>> objects) override;
  CheckpointId finish_install(std::uint64_t seq, std::span<const std::uint8_t> engine_state = {}) override;
  void abort_install() override;

 private:
  struct Known {
    enum class State : std::uint8_t { kValue, kAbsent, kPresent } state = State::kValue;
    fs::Value value;  // kValue
  };
  // The interval of empty_ holding `key`, if any.
  std::map<fs::ObjectKey, std::optional<fs::ObjectKey>>::const_iterator interval_of(const fs::ObjectKey& key) const;
  bool in_interval(const fs::ObjectKey& key) const { return interval_of(key) != empty_.end(); }
  // Adds [from, to) (to: nullopt for no end) to the intervals, merging what it touches; false if already known.
  bool add_interval(const fs::ObjectKey& from, const std::optional<fs::ObjectKey>& to);
  Insert insert_next(const fs::Fact& fact);

  // Sets known_[key], keeping value_bytes_; erase_known erases it.
  void set_known(const fs::ObjectKey& key, Known k);
  std::map<fs::ObjectKey, Known>::iterator erase_known(std::map<fs::ObjectKey, Known>::iterator it);

  std::uint64_t partitions_;
  std::map<fs::ObjectKey, Known> known_;
  std::uint64_t value_bytes_ = 0;  // sum of the sizes of known_'s values
  // Intervals [start, end) holding no key but those known_ names (end: nullopt for no end). Disjoint, and
  // merged when they touch.
  std::map<fs::ObjectKey, std::optional<fs::ObjectKey>> empty_;
  std::set<std::uint64_t> no_corrupt_;
};

}  // namespace bftfs::spec
