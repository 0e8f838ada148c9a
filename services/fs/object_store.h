// The file service's state as objects (docs/FILESERVICE.md §3): keys, the store interface every object access
// goes through, the in-memory store, and the canonical encoding of a partition.
//
// The service reaches state only through ObjectStore (and its checkpoints through CheckpointedStore,
// services/fs/checkpointed_store.h), so the disk-backed store of the replica (storage/disk_object_store.h, §6)
// replaces the in-memory one without touching the semantics.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/types.h"

namespace bftfs {
class ByteReader;
}

namespace bftfs::fs {

// Object kinds, in key order within an inode number. The kinds from kStream on are the speculation streams'
// (docs/SPECULATION.md §5.2), all under inode number 0; their names are binary, fields big-endian, so that the
// order of names is the order of the numbers in them (a client's streams, a part's chunks are contiguous).
enum class Kind : std::uint8_t {
  kSuper = 1,      // (0, kSuper, 0)
  kFree = 2,       // (0, kFree, ino): a free inode number and its last generation
  kInode = 3,      // (ino, kInode, 0)
  kName = 4,       // (dir, kName, name)
  kEntry = 5,      // (dir, kEntry, cookie)
  kData = 6,       // (ino, kData, block)
  kStream = 7,     // (0, kStream, client u32 || stream u64): a stream's chain, staging and pool tail
  kPoolHead = 8,   // (0, kPoolHead, client || stream): the index of the pool's front (absent: 0)
  kPool = 9,       // (0, kPool, client || stream || index u64): one reserved inode number
  kStaged = 10,    // (0, kStaged, client || stream || part u32 || chunk u32): bytes of a staged part
};
inline constexpr std::uint8_t kKindMax = 10;
// Kinds whose keys carry a name (encoded as u16 len || name) instead of an index.
constexpr bool is_name_kind(Kind k) { return k == Kind::kName || k >= Kind::kStream; }

struct ObjectKey {
  std::uint64_t ino = 0;
  Kind kind = Kind::kSuper;
  std::uint64_t index = 0;  // 0 for kName
  std::string name;         // kName only
  friend auto operator<=>(const ObjectKey&, const ObjectKey&) = default;
  friend bool operator==(const ObjectKey&, const ObjectKey&) = default;

  static ObjectKey super() { return {0, Kind::kSuper, 0, {}}; }
  static ObjectKey free_ino(std::uint64_t ino) { return {0, Kind::kFree, ino, {}}; }
  static ObjectKey inode(std::uint64_t ino) { return {ino, Kind::kInode, 0, {}}; }
  static ObjectKey dir_name(std::uint64_t dir, std::string n) { return {dir, Kind::kName, 0, std::move(n)}; }
  static ObjectKey entry(std::uint64_t dir, std::uint64_t cookie) { return {dir, Kind::kEntry, cookie, {}}; }
  static ObjectKey data(std::uint64_t ino, std::uint64_t block) { return {ino, Kind::kData, block, {}}; }
};

// Canonical keys are those the key encoding below can carry: name kinds with index 0, other kinds with an empty
// name. Every key a store holds is canonical, and so is every key a scan starts from.
bool is_canonical(const ObjectKey& key);
// The smallest canonical key greater than canonical `key` (nullopt past the last one): scans that continue
// "after" a key (FETCH's trace, the local model's intervals, docs/SPECULATION.md §5.7) start there.
std::optional<ObjectKey> key_successor(const ObjectKey& key);

// Values are immutable and shared: an undo record or a retained copy costs a pointer, not the bytes.
using Value = std::shared_ptr<const Bytes>;
inline Value make_value(Bytes b) { return std::make_shared<const Bytes>(std::move(b)); }

// Key encoding (in partitions, for hashing, and in FETCH's keys and facts):
// u64 ino || u8 kind || (name kinds: u16 len || name | else u64 index).
void encode_key(const ObjectKey& key, Bytes& out);
std::size_t encoded_key_bytes(const ObjectKey& key);
// Reads one key as encode_key writes it (canonical by construction). False if truncated or of an unknown kind.
bool read_key(ByteReader& r, ObjectKey& key);
// The partition of `key` among `partitions`: first 8 bytes of BLAKE2b-256(encoded key), little-endian, mod P.
std::uint64_t partition_of(const ObjectKey& key, std::uint64_t partitions);
// Bytes one object adds to its partition's encoding.
inline std::size_t object_bytes(const ObjectKey& key, const Bytes& value) {
  return encoded_key_bytes(key) + 4 + value.size();
}

class ObjectStore {
 public:
  virtual ~ObjectStore() = default;
  virtual std::uint64_t partition_count() const = 0;
  // The value of `key`, or null if absent.
  virtual Value get(const ObjectKey& key) const = 0;
  // Sets `key` to `value` (non-null) and marks its partition dirty. Returns the partition's encoded size after.
  virtual std::uint64_t put(const ObjectKey& key, Value value) = 0;
  // Removes `key` if present and marks its partition dirty.
  virtual void erase(const ObjectKey& key) = 0;
  // The smallest key >= `from`, if any (ordered scans: readdir, truncate, free inode numbers).
  virtual std::optional<ObjectKey> first_at_or_after(const ObjectKey& from) const = 0;
  // Calls `fn` for every object of partition `p`, in key order.
  virtual void for_each_in_partition(std::uint64_t p,
                                     const std::function<void(const ObjectKey&, const Value&)>& fn) const = 0;
  // Encoded size of partition `p` (what encode_partition would return), tracked incrementally.
  virtual std::uint64_t partition_bytes(std::uint64_t p) const = 0;
  // Number of objects (tests, invariants).
  virtual std::uint64_t object_count() const = 0;
};

// Everything in memory: an ordered map for scans plus a (partition, key) index for checkpoints.
class MemoryObjectStore final : public ObjectStore {
 public:
  explicit MemoryObjectStore(std::uint64_t partitions);
  MemoryObjectStore(const MemoryObjectStore&) = delete;
  MemoryObjectStore& operator=(const MemoryObjectStore&) = delete;

  std::uint64_t partition_count() const override { return partitions_; }
  Value get(const ObjectKey& key) const override;
  std::uint64_t put(const ObjectKey& key, Value value) override;
  void erase(const ObjectKey& key) override;
  std::optional<ObjectKey> first_at_or_after(const ObjectKey& from) const override;
  void for_each_in_partition(std::uint64_t p,
                             const std::function<void(const ObjectKey&, const Value&)>& fn) const override;
  std::uint64_t partition_bytes(std::uint64_t p) const override { return part_bytes_[p]; }
  std::uint64_t object_count() const override { return objects_.size(); }
  // Replaces every object of partition `p` with `objects` (each must belong to p). Marks p dirty.
  void replace_partition(std::uint64_t p, std::vector<std::pair<ObjectKey, Value>> objects);
  // Partitions changed since the last clear_dirty().
  const std::set<std::uint64_t>& dirty() const { return dirty_; }
  void clear_dirty() { dirty_.clear(); }

 private:
  struct Slot {
    Value value;
    std::uint64_t partition = 0;
  };
  std::uint64_t partitions_;
  std::map<ObjectKey, Slot> objects_;
  std::set<std::pair<std::uint64_t, ObjectKey>> by_partition_;
  std::vector<std::uint64_t> part_bytes_;
  std::set<std::uint64_t> dirty_;
};

// Canonical partition bytes: u32 count || count * (key || u32 len || value), keys strictly increasing.
Bytes encode_partition(const ObjectStore& store, std::uint64_t p);
// The same encoding of `objects` (strictly increasing keys of one partition; asserted).
Bytes encode_objects(const std::vector<std::pair<ObjectKey, Value>>& objects);
// The bytes of an empty partition.
Bytes empty_partition_bytes();
// Accepts only the canonical encoding of partition `p` of `partitions` whose values pass `value_ok`; returns ""
// and fills `out`, or the reason.
std::string decode_partition(std::span<const std::uint8_t> bytes, std::uint64_t p, std::uint64_t partitions,
                             const std::function<bool(const ObjectKey&, const Bytes&)>& value_ok,
                             std::vector<std::pair<ObjectKey, Value>>& out);

}  // namespace bftfs::fs
