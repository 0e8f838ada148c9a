// FETCH (see fs_service_impl.h and docs/SPECULATION.md §5.7): what a local model is filled from. Keys mode
// answers per key; trace mode runs a request as an entry of the stream would run, undoes it, and reports what
// it read, as facts about the state before it.
//
// Why facts about the state before the request: the model executes the same request over them and makes the
// same changes itself, so it needs what the request found, not what it left. A read of a key the request had
// already changed reports the key's earlier value (the model holds its own change and drops the fact); a scan
// reports the keys the state held before, continuing past keys the request had removed (the model, having
// removed them too, needs to know what lies beyond them).
#include <algorithm>
#include <utility>

#include "common/assert.h"
#include "services/fs/fs_service_impl.h"

namespace bftfs::fs {

void FsService::Impl::Tracer::add(Fact f) {
  if (!complete) return;
  const std::size_t n = encoded_fact_bytes(f);
  if (bytes + n > kFetchFactBytesMax) {
    complete = false;  // the prefix that fits is returned; the client asks again for the rest
    return;
  }
  bytes += n;
  facts.push_back(std::move(f));
}

std::uint32_t FsService::Impl::op_fetch(const Op& op, OpResult& out) {
  out.complete = true;
  if (op.fetch_mode == FetchMode::kKeys) {
    fetch_keys(op, out);
  } else {
    fetch_trace(op, out);
  }
  return err::kOk;
}

void FsService::Impl::fetch_keys(const Op& op, OpResult& out) const {
  BFT_ASSERT(tracer == nullptr);  // FETCH is not in an entry, so never inside a trace
  std::size_t bytes = 0;
  for (const ObjectKey& k : op.keys) {
    Fact f;
    f.key = k;
    const Value v = get(k);
    if (v != nullptr) {
      f.kind = FactKind::kValue;
      f.value = *v;
    } else {
      // Absent: where the next key is tells the same and also answers a scan from `k`.
      f.kind = FactKind::kNext;
      f.next = first_at_or_after(k);
    }
    bytes += encoded_fact_bytes(f);
    if (bytes > kFetchFactBytesMax) {
      out.complete = false;
      return;
    }
    out.facts.push_back(std::move(f));
  }
}

void FsService::Impl::fetch_trace(const Op& op, OpResult& out) {
  BFT_ASSERT(tracer == nullptr);
  Tracer t;
  // The traced request changes the state as it would (a read-only FETCH included) and is undone at once.
  const Scoped<Tracer*> tracing(tracer, &t);
  const Scoped<bool> changing(mutating, true);
  const Scoped<std::uint64_t> time(now, now);
  const std::size_t mark = undo.size();
  run_as_entry(op.trace, StreamId{cur_client, op.stream});
  restore_to(mark);
  out.facts = std::move(t.facts);
  out.complete = t.complete;
}

namespace {

// A directory's listing reported for a name or entry it lacks: at most this many next facts (about 100 bytes
// each with short names), and only while the result stays this far below its cap, so that the listing never
// makes a result incomplete.
constexpr std::size_t kListingFactsMax = 512;
constexpr std::size_t kListingBytesReserve = 128u * 1024;

bool same_range(const ObjectKey& a, const ObjectKey& b) { return a.ino == b.ino && a.kind == b.kind; }

}  // namespace

void FsService::Impl::trace_get(const ObjectKey& k, const Value& v) const {
  if (!tracer->read.insert(k).second) return;
  const auto changed = tracer->initial.find(k);
  const Value& before = changed == tracer->initial.end() ? v : changed->second;
  if (before != nullptr) {
    Fact f;
    f.key = k;
    f.kind = FactKind::kValue;
    f.value = *before;
    tracer->add(std::move(f));
    return;
  }
  if (k.kind != Kind::kName && k.kind != Kind::kEntry) {
    Fact f;
    f.key = k;
    f.kind = FactKind::kAbsent;
    tracer->add(std::move(f));
    return;
  }
  // A name or directory entry the directory lacks: a create, a rename's target, a negative lookup, a cookie
  // being chosen. The model will ask the same of every name the tree creates in this directory next, so the
  // gap holding `k` and the directory's listing (from its first name, or first entry, on) are reported as next
  // facts: after one FETCH the model answers the directory's later creates and lookups itself, where facts
  // about single keys would cost a FETCH, a round trip to the replicas, per name.
  trace_listing(k);
  trace_listing(ObjectKey{k.ino, k.kind, 0, {}});
}

void FsService::Impl::trace_listing(const ObjectKey& from) const {
  std::optional<ObjectKey> cur = from;
  for (std::size_t n = 0; cur.has_value() && same_range(*cur, from) && n < kListingFactsMax; ++n) {
    if (tracer->bytes + kListingBytesReserve > kFetchFactBytesMax) return;
    const std::optional<ObjectKey> next = trace_next(*cur);
    if (!next.has_value()) return;
    cur = key_successor(*next);
  }
}

std::optional<ObjectKey> FsService::Impl::trace_next(const ObjectKey& from) const {
  const std::optional<ObjectKey> next = initial_first_at_or_after(from);
  if (tracer->scanned.insert(from).second) {
    Fact f;
    f.kind = FactKind::kNext;
    f.key = from;
    f.next = next;
    tracer->add(std::move(f));
  }
  return next;
}

void FsService::Impl::trace_scan(const ObjectKey& from, const std::optional<ObjectKey>& found) const {
  // Keys of the state before the request, from `from` on, until one the request did not remove: the model
  // finds `found` among them or among its own changes. Each step passes a key the request changed.
  std::optional<ObjectKey> cur = from;
  while (cur.has_value()) {
    const std::optional<ObjectKey> next = trace_next(*cur);
    // Keys below `found` are absent now: a key of the earlier state there was removed by the request.
    if (!next.has_value() || (found.has_value() && !(*next < *found))) return;
    cur = key_successor(*next);
  }
}

std::optional<ObjectKey> FsService::Impl::initial_first_at_or_after(const ObjectKey& from) const {
  // The current state's keys, skipping those the request created, and the keys it removed.
  std::optional<ObjectKey> now_key = store.first_at_or_after(from);
  for (;;) {
    if (!now_key.has_value()) break;
    const auto changed = tracer->initial.find(*now_key);
    if (changed == tracer->initial.end() || changed->second != nullptr) break;
    const std::optional<ObjectKey> after = key_successor(*now_key);
    now_key = after.has_value() ? store.first_at_or_after(*after) : std::nullopt;
  }
  std::optional<ObjectKey> removed;
  for (auto it = tracer->initial.lower_bound(from); it != tracer->initial.end(); ++it) {
    if (it->second != nullptr) {
      removed = it->first;
      break;
    }
  }
  if (!now_key.has_value()) return removed;
  if (!removed.has_value()) return now_key;
  return std::min(*now_key, *removed);
}

}  // namespace bftfs::fs
