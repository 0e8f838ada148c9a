// The local model: see local_model.h.
#include "spec/local_model.h"

#include <algorithm>
#include <utility>

#include "common/assert.h"
#include "services/fs/stream_objects.h"

namespace bftfs::spec {

using fs::ObjectKey;

LocalModel::LocalModel(fs::FsOptions options, NodeId client, std::uint64_t stream)
    : client_(client), stream_(stream) {
  auto store = std::make_unique<CachingObjectStore>(options.partitions);
  store_ = store.get();
  service_ = std::make_unique<fs::FsService>(fs::PartialState{}, std::move(store), options);
}

fs::EntryRun LocalModel::execute(std::uint64_t epoch, const fs::Request& request) {
  ExecContext ctx;
  ctx.seq = epoch;
  ctx.client = client_;
  return service_->execute_entry(ctx, stream_, request);
}

FactCounts LocalModel::insert(const std::vector<fs::Fact>& facts) {
  FactCounts counts;
  for (const fs::Fact& f : facts) {
    // The overlay is always known to the store (the model's own changes), so it is never overwritten.
    switch (store_->insert(f)) {
      case CachingObjectStore::Insert::kKept: ++counts.kept; break;
      case CachingObjectStore::Insert::kKnown: ++counts.known; break;
      case CachingObjectStore::Insert::kInvalid: ++counts.invalid; break;
    }
  }
  keep_bound();
  return counts;
}

void LocalModel::insert_reserved(const fs::OpResult& reserve) {
  BFT_ASSERT(reserve.code == fs::OpCode::kReserve);
  BFT_ASSERT(reserve.err == fs::err::kOk);
  const auto dirty = [this](const ObjectKey& k) { return service_->is_uncommitted(k); };
  const fs::StreamId sid{client_, stream_};
  for (std::size_t i = 0; i < reserve.reserved.size(); ++i) {
    const fs::ReservedInode& ri = reserve.reserved[i];
    const ObjectKey pool = fs::pool_key(sid, reserve.pool_first + i);
    if (!dirty(pool)) store_->replace(pool, fs::make_value(fs::encode_reserved(ri)));
    const ObjectKey free = ObjectKey::free_ino(ri.ino);
    if (!dirty(free)) store_->replace(free, nullptr);
    // No key of a free number exists: its inode, names, entries and data are all absent.
    const ObjectKey first{ri.ino, fs::Kind::kSuper, 0, {}};
    store_->replace_range_absent(first, ObjectKey{ri.ino + 1, fs::Kind::kSuper, 0, {}}, dirty);
  }
  if (!dirty(ObjectKey::super())) store_->evict(ObjectKey::super());  // its counters changed
}

void LocalModel::commit_through(std::uint64_t epoch) {
  service_->commit_through(epoch);
  keep_bound();
}

void LocalModel::set_memory_bound(std::uint64_t bytes) {
  memory_bound_ = evict_above_ = bytes;
  keep_bound();
}

void LocalModel::keep_bound() {
  if (memory_bound_ == 0 || store_->value_bytes() <= evict_above_) return;
  store_->evict_data(memory_bound_ / 4 * 3, [this](const ObjectKey& k) { return service_->is_uncommitted(k); });
  // What metadata and the overlay keep above the bound cannot be evicted: the next scan waits until a quarter
  // of the bound more has arrived, instead of scanning the whole store at every FETCH and commit.
  evict_above_ = std::max(memory_bound_, store_->value_bytes() + memory_bound_ / 4);
}

void LocalModel::rollback_to(std::uint64_t epoch) { service_->rollback_to(epoch); }

void LocalModel::drop_clean() {
  store_->drop_except([this](const ObjectKey& k) { return service_->is_uncommitted(k); });
}

std::vector<std::pair<ObjectKey, fs::Value>> LocalModel::dirty_objects() const {
  std::vector<std::pair<ObjectKey, fs::Value>> out;
  for (const ObjectKey& k : service_->uncommitted_keys()) {
    const std::optional<fs::Value> v = store_->get_for_undo(k);
    BFT_ASSERT(v.has_value());  // the model changed it, so it knows it
    out.emplace_back(k, *v);
  }
  return out;
}

}  // namespace bftfs::spec
