// The replica's invariants (house style: checked after every step): the O(1) ones after every call, the full
// scan of the log every kFullCheckEvery calls (end_call) and after every step in tests and the simulator. See
// replica_impl.h for the map of the replica's files.
#include <algorithm>

#include "common/assert.h"
#include "protocol/replica_impl.h"

namespace bftfs {

void Replica::Impl::check_invariants_fast() const {
  const std::uint64_t L = opt.log_window;
  const std::uint64_t K = opt.checkpoint_interval;
  // Batch hold: only a primary in normal operation waits, only for clients it answered, and only with requests.
  BFT_ASSERT(returning.empty() || (opt.batch_hold && !opt.early_replies && is_primary()));
  BFT_ASSERT(!batch_held || (!returning.empty() && !hold_ended && queued_count > 0));
  BFT_ASSERT(h % K == 0);
  BFT_ASSERT(h <= last_committed);
  // The commit latency estimate (note_commit_latency): none yet, or a positive latency and a deviation.
  BFT_ASSERT(commit_srtt8 >= 0);
  BFT_ASSERT(commit_rttvar8 >= 0);
  BFT_ASSERT(commit_srtt8 > 0 || commit_rttvar8 == 0);
  BFT_ASSERT(last_committed <= last_executed);
  if (recovered_pending) {
    BFT_ASSERT(service_diverged);  // nothing executes until the recovered checkpoint is adopted
    BFT_ASSERT(recovered_pending->seq > last_committed);
  }
  BFT_ASSERT(last_executed <= h + L);
  if (last_executed > last_committed) {
    // Tentative execution never passes an uncommitted checkpoint boundary.
    BFT_ASSERT(opt.tentative_execution || opt.early_replies);
    BFT_ASSERT(last_executed <= (last_committed / K + 1) * K);
  }
  if (open_batch) {
    BFT_ASSERT(opt.early_replies);
    BFT_ASSERT(is_primary());
    BFT_ASSERT(open_batch->seq == last_executed + 1);
    BFT_ASSERT(open_batch->seq + 1 == next_seq);
    BFT_ASSERT(open_batch->seq <= (last_committed / K + 1) * K);
    BFT_ASSERT(!open_batch->batch.requests.empty());
    BFT_ASSERT(!clients.has_tentative_above(open_batch->seq));
  } else {
    BFT_ASSERT(!clients.has_tentative_above(last_executed));
  }
  BFT_ASSERT(own_checkpoints.count(h) == 1);
  BFT_ASSERT(own_checkpoints.begin()->first == h);
  if (!in_view_change && primary_of(view) == self) {
    BFT_ASSERT(next_seq >= last_committed + 1);
    BFT_ASSERT(next_seq <= std::max(h + L + 1, next_seq_floor));
  }
  BFT_ASSERT(!in_view_change || view > 0);
  BFT_ASSERT(!pending_new_view || (in_view_change && primary_of(view) == self));
  BFT_ASSERT(fetching_seqs.empty() || *fetching_seqs.begin() > h);
  if (!deferred_commits.empty()) {
    BFT_ASSERT(commits_piggybacked());
    BFT_ASSERT(!in_view_change);
    BFT_ASSERT(deferred_commits.back().view == view);
  }
}

void Replica::Impl::check_invariants() const {
  const std::uint64_t L = opt.log_window;
  check_invariants_fast();
  // The committed prefix above h is in the log with bodies; so is everything executed.
  for (std::uint64_t s = h + 1; s <= last_executed; s++) {
    const Entry* e = find(s);
    BFT_ASSERT(e != nullptr);
    BFT_ASSERT(e->has_digest);
    BFT_ASSERT(e->batch != nullptr);
    BFT_ASSERT(s > last_committed || e->committed);
  }
  for (std::size_t i = 0; i < ring.size(); i++) {
    const Entry& e = ring[i];
    if (e.seq == 0) continue;
    BFT_ASSERT(e.seq % L == i);
    BFT_ASSERT(e.seq > h && e.seq <= h + L);
    BFT_ASSERT(e.view <= view);
    BFT_ASSERT(!e.pre_prepared || (e.has_digest && e.batch != nullptr));
    BFT_ASSERT(!e.prepared || e.pre_prepared);
    BFT_ASSERT(!e.committed || e.has_digest);
    BFT_ASSERT(!e.batch || e.has_digest);
    BFT_ASSERT(!e.fetching || (e.has_digest && !e.batch));
    BFT_ASSERT(e.q_count <= 2);
    BFT_ASSERT(e.votes.size() <= opt.n);
    BFT_ASSERT(!e.p || e.p->seq == e.seq);
    BFT_ASSERT(!e.executed_early || (e.seq <= last_executed && e.seq > last_committed) || e.committed);
    BFT_ASSERT(!e.vote_replies_sent || e.executed_early);
    BFT_ASSERT(!e.quiet || (opt.quiet_primary && e.prepared && e.p && !e.sent_commit && e.view == view &&
                            primary_of(view) == self && !in_view_change));
    if (open_batch) BFT_ASSERT(e.seq != open_batch->seq || !e.has_digest);
    for (std::size_t a = 0; a < e.votes.size(); a++) {
      BFT_ASSERT((e.votes[a].prepares & ~e.prepare_senders) == 0);
      BFT_ASSERT((e.votes[a].commits & ~e.commit_senders) == 0);
      for (std::size_t b = a + 1; b < e.votes.size(); b++) {
        BFT_ASSERT(e.votes[a].digest != e.votes[b].digest);
        BFT_ASSERT((e.votes[a].prepares & e.votes[b].prepares) == 0);  // one vote per replica
        BFT_ASSERT((e.votes[a].commits & e.votes[b].commits) == 0);
      }
    }
  }
  std::size_t fetching = 0;
  for (const Entry& e : ring) fetching += e.seq != 0 && e.fetching ? 1 : 0;
  BFT_ASSERT(fetching == fetching_seqs.size());
  // Checkpoints are taken at committed seqs only.
  BFT_ASSERT(own_checkpoints.rbegin()->first <= last_committed);
  for (const auto& [s, c] : own_checkpoints) BFT_ASSERT(s % opt.checkpoint_interval == 0);
  std::size_t count = 0;
  std::uint64_t bytes = 0;
  for (const auto& [c, reqs] : queue) {
    BFT_ASSERT(!reqs.empty());
    BFT_ASSERT(reqs.size() <= opt.client_window);
    count += reqs.size();
    for (const auto& [id, qr] : reqs) bytes += qr.request.op.size();
  }
  BFT_ASSERT(count == queued_count);
  BFT_ASSERT(bytes == queued_bytes);
  BFT_ASSERT(queued_bytes <= kQueuedBytesMax);
  for (const auto& [s, d] : deferred) BFT_ASSERT(s > h + L);
}

}  // namespace bftfs
