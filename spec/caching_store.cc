// The local model's store of facts: see caching_store.h.
#include "spec/caching_store.h"

#include <iterator>
#include <utility>

#include "common/assert.h"
#include "services/fs/fs_service.h"

namespace bftfs::spec {

using fs::ObjectKey;
using fs::Value;

CachingObjectStore::CachingObjectStore(std::uint64_t partitions) : partitions_(partitions) {
  BFT_ASSERT(partitions > 0);
}

namespace {

std::uint64_t bytes_of(const Value& v) { return v == nullptr ? 0 : v->size(); }

}  // namespace

void CachingObjectStore::set_known(const ObjectKey& key, Known k) {
  auto [it, fresh] = known_.try_emplace(key);
  if (!fresh) value_bytes_ -= bytes_of(it->second.value);
  value_bytes_ += bytes_of(k.value);
  it->second = std::move(k);
}

std::map<ObjectKey, CachingObjectStore::Known>::iterator CachingObjectStore::erase_known(
    std::map<ObjectKey, Known>::iterator it) {
  value_bytes_ -= bytes_of(it->second.value);
  return known_.erase(it);
}

// ---- knowledge ----

std::map<ObjectKey, std::optional<ObjectKey>>::const_iterator CachingObjectStore::interval_of(
    const ObjectKey& key) const {
  auto it = empty_.upper_bound(key);
  if (it == empty_.begin()) return empty_.end();
  --it;  // the last interval starting at or before `key`
  if (!it->second.has_value() || key < *it->second) return it;
  return empty_.end();
}

bool CachingObjectStore::add_interval(const ObjectKey& from, const std::optional<ObjectKey>& to) {
  if (to.has_value() && !(from < *to)) return false;  // empty
  const auto holder = interval_of(from);
  if (holder != empty_.end() && (!holder->second.has_value() || (to.has_value() && !(*holder->second < *to)))) {
    return false;  // known already
  }
  auto it = empty_.upper_bound(from);
  if (it != empty_.begin()) {
    const auto before = std::prev(it);
    if (!before->second.has_value() || !(*before->second < from)) it = before;  // it reaches `from`: merge
  }
  ObjectKey start = from;
  std::optional<ObjectKey> end = to;
  // Every interval starting at or before the new end touches the new one.
  while (it != empty_.end() && (!end.has_value() || !(*end < it->first))) {
    if (it->first < start) start = it->first;
    if (!it->second.has_value()) {
      end.reset();
    } else if (end.has_value() && *end < *it->second) {
      end = it->second;
    }
    it = empty_.erase(it);
  }
  empty_.emplace(std::move(start), std::move(end));
  return true;
}

CachingObjectStore::Insert CachingObjectStore::insert(const fs::Fact& fact) {
  BFT_ASSERT(fs::is_canonical(fact.key));  // decoded keys are
  switch (fact.kind) {
    case fs::FactKind::kValue: {
      if (!fs::valid_object(fact.key, fact.value)) return Insert::kInvalid;
      const auto k = known_.find(fact.key);
      if (k != known_.end()) {
        if (k->second.state != Known::State::kPresent) return Insert::kKnown;
        set_known(fact.key, Known{Known::State::kValue, fs::make_value(fact.value)});  // its value, known to exist
        return Insert::kKept;
      }
      if (in_interval(fact.key)) return Insert::kKnown;
      set_known(fact.key, Known{Known::State::kValue, fs::make_value(fact.value)});
      return Insert::kKept;
    }
    case fs::FactKind::kAbsent: {
      const auto k = known_.find(fact.key);
      if (k != known_.end()) {
        if (k->second.state != Known::State::kPresent) return Insert::kKnown;
        k->second = Known{Known::State::kAbsent, nullptr};  // gone since: what it is now, not what it was
        return Insert::kKept;
      }
      if (in_interval(fact.key)) return Insert::kKnown;
      known_.emplace(fact.key, Known{Known::State::kAbsent, nullptr});
      return Insert::kKept;
    }
    case fs::FactKind::kNext: return insert_next(fact);
  }
  return Insert::kInvalid;
}

CachingObjectStore::Insert CachingObjectStore::insert_next(const fs::Fact& fact) {
  // A key known only to exist, which a newer state says is gone (the fact's interval starts at it): without
  // taking this, a read of its value would ask again for ever, and FETCH would keep answering that it is gone.
  bool kept = false;
  if (const auto k = known_.find(fact.key); k != known_.end() && k->second.state == Known::State::kPresent) {
    k->second = Known{Known::State::kAbsent, nullptr};
    kept = true;
  }
  kept = add_interval(fact.key, fact.next) || kept;
  if (fact.next.has_value() && known_.count(*fact.next) == 0 && !in_interval(*fact.next)) {
    known_.emplace(*fact.next, Known{Known::State::kPresent, nullptr});
    kept = true;
  }
  return kept ? Insert::kKept : Insert::kKnown;
}

void CachingObjectStore::replace(const ObjectKey& key, Value value) {
  if (value != nullptr) {
    set_known(key, Known{Known::State::kValue, std::move(value)});
  } else {
    set_known(key, Known{Known::State::kAbsent, nullptr});
  }
}

void CachingObjectStore::replace_range_absent(const ObjectKey& from, const ObjectKey& to,
                                              const std::function<bool(const ObjectKey&)>& keep) {
  for (auto it = known_.lower_bound(from); it != known_.end() && it->first < to;) {
    it = keep(it->first) ? std::next(it) : erase_known(it);
  }
  add_interval(from, to);
}

void CachingObjectStore::drop_except(const std::function<bool(const ObjectKey&)>& keep) {
  for (auto it = known_.begin(); it != known_.end();) it = keep(it->first) ? std::next(it) : erase_known(it);
  empty_.clear();
}

void CachingObjectStore::evict(const ObjectKey& key) {
  if (const auto it = known_.find(key); it != known_.end()) erase_known(it);
}

std::size_t CachingObjectStore::evict_data(std::uint64_t target,
                                           const std::function<bool(const ObjectKey&)>& keep) {
  std::size_t dropped = 0;
  for (auto it = known_.begin(); it != known_.end() && value_bytes_ > target; ++it) {
    if (it->first.kind != fs::Kind::kData || it->second.state != Known::State::kValue || keep(it->first)) continue;
    // Known to exist, not erased: an interval may cover the key (the block was written inside a range known
    // empty), and erasing it would make the interval say it is absent.
    value_bytes_ -= bytes_of(it->second.value);
    it->second = Known{Known::State::kPresent, nullptr};
    ++dropped;
  }
  return dropped;
}

bool CachingObjectStore::knows(const ObjectKey& key) const {
  const auto k = known_.find(key);
  if (k != known_.end()) return k->second.state != Known::State::kPresent;
  return in_interval(key);
}

// ---- ObjectStore ----

Value CachingObjectStore::get(const ObjectKey& key) const {
  const auto k = known_.find(key);
  if (k != known_.end()) {
    if (k->second.state == Known::State::kPresent) throw fs::UnknownKey{key};  // it exists; its value is unknown
    return k->second.value;
  }
  if (in_interval(key)) return nullptr;
  throw fs::UnknownKey{key};
}

std::uint64_t CachingObjectStore::put(const ObjectKey& key, Value value) {
  BFT_ASSERT(value != nullptr);
  set_known(key, Known{Known::State::kValue, std::move(value)});
  return 0;
}

void CachingObjectStore::erase(const ObjectKey& key) { set_known(key, Known{Known::State::kAbsent, nullptr}); }

std::optional<ObjectKey> CachingObjectStore::first_at_or_after(const ObjectKey& from) const {
  BFT_ASSERT(fs::is_canonical(from));
  // The first key known to exist; then walk what is known to be empty from `from` until it or the end.
  std::optional<ObjectKey> present;
  for (auto it = known_.lower_bound(from); it != known_.end(); ++it) {
    if (it->second.state != Known::State::kAbsent) {
      present = it->first;
      break;
    }
  }
  ObjectKey pos = from;
  for (;;) {  // each round passes an interval or a key known absent
    if (present.has_value() && *present == pos) return present;
    std::optional<ObjectKey> reach;  // nothing unknown in [pos, reach); nullopt: to the end
    const auto iv = interval_of(pos);
    if (iv != empty_.end()) {
      reach = iv->second;
    } else {
      const auto k = known_.find(pos);
      if (k == known_.end()) throw fs::UnknownKey{pos};
      BFT_ASSERT(k->second.state == Known::State::kAbsent);  // else it would be `present`
      reach = fs::key_successor(pos);
    }
    if (present.has_value() && (!reach.has_value() || *present < *reach)) return present;
    if (!reach.has_value()) return std::nullopt;
    pos = *reach;
  }
}

void CachingObjectStore::for_each_in_partition(std::uint64_t p,
                                               const std::function<void(const ObjectKey&, const Value&)>& fn) const {
  for (const auto& [k, known] : known_) {
    if (known.state == Known::State::kValue && fs::partition_of(k, partitions_) == p) fn(k, known.value);
  }
}

std::uint64_t CachingObjectStore::partition_bytes(std::uint64_t p) const {
  (void)p;
  return 0;  // not known
}

std::uint64_t CachingObjectStore::object_count() const {
  std::uint64_t n = 0;
  for (const auto& [k, known] : known_) n += known.state != Known::State::kAbsent ? 1 : 0;
  return n;
}

// ---- CheckpointedStore ----

std::optional<Value> CachingObjectStore::get_for_undo(const ObjectKey& key) const {
  const auto k = known_.find(key);
  if (k != known_.end()) {
    if (k->second.state == Known::State::kPresent) return std::nullopt;
    return k->second.value;
  }
  if (in_interval(key)) return Value{};
  return std::nullopt;
}

void CachingObjectStore::forget(const ObjectKey& key) { evict(key); }

// A model takes no checkpoints and installs nothing: FsService over a partial store never asks.
CheckpointId CachingObjectStore::latest() const { BFT_UNREACHABLE(); }
Bytes CachingObjectStore::latest_engine_state() const { BFT_UNREACHABLE(); }
std::optional<CheckpointId> CachingObjectStore::checkpoint(std::uint64_t, std::span<const std::uint8_t>) {
  BFT_UNREACHABLE();
}
void CachingObjectStore::discard_below(std::uint64_t) { BFT_UNREACHABLE(); }
const PartitionTree& CachingObjectStore::tree(std::uint64_t) const { BFT_UNREACHABLE(); }
Bytes CachingObjectStore::read_partition(std::uint64_t, std::uint64_t) const { BFT_UNREACHABLE(); }
void CachingObjectStore::begin_install() { BFT_UNREACHABLE(); }
void CachingObjectStore::stage_partition(std::uint64_t, std::vector<std::pair<ObjectKey, Value>>) {
  BFT_UNREACHABLE();
}
CheckpointId CachingObjectStore::finish_install(std::uint64_t, std::span<const std::uint8_t>) { BFT_UNREACHABLE(); }
void CachingObjectStore::abort_install() { BFT_UNREACHABLE(); }

}  // namespace bftfs::spec
