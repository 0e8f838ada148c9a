// MemoryCheckpointedStore: MemoryObjectStore plus the services' CheckpointKeeper; see checkpointed_store.h.
#include "services/fs/checkpointed_store.h"

#include <map>
#include <string>

#include "common/assert.h"
#include "services/checkpoint_keeper_internal.h"

namespace bftfs::fs {

namespace {
constexpr char kBlobName[] = "fs.ckpt";

// Values in our own snapshot were validated when they entered the store (and the blob's digest covers them),
// so loading accepts every value; install validation is the service's (FsService::install_partition).
bool any_value(const ObjectKey&, const Bytes&) { return true; }
}  // namespace

void CheckpointedStore::forget(const ObjectKey& key) {
  (void)key;
  BFT_UNREACHABLE();  // get_for_undo knew every key
}

struct MemoryCheckpointedStore::Impl {
  Impl(SnapshotStore* s, std::uint64_t partitions) : snapshots(s), objects(partitions) {
    Bytes blob;
    if (snapshots == nullptr || !snapshots->get(kBlobName, blob)) return;  // fresh: the service initializes
    std::vector<Bytes> empty(partitions, empty_partition_bytes());
    keeper.emplace(kBlobName, snapshots, std::move(empty));  // loads the blob (fatal if unusable)
    const auto& parts = keeper->latest().parts;
    for (std::uint64_t p = 0; p < partitions; ++p) {
      std::vector<std::pair<ObjectKey, Value>> decoded;
      const std::string why = decode_partition(*parts[p], p, partitions, any_value, decoded);
      if (!why.empty()) services_internal::fatal_snapshot(kBlobName, "partition " + std::to_string(p) + ": " + why);
      objects.replace_partition(p, std::move(decoded));
    }
    objects.clear_dirty();
  }

  SnapshotStore* snapshots;
  MemoryObjectStore objects;
  std::optional<services_internal::CheckpointKeeper> keeper;
  std::optional<std::map<std::uint64_t, std::vector<std::pair<ObjectKey, Value>>>> staged;
};

MemoryCheckpointedStore::MemoryCheckpointedStore(SnapshotStore* snapshots, std::uint64_t partitions)
    : impl_(std::make_unique<Impl>(snapshots, partitions)) {}
MemoryCheckpointedStore::~MemoryCheckpointedStore() = default;

std::uint64_t MemoryCheckpointedStore::partition_count() const { return impl_->objects.partition_count(); }
Value MemoryCheckpointedStore::get(const ObjectKey& key) const { return impl_->objects.get(key); }
std::uint64_t MemoryCheckpointedStore::put(const ObjectKey& key, Value value) {
  BFT_ASSERT(!impl_->staged.has_value());
  return impl_->objects.put(key, std::move(value));
}
void MemoryCheckpointedStore::erase(const ObjectKey& key) {
  BFT_ASSERT(!impl_->staged.has_value());
  impl_->objects.erase(key);
}
std::optional<ObjectKey> MemoryCheckpointedStore::first_at_or_after(const ObjectKey& from) const {
  return impl_->objects.first_at_or_after(from);
}
void MemoryCheckpointedStore::for_each_in_partition(
    std::uint64_t p, const std::function<void(const ObjectKey&, const Value&)>& fn) const {
  impl_->objects.for_each_in_partition(p, fn);
}
std::uint64_t MemoryCheckpointedStore::partition_bytes(std::uint64_t p) const {
  return impl_->objects.partition_bytes(p);
}
std::uint64_t MemoryCheckpointedStore::object_count() const { return impl_->objects.object_count(); }

bool MemoryCheckpointedStore::has_checkpoint() const { return impl_->keeper.has_value(); }

CheckpointId MemoryCheckpointedStore::latest() const {
  BFT_ASSERT(impl_->keeper.has_value());
  const auto& l = impl_->keeper->latest();
  return CheckpointId{l.seq, l.tree.root()};
}

std::optional<CheckpointId> MemoryCheckpointedStore::checkpoint(std::uint64_t seq) {
  BFT_ASSERT(!impl_->staged.has_value());
  Impl& m = *impl_;
  if (!m.keeper.has_value()) {
    // The first checkpoint: the keeper starts from the whole current state. Like the counter's initial state it
    // is not written (a fresh store starts from it again); the store held no blob (else the keeper would exist).
    BFT_ASSERT(seq == 0);
    std::vector<Bytes> parts;
    parts.reserve(m.objects.partition_count());
    for (std::uint64_t p = 0; p < m.objects.partition_count(); ++p) parts.push_back(encode_partition(m.objects, p));
    m.keeper.emplace(kBlobName, m.snapshots, std::move(parts));
    m.objects.clear_dirty();
    return latest();
  }
  std::map<std::uint64_t, Bytes> changed;
  for (std::uint64_t p : m.objects.dirty()) changed.emplace(p, encode_partition(m.objects, p));
  m.objects.clear_dirty();
  return m.keeper->take(seq, std::move(changed));
}

void MemoryCheckpointedStore::discard_below(std::uint64_t seq) {
  BFT_ASSERT(impl_->keeper.has_value());
  impl_->keeper->discard_below(seq);
}

const PartitionTree& MemoryCheckpointedStore::tree(std::uint64_t seq) const {
  BFT_ASSERT(impl_->keeper.has_value());
  return impl_->keeper->retained(seq).tree;
}

Bytes MemoryCheckpointedStore::read_partition(std::uint64_t seq, std::uint64_t p) const {
  BFT_ASSERT(impl_->keeper.has_value());
  const auto& snap = impl_->keeper->retained(seq);
  BFT_ASSERT(p < snap.parts.size());
  return *snap.parts[p];
}

void MemoryCheckpointedStore::begin_install() {
  BFT_ASSERT(impl_->keeper.has_value());
  BFT_ASSERT(!impl_->staged.has_value());
  impl_->staged.emplace();
}

void MemoryCheckpointedStore::stage_partition(std::uint64_t p, std::vector<std::pair<ObjectKey, Value>> objects) {
  BFT_ASSERT(impl_->staged.has_value());
  BFT_ASSERT(p < partition_count());
  impl_->staged->insert_or_assign(p, std::move(objects));
}

CheckpointId MemoryCheckpointedStore::finish_install(std::uint64_t seq) {
  Impl& m = *impl_;
  BFT_ASSERT(m.staged.has_value());
  BFT_ASSERT(seq >= m.keeper->latest().seq);  // equal: it replaces the latest checkpoint (protocol/service.h)
  // Back to the base (latest) for every partition changed since it, then the fetched partitions over it.
  const std::set<std::uint64_t> reverted = m.objects.dirty();
  for (std::uint64_t p : reverted) {
    std::vector<std::pair<ObjectKey, Value>> base;
    const std::string why = decode_partition(*m.keeper->latest().parts[p], p, partition_count(), any_value, base);
    BFT_ASSERT(why.empty());  // our own encoding
    m.objects.replace_partition(p, std::move(base));
  }
  std::map<std::uint64_t, Bytes> changed;
  for (auto& [p, objects] : *m.staged) {
    m.objects.replace_partition(p, std::move(objects));
    changed.emplace(p, encode_partition(m.objects, p));
  }
  m.staged.reset();
  m.objects.clear_dirty();
  return m.keeper->take(seq, std::move(changed));
}

void MemoryCheckpointedStore::abort_install() {
  BFT_ASSERT(impl_->staged.has_value());
  impl_->staged.reset();
}

}  // namespace bftfs::fs
