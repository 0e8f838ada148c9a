// Changing the file service's objects with undo, and commit and rollback of tentative execution (see
// fs_service_impl.h and docs/FILESERVICE.md §4).
#include "services/fs/fs_service_impl.h"

#include <algorithm>
#include <utility>

#include "common/assert.h"
#include "protocol/messages.h"

namespace bftfs::fs {

void FsService::Impl::record(const ObjectKey& k) {
  BFT_ASSERT(mutating);  // read-only execution never mutates
  if (!touched.insert(k).second) return;
  const std::uint64_t corrupt_before = store.corrupt_reads();
  const std::optional<Value> old = store.get_for_undo(k);
  if (store.corrupt_reads() != corrupt_before) throw CorruptRead{};
  if (tracer != nullptr && old.has_value()) tracer->initial.emplace(k, *old);  // kept if already there
  if (partial) ++undo_keys[k];
  undo.push_back(UndoRec{cur_seq, k, old.value_or(nullptr), old.has_value()});
}

void FsService::Impl::put(const ObjectKey& k, Value v) {
  record(k);
  if (store.put(k, std::move(v)) > kPartitionBytesMax) overflow = true;
}

void FsService::Impl::put(const ObjectKey& k, Bytes v) { put(k, make_value(std::move(v))); }

void FsService::Impl::erase(const ObjectKey& k) {
  record(k);
  store.erase(k);
}

void FsService::Impl::drop_undo_key(const ObjectKey& k) {
  const auto it = undo_keys.find(k);
  BFT_ASSERT(it != undo_keys.end());
  if (--it->second == 0) undo_keys.erase(it);
}

void FsService::Impl::restore_to(std::size_t mark) {
  while (undo.size() > mark) {
    UndoRec& u = undo.back();
    if (!u.known) {
      store.forget(u.key);
    } else if (u.old != nullptr) {
      store.put(u.key, std::move(u.old));
    } else {
      store.erase(u.key);
    }
    if (partial) drop_undo_key(u.key);
    undo.pop_back();
  }
}

void FsService::Impl::commit_through(std::uint64_t seq) {
  if (seq <= committed) return;
  committed = seq;
  std::size_t drop = 0;
  while (drop < undo.size() && undo[drop].seq <= seq) {
    if (partial) drop_undo_key(undo[drop].key);
    ++drop;
  }
  undo.erase(undo.begin(), undo.begin() + static_cast<std::ptrdiff_t>(drop));
}

void FsService::Impl::rollback_to(std::uint64_t seq) {
  BFT_ASSERT(!installing);
  BFT_ASSERT(seq >= committed);
  std::size_t keep = undo.size();
  while (keep > 0 && undo[keep - 1].seq > seq) --keep;
  restore_to(keep);
  last_executed = std::min(last_executed, seq);
}

}  // namespace bftfs::fs
