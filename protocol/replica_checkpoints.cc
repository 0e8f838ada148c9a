// Checkpoints and garbage collection (TOCS §2.5): taking a checkpoint at every K committed seqs, CHECKPOINT
// claims, stability on 2f+1 matching claims, and moving the low watermark (which also applies NEW-VIEW choices
// that were above the window). See replica_impl.h for the map of the replica's files.
#include <algorithm>

#include "common/assert.h"
#include "common/log.h"
#include "protocol/replica_impl.h"

namespace bftfs {

void Replica::Impl::take_checkpoint(std::uint64_t s) {
  BFT_ASSERT(s % opt.checkpoint_interval == 0);
  if (service_diverged) return;  // damaged while executing up to s: the state at s is not ours to claim
  BFT_ASSERT(s == last_committed);
  BFT_ASSERT(s == last_executed);
  // The client table is made durable with the service's checkpoint, in the same atomic write
  // (protocol/service.h): a crash can never keep one without the other, which the CheckpointRecord below,
  // synced only after this returns, could not ensure.
  Bytes table = clients.encode();
  const CheckpointId id = service.checkpoint(s, table);  // durable on return
  if (check_service_damage()) return;  // nothing was taken: no record, no claim, no CHECKPOINT
  BFT_ASSERT(id.seq == s);
  const Digest d = checkpoint_digest(s, id.digest, digest_of(table));
  persist(CheckpointRecord{s, d, table});  // backs the CHECKPOINT message below
  own_checkpoints[s] = OwnCheckpoint{d, std::move(table), true};
  add_claim(self, s, d);
  broadcast(Checkpoint{s, d});
  check_stable(s);
}

void Replica::Impl::add_claim(NodeId r, std::uint64_t s, const Digest& d) {
  auto& mine = claims[r];
  auto [it, inserted] = mine.emplace(s, d);
  if (!inserted) {
    if (it->second != d && r != self) stats.rejected_conflict++;  // a replica claims two digests for one seq
    return;
  }
  // Keep a bounded number of claims per replica: the highest ones matter (stability in the window, and
  // checkpoints far ahead that tell us we are behind).
  const std::size_t bound = static_cast<std::size_t>(opt.log_window / opt.checkpoint_interval) + 2;
  while (mine.size() > bound) mine.erase(mine.begin());
}

void Replica::Impl::on_checkpoint(NodeId from, const Checkpoint& c) {
  if (c.seq == 0 || c.seq % opt.checkpoint_interval != 0) {
    stats.rejected_invalid++;
    return;
  }
  if (c.seq <= h) return;  // already stable here: nothing to learn
  add_claim(from, c.seq, c.state_digest);
  check_stable(c.seq);
  check_state_transfer(false);
}

// A checkpoint is stable with 2f+1 matching CHECKPOINT messages including our own (TOCS §2.5).
void Replica::Impl::check_stable(std::uint64_t s) {
  if (s <= h) return;
  if (recovered_pending && recovered_pending->seq == s) {
    std::uint32_t matching = 0;
    for (NodeId r = 0; r < opt.n; r++) {
      auto it = claims[r].find(s);
      matching += it != claims[r].end() && it->second == recovered_pending->digest ? 1 : 0;
    }
    if (matching >= quorum) adopt_recovered_checkpoint();
    return;
  }
  auto own = own_checkpoints.find(s);
  if (own == own_checkpoints.end()) return;
  std::uint32_t matching = 0;
  for (NodeId r = 0; r < opt.n; r++) {
    auto it = claims[r].find(s);
    if (it != claims[r].end() && it->second == own->second.digest) matching++;
  }
  if (matching >= quorum) {
    make_stable(s, own->second.digest);
    return;
  }
  // 2f+1 others agree on another digest: our state diverged from the correct replicas (our own bug or
  // non-determinism in the service). Say so loudly; state transfer cannot fix a seq we already executed.
  std::map<Digest, std::uint32_t> others;
  for (NodeId r = 0; r < opt.n; r++) {
    auto it = claims[r].find(s);
    if (r != self && it != claims[r].end() && ++others[it->second] >= quorum) {
      LOG_ERROR(ctx(), "checkpoint s%llu digest %s differs from 2f+1 replicas (%s)", static_cast<unsigned long long>(s),
                own->second.digest.short_hex().c_str(), it->second.short_hex().c_str());
    }
  }
}

void Replica::Impl::make_stable(std::uint64_t s, const Digest& d) {
  BFT_ASSERT(s > h);
  BFT_ASSERT(s <= last_committed);
  persist(StableRecord{s, d});
  h = s;
  stable_digest = d;
  advance_window();
}

// The low watermark moved to h: discard the log, checkpoints and claims below it (TOCS §2.5).
void Replica::Impl::advance_window() {
  for (Entry& e : ring) {
    if (e.seq != 0 && e.seq <= h) {
      if (e.fetching) fetching_seqs.erase(e.seq);
      e = Entry{};
    }
  }
  service.discard_checkpoints_below(h);
  own_checkpoints.erase(own_checkpoints.begin(), own_checkpoints.lower_bound(h));
  for (auto& c : claims) c.erase(c.begin(), c.upper_bound(h));
  for (auto it = fetching_seqs.begin(); it != fetching_seqs.end() && *it <= h;) it = fetching_seqs.erase(it);
  if (next_seq <= h) next_seq = h + 1;
  apply_deferred();
}

void Replica::Impl::apply_deferred() {
  while (!deferred.empty()) {
    auto it = deferred.begin();
    const std::uint64_t s = it->first;
    if (s <= h) {
      deferred.erase(it);
      continue;
    }
    if (!in_window(s)) return;
    DeferredChoice dc = std::move(it->second);
    deferred.erase(it);
    Entry& e = get_or_create(s);
    if (e.committed) continue;
    reset_view_state(e, view, false);
    e.has_digest = true;
    e.digest = dc.digest;
    max_ordered_seq = std::max(max_ordered_seq, s);
    std::shared_ptr<const Batch> body = dc.body;
    if (body || find_body(s, dc.digest, body)) {
      attach_body(e, body);
    } else {
      start_fetch(e);
    }
  }
}

}  // namespace bftfs
