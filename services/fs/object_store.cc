// Object keys, the in-memory object store and partition encoding; see object_store.h.
#include "services/fs/object_store.h"

#include "common/assert.h"
#include "common/codec.h"
#include "common/crypto.h"
#include "protocol/messages.h"

namespace bftfs::fs {

namespace {
constexpr std::uint64_t kEmptyPartitionBytes = 4;  // the count
}  // namespace

bool is_canonical(const ObjectKey& key) {
  const auto kind = static_cast<std::uint8_t>(key.kind);
  if (kind < 1 || kind > kKindMax) return false;
  if (is_name_kind(key.kind)) return key.index == 0 && key.name.size() <= 0xFFFF;
  return key.name.empty();
}

std::optional<ObjectKey> key_successor(const ObjectKey& key) {
  BFT_ASSERT(is_canonical(key));
  // A name followed by NUL is the least string above it; nothing canonical lies between.
  if (is_name_kind(key.kind) && key.name.size() < 0xFFFF) return ObjectKey{key.ino, key.kind, 0, key.name + '\0'};
  if (!is_name_kind(key.kind) && key.index < UINT64_MAX) return ObjectKey{key.ino, key.kind, key.index + 1, {}};
  // Past the last key of its kind: the least key of the next kind (an index of 0 or an empty name).
  const auto kind = static_cast<std::uint8_t>(key.kind);
  if (kind < kKindMax) return ObjectKey{key.ino, static_cast<Kind>(kind + 1), 0, {}};
  if (key.ino < UINT64_MAX) return ObjectKey{key.ino + 1, Kind::kSuper, 0, {}};
  return std::nullopt;
}

void encode_key(const ObjectKey& key, Bytes& out) {
  ByteWriter w(out);
  w.u64(key.ino);
  w.u8(static_cast<std::uint8_t>(key.kind));
  if (is_name_kind(key.kind)) {
    BFT_ASSERT(key.name.size() <= 0xFFFF);
    w.u16(static_cast<std::uint16_t>(key.name.size()));
    w.bytes(key.name);
  } else {
    w.u64(key.index);
  }
}

std::size_t encoded_key_bytes(const ObjectKey& key) {
  return 9 + (is_name_kind(key.kind) ? 2 + key.name.size() : 8);
}

bool read_key(ByteReader& r, ObjectKey& k) {
  std::uint8_t kind = 0;
  if (!r.u64(k.ino) || !r.u8(kind)) return false;
  if (kind < 1 || kind > kKindMax) return false;
  k.kind = static_cast<Kind>(kind);
  k.index = 0;
  k.name.clear();
  if (!is_name_kind(k.kind)) return r.u64(k.index);
  std::uint16_t n = 0;
  std::span<const std::uint8_t> name;
  if (!r.u16(n) || !r.view(n, name)) return false;
  k.name.assign(reinterpret_cast<const char*>(name.data()), name.size());
  return true;
}

std::uint64_t partition_of(const ObjectKey& key, std::uint64_t partitions) {
  BFT_ASSERT(partitions > 0);
  Bytes k;
  encode_key(key, k);
  const Digest d = digest_of(k);
  return load_u64_le(d.bytes.data()) % partitions;
}

MemoryObjectStore::MemoryObjectStore(std::uint64_t partitions)
    : partitions_(partitions), part_bytes_(partitions, kEmptyPartitionBytes) {
  BFT_ASSERT(partitions > 0);
}

Value MemoryObjectStore::get(const ObjectKey& key) const {
  auto it = objects_.find(key);
  return it == objects_.end() ? nullptr : it->second.value;
}

std::uint64_t MemoryObjectStore::put(const ObjectKey& key, Value value) {
  BFT_ASSERT(value != nullptr);
  auto it = objects_.find(key);
  if (it == objects_.end()) {
    const std::uint64_t p = partition_of(key, partitions_);
    part_bytes_[p] += object_bytes(key, *value);
    by_partition_.emplace(p, key);
    objects_.emplace(key, Slot{std::move(value), p});
    dirty_.insert(p);
    return part_bytes_[p];
  }
  const std::uint64_t p = it->second.partition;
  part_bytes_[p] -= it->second.value->size();
  part_bytes_[p] += value->size();
  it->second.value = std::move(value);
  dirty_.insert(p);
  return part_bytes_[p];
}

void MemoryObjectStore::erase(const ObjectKey& key) {
  auto it = objects_.find(key);
  if (it == objects_.end()) return;
  const std::uint64_t p = it->second.partition;
  part_bytes_[p] -= object_bytes(key, *it->second.value);
  by_partition_.erase({p, key});
  objects_.erase(it);
  dirty_.insert(p);
}

std::optional<ObjectKey> MemoryObjectStore::first_at_or_after(const ObjectKey& from) const {
  auto it = objects_.lower_bound(from);
  if (it == objects_.end()) return std::nullopt;
  return it->first;
}

void MemoryObjectStore::for_each_in_partition(
    std::uint64_t p, const std::function<void(const ObjectKey&, const Value&)>& fn) const {
  BFT_ASSERT(p < partitions_);
  for (auto it = by_partition_.lower_bound({p, ObjectKey{}}); it != by_partition_.end() && it->first == p; ++it) {
    fn(it->second, objects_.at(it->second).value);
  }
}

void MemoryObjectStore::replace_partition(std::uint64_t p, std::vector<std::pair<ObjectKey, Value>> objects) {
  BFT_ASSERT(p < partitions_);
  std::vector<ObjectKey> old;
  for (auto it = by_partition_.lower_bound({p, ObjectKey{}}); it != by_partition_.end() && it->first == p; ++it) {
    old.push_back(it->second);
  }
  for (const ObjectKey& k : old) erase(k);
  for (auto& [k, v] : objects) {
    BFT_ASSERT(partition_of(k, partitions_) == p);
    put(k, std::move(v));
  }
  dirty_.insert(p);
}

Bytes encode_partition(const ObjectStore& store, std::uint64_t p) {
  Bytes out;
  out.reserve(store.partition_bytes(p));
  std::uint32_t count = 0;
  ByteWriter w(out);
  w.u32(0);  // patched below
  store.for_each_in_partition(p, [&](const ObjectKey& k, const Value& v) {
    encode_key(k, out);
    w.blob(*v);
    ++count;
  });
  w.patch_u32(0, count);
  BFT_ASSERT(out.size() == store.partition_bytes(p));
  BFT_ASSERT(out.size() <= kPartitionBytesMax);
  return out;
}

Bytes encode_objects(const std::vector<std::pair<ObjectKey, Value>>& objects) {
  BFT_ASSERT(objects.size() <= UINT32_MAX);
  Bytes out;
  ByteWriter w(out);
  w.u32(static_cast<std::uint32_t>(objects.size()));
  for (std::size_t i = 0; i < objects.size(); ++i) {
    BFT_ASSERT(i == 0 || objects[i - 1].first < objects[i].first);
    BFT_ASSERT(objects[i].second != nullptr);
    encode_key(objects[i].first, out);
    w.blob(*objects[i].second);
  }
  return out;
}

Bytes empty_partition_bytes() { return Bytes(kEmptyPartitionBytes, 0); }

std::string decode_partition(std::span<const std::uint8_t> bytes, std::uint64_t p, std::uint64_t partitions,
                             const std::function<bool(const ObjectKey&, const Bytes&)>& value_ok,
                             std::vector<std::pair<ObjectKey, Value>>& out) {
  ByteReader r(bytes);
  std::uint32_t count = 0;
  if (!r.u32(count)) return "truncated count";
  // Every object takes at least 15 bytes (an 11-byte key and a 4-byte length): a larger count is a lie, and
  // must not become an allocation.
  if (count > r.remaining() / 15) return "count larger than the bytes allow";
  std::vector<std::pair<ObjectKey, Value>> objects;
  objects.reserve(count);
  for (std::uint32_t i = 0; i < count; ++i) {
    ObjectKey k;
    if (!read_key(r, k)) return "truncated key or unknown kind in object " + std::to_string(i);
    Bytes v;
    if (!r.blob(v, kPartitionBytesMax)) return "truncated value of object " + std::to_string(i);
    if (!objects.empty() && !(objects.back().first < k)) return "keys not strictly increasing";
    if (partition_of(k, partitions) != p) return "object " + std::to_string(i) + " belongs to another partition";
    if (!value_ok(k, v)) return "invalid value in object " + std::to_string(i);
    objects.emplace_back(std::move(k), make_value(std::move(v)));
  }
  if (!r.done()) return "trailing bytes";
  out = std::move(objects);
  return "";
}

}  // namespace bftfs::fs
