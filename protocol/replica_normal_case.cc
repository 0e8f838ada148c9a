// The normal case at every replica (TOCS §2.3): PRE-PREPARE, PREPARE and COMMIT, the prepared and
// committed-local predicates, commit certificates learned without a pre-prepare (catch-up, a replica changing
// views alone), and two savings on the commit round: the quiet primary and piggybacked commits. See
// replica_impl.h for the map of the replica's files.
#include <algorithm>

#include "common/assert.h"
#include "common/log.h"
#include "protocol/replica_impl.h"

namespace bftfs {

void Replica::Impl::on_pre_prepare(NodeId from, const PrePrepare& pp, const Message& m) {
  if (from != primary_of(pp.view)) {
    stats.rejected_invalid++;
    return;
  }
  if (!accept_view(from, pp.view, m)) return;
  if (!in_window(pp.seq)) {
    stats.rejected_out_of_window++;
    return;
  }
  if (pp.batch.requests.size() > kBatchRequestsMax) {
    stats.rejected_invalid++;
    return;
  }
  Entry* existing = find(pp.seq);
  if (existing != nullptr && existing->view == view && existing->has_digest && existing->pre_prepared) {
    // Already accepted one pre-prepare for (view, seq): a retransmission, or equivocation.
    const Digest d = pp.batch.digest();
    if (d != existing->digest) stats.rejected_conflict++;
    return;
  }
  // The previous batch's timestamp, when known: the primary's clock must move forward (the agreed
  // non-determinism check of TOCS §2.3; null batches carry no time).
  std::uint64_t previous_ts = 0;
  if (const Entry* prev = find(pp.seq - 1); prev != nullptr && prev->batch) {
    previous_ts = prev->batch->timestamp_ns;
  } else if (pp.seq - 1 == last_executed) {
    previous_ts = last_executed_timestamp_ns;
  }
  if (!pp.batch.requests.empty() && previous_ts != 0 && pp.batch.timestamp_ns <= previous_ts) {
    stats.rejected_invalid++;
    return;
  }
  // Every request must be authentic for us (TOCS §3.2: the primary could otherwise order forged requests) and
  // ordered requests are never read-only.
  for (const Request& r : pp.batch.requests) {
    if (r.read_only()) {
      stats.rejected_invalid++;
      return;
    }
    if (!validate_request(r)) return;
  }
  const Digest d = pp.batch.digest();
  Entry& e = get_or_create(pp.seq);
  if (e.view != view) reset_view_state(e, view, e.committed);
  if (e.has_digest && e.digest != d) {
    // A certificate of 2f+1 commits already named another digest in this view, or equivocation.
    stats.rejected_conflict++;
    return;
  }
  e.has_digest = true;
  e.digest = d;
  if (!e.committed) e.ordered_tick = ticks;
  max_ordered_seq = std::max(max_ordered_seq, pp.seq);
  if (e.batch) return;  // committed by certificate with this body already
  attach_body(e, std::make_shared<const Batch>(pp.batch));
}

// The body for e.digest is known: persist the pre-prepare (Q, TOCS §4.5) and, as a backup of e.view, send
// PREPARE (durable before sent: the record is in the same Effects).
void Replica::Impl::attach_body(Entry& e, std::shared_ptr<const Batch> body) {
  BFT_ASSERT(e.has_digest);
  BFT_ASSERT(body != nullptr);
  e.batch = std::move(body);
  if (e.alt_batch && e.alt_batch->digest() == e.digest) e.alt_batch.reset();
  if (e.fetching) {
    e.fetching = false;
    fetching_seqs.erase(e.seq);
  }
  persist(PrePrepareRecord{e.view, e.seq, *e.batch});
  e.pre_prepared = true;
  add_q(e, e.view, e.digest);
  // A committed batch is prepared again in a new view too: replicas that did not commit it need the votes.
  if (!in_view_change && e.view == view && primary_of(e.view) != self && !e.sent_prepare &&
      !(prepare_silenced && e.view == silenced_view)) {
    e.sent_prepare = true;
    record_vote(e, self, e.digest, false);
    broadcast(Prepare{e.view, e.seq, e.digest});
  }
  check_prepared(e);
  check_committed(e);
}

// Records one vote per replica per (view, seq) and kind: a second vote for another digest is equivocation.
bool Replica::Impl::record_vote(Entry& e, NodeId from, const Digest& d, bool commit) {
  std::uint64_t& senders = commit ? e.commit_senders : e.prepare_senders;
  if ((senders & bit_of(from)) != 0) {
    const VoteSet* vs = find_votes(e, d);
    const bool same = vs != nullptr && ((commit ? vs->commits : vs->prepares) & bit_of(from)) != 0;
    if (!same) stats.rejected_conflict++;
    return false;
  }
  if (e.votes.size() >= opt.n && find_votes(e, d) == nullptr) {
    stats.rejected_invalid++;  // cannot happen with one vote per sender; kept as a bound
    return false;
  }
  senders |= bit_of(from);
  VoteSet& vs = votes_for(e, d);
  (commit ? vs.commits : vs.prepares) |= bit_of(from);
  return true;
}

void Replica::Impl::on_prepare(NodeId from, const Prepare& p, const Message& m) {
  if (!accept_view(from, p.view, m)) return;
  if (from == primary_of(p.view)) {
    stats.rejected_invalid++;  // the primary's pre-prepare is its vote; it never prepares (TOCS §2.3)
    return;
  }
  if (!in_window(p.seq)) {
    stats.rejected_out_of_window++;
    return;
  }
  Entry& e = get_or_create(p.seq);
  if (e.view != view) reset_view_state(e, view, e.committed);
  if (!record_vote(e, from, p.digest, false)) return;
  check_prepared(e);
}

void Replica::Impl::on_commit(NodeId from, const Commit& c, const Message& m) {
  if (in_view_change && c.view < view) {
    on_old_commit(from, c);
    return;
  }
  if (!accept_view(from, c.view, m)) return;
  if (!in_window(c.seq)) {
    stats.rejected_out_of_window++;
    return;
  }
  Entry& e = get_or_create(c.seq);
  if (e.view != view) reset_view_state(e, view, e.committed);
  if (!record_vote(e, from, c.digest, true)) return;
  check_committed(e);
}

// A replica that entered a view change alone (it timed out while partitioned, say) cannot return to the view the
// others still run: its VIEW-CHANGE promised to take no further part in it (TOCS §4.5), and the others will not
// follow it until f+1 time out. It can still learn what that view decides without voting: 2f+1 matching COMMITs
// of one view prove the batch committed (at least f+1 correct replicas prepared it, so every later new view
// re-proposes it), so it executes that batch like any committed one. This keeps the replica's state and reply
// cache current while it waits, so it converges and answers clients.
void Replica::Impl::on_old_commit(NodeId from, const Commit& c) {
  if (!in_window(c.seq)) {
    stats.rejected_out_of_window++;
    return;
  }
  Entry& e = get_or_create(c.seq);
  if (e.committed) return;
  if (e.old_commits.empty() && e.view < view) {
    // The COMMITs this entry collected while we were still in its view (our own among them) count too.
    for (const VoteSet& vs : e.votes) {
      if (vs.commits != 0) e.old_commits.push_back(OldCommits{e.view, vs.digest, vs.commits});
    }
    e.old_commit_senders |= e.commit_senders;
  }
  if ((e.old_commit_senders & bit_of(from)) != 0) return;  // one vote per sender: the first
  e.old_commit_senders |= bit_of(from);
  auto it = std::find_if(e.old_commits.begin(), e.old_commits.end(),
                         [&](const OldCommits& oc) { return oc.view == c.view && oc.digest == c.digest; });
  if (it == e.old_commits.end()) it = e.old_commits.insert(e.old_commits.end(), OldCommits{c.view, c.digest, 0});
  it->senders |= bit_of(from);
  if (popcount(it->senders) >= static_cast<int>(quorum)) learn_committed(e, c.view, c.digest);
}

// The batch at e.seq is committed with digest d in view v (proved by a certificate): adopt it, undoing a
// tentative execution of anything else there, and fetch the body if we lack it. The entry takes view v: the
// body's PrePrepareRecord then claims a pre-prepare in the view that really ordered it.
void Replica::Impl::learn_committed(Entry& e, std::uint64_t v, const Digest& d) {
  BFT_ASSERT(!e.committed);
  BFT_ASSERT(v <= view);
  // A certificate at or above the open batch's seq (only possible with more than f faulty replicas, since no
  // correct one votes for a seq the primary has not sent) decides that seq without us: undo our executions.
  if (open_batch && e.seq >= open_batch->seq) discard_open_batch();
  if (e.has_digest && e.digest != d) {
    if (e.seq <= last_executed) {
      // We executed another batch at this seq tentatively; it cannot commit, so undo it.
      rollback_to(e.seq - 1);
    }
    if (e.batch) e.alt_batch = std::move(e.batch);
    e.batch.reset();
    e.pre_prepared = false;
    e.prepared = false;
    e.quiet = false;
  }
  if (e.view != v) {
    BFT_ASSERT(v < view);
    e.view = v;
    e.votes.clear();
    e.prepare_senders = 0;
    e.commit_senders = 0;
    e.sent_prepare = false;
    e.sent_commit = false;
    e.pre_prepared = false;  // a PrePrepareRecord of view v is written if the body is attached below
    e.prepared = false;
    e.quiet = false;
  }
  e.has_digest = true;
  e.digest = d;
  e.committed = true;
  max_ordered_seq = std::max(max_ordered_seq, e.seq);
  if (!e.batch) {
    std::shared_ptr<const Batch> body;
    if (find_body(e.seq, d, body)) {
      attach_body(e, body);
    } else if (!e.fetching) {
      start_fetch(e);
    }
  }
}

// prepared(m, v, n, i): the pre-prepare and 2f prepares from distinct backups that match it (TOCS §2.3). Our own
// prepare counts; the primary never sends one.
void Replica::Impl::check_prepared(Entry& e) {
  if (!e.pre_prepared || e.prepared || e.view != view || in_view_change) return;
  const VoteSet* vs = find_votes(e, e.digest);
  if (vs == nullptr || popcount(vs->prepares) < static_cast<int>(2 * opt.f)) return;
  e.prepared = true;
  e.p = PreparedClaim{e.seq, e.digest, e.view};
  if (may_go_quiet(e)) {
    e.quiet = true;
    e.quiet_tick = ticks;
    stats.quiet_batches++;
    check_committed(e);
    return;
  }
  promise_prepared(e);
  // A batch this primary executed early is now prepared here: its tentative reply is a vote (the record above
  // backs it), sent after the speculative one (NSDI'09 §3.1; TOCS §5.1.2).
  if (e.executed_early && !e.vote_replies_sent && opt.tentative_execution && e.seq <= last_executed) {
    send_vote_replies(e, ReplyKind::kTentative);
  }
  check_committed(e);
}

// committed-local(m, v, n, i): prepared and 2f+1 matching commits (TOCS §2.3). A replica that missed the
// pre-prepare may also learn the decision from 2f+1 matching commits alone: they come from at least f+1 correct
// replicas that prepared it, which is what "committed" means, so the batch is final (used for catch-up).
void Replica::Impl::check_committed(Entry& e) {
  if (e.committed || e.view != view || in_view_change) return;
  if (e.prepared) {
    const VoteSet* vs = find_votes(e, e.digest);
    if (vs != nullptr && popcount(vs->commits) >= static_cast<int>(quorum)) e.committed = true;
    return;
  }
  for (const VoteSet& vs : e.votes) {
    if (popcount(vs.commits) < static_cast<int>(quorum)) continue;
    if (e.has_digest && e.digest != vs.digest && e.pre_prepared) {
      // 2f+1 commits for a digest other than the one we pre-prepared in the same view: only an equivocating
      // primary helped by more than f faulty replicas could do that.
      LOG_WARN(ctx(), "commit certificate for seq %llu names another digest; ignored",
               static_cast<unsigned long long>(e.seq));
      stats.rejected_conflict++;
      return;
    }
    learn_committed(e, view, vs.digest);
    return;
  }
}

// What prepared(e) promises: the PreparedRecord, which backs our COMMIT (and P in a view change), and the COMMIT.
void Replica::Impl::promise_prepared(Entry& e) {
  persist(PreparedRecord{e.view, e.seq, e.digest});
  e.sent_commit = true;
  record_vote(e, self, e.digest, true);
  defer_commit(e);
}

// ---------------------------------------------------------------------------------------------------------------
// Quiet primary (may_go_quiet)
// ---------------------------------------------------------------------------------------------------------------

// Quiet primary. The client needs 2f+1 matching tentative votes (or f+1 committed ones) and a batch commits on 2f+1
// COMMITs, each backed by a synced PreparedRecord (effects.h); n = 3f+1 replicas have 3f >= 2f+1 backups, so while the
// backups answer, the primary's own record, COMMIT and votes are never needed, and its durable write per batch (one of
// the four on the disk the replicas share here, measured at ~90 us of CPU each) is saved. Clients designate a backup as
// the replier of ordered requests (Client::Impl::ordered_replier_offset), so a quiet primary sends nothing; when it is
// asked for the full result (kReplierAll, a retransmission) its reply is flagged speculative (kQuiet): the client keeps
// the bytes for the certificate's digest but counts no vote (Client::on_reply). Safety is untouched: every promise the
// primary does send is still backed by a durable record; withholding one is always allowed. `p` is set in memory, and
// persist_quiet_claims makes it durable when the primary leaves the view, before any VIEW-CHANGE of its own can claim
// it. Liveness: a batch goes quiet only when 2f+1 backups sent their PREPARE for it or for the batch before it (they
// answer); one that has not committed quiet_release_ticks later is released (release_quiet_on_timer), and so is one a
// client asks for again (send_cached_reply). After a release by the timer nothing goes quiet for the next
// kQuietPauseSeqs seqs, so a backup that prepares but withholds its COMMIT costs one timeout, not one per batch. Not at
// a checkpoint seq (execution past it waits for its commit, and the primary's COMMIT there leaves at once, see
// defer_commit).
bool Replica::Impl::may_go_quiet(const Entry& e) const {
  if (!opt.quiet_primary || !is_primary() || e.view != view || e.seq < quiet_resume_seq) return false;
  if (e.seq % opt.checkpoint_interval == 0) return false;
  const int backups_needed = static_cast<int>(2 * opt.f + 1);
  if (popcount(e.prepare_senders) >= backups_needed) return true;
  const Entry* prev = e.seq > h + 1 ? find(e.seq - 1) : nullptr;
  return prev != nullptr && prev->view == view && popcount(prev->prepare_senders) >= backups_needed;
}

// Makes the promises a quiet batch withheld: the PreparedRecord, our COMMIT and (send_votes) our votes for the
// requests we executed in it, which wait for the record like any vote.
void Replica::Impl::release_quiet(Entry& e, bool send_votes) {
  BFT_ASSERT(e.quiet && e.prepared && !e.sent_commit && e.p);
  BFT_ASSERT(e.view == view && !in_view_change);
  e.quiet = false;
  stats.quiet_releases++;
  promise_prepared(e);
  if (send_votes && e.seq <= last_executed) {
    const ReplyKind kind = e.seq <= last_committed ? ReplyKind::kCommitted : ReplyKind::kTentative;
    if (e.executed_early) {
      if (!e.vote_replies_sent) send_vote_replies(e, kind);
    } else {
      send_batch_replies(e, kind);
    }
  }
  check_committed(e);
}

// Leaving the view: every P a later VIEW-CHANGE of ours claims must be durable before it leaves (it does wait
// for the log), so a quiet batch's claim gets its record now; nothing else is owed for a view we leave.
void Replica::Impl::persist_quiet_claims() {
  for (Entry& e : ring) {
    if (e.seq == 0 || !e.quiet) continue;
    BFT_ASSERT(e.p && e.prepared);
    persist(PreparedRecord{e.view, e.seq, e.digest});
    e.quiet = false;
  }
}

void Replica::Impl::release_quiet_on_timer() {
  if (!opt.quiet_primary || !is_primary()) return;
  const std::uint64_t hi = std::min(max_ordered_seq, h + opt.log_window);
  for (std::uint64_t s = last_committed + 1; s <= hi; s++) {
    Entry* e = find(s);
    if (e == nullptr || !e->quiet || e->committed || ticks - e->quiet_tick < opt.quiet_release_ticks) continue;
    quiet_resume_seq = std::max(quiet_resume_seq, max_ordered_seq + kQuietPauseSeqs);
    LOG_INFO(ctx(), "quiet batch s%llu not committed after %llu ticks: released; quiet again from s%llu",
             static_cast<unsigned long long>(s), static_cast<unsigned long long>(ticks - e->quiet_tick),
             static_cast<unsigned long long>(quiet_resume_seq));
    release_quiet(*e, true);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Piggybacked commits (defer_commit)
// ---------------------------------------------------------------------------------------------------------------

// Piggybacked commits. With tentative execution the client accepts 2f+1 PREPARED replies, so the commit round is
// off its critical path, yet it cost each replica a write and its peers a wake-up per batch: 12 of the 28 frames
// of a batch on n = 4, each a separate write because a COMMIT waits for the PreparedRecord's sync while the
// next batch's PREPARE does not. Our COMMIT therefore waits for the next PRE-PREPARE or PREPARE we broadcast
// (broadcast() sends it just before, and the runtime's per-peer order puts both in one write), and the window of
// batches counts a batch as settled once it prepared here (batches_in_flight), so the next PRE-PREPARE, which
// carries the commits, is not itself waiting for them. Safety is untouched: a COMMIT is a vote that may leave any
// time after prepared, and it still waits for its PreparedRecord (effects.h). Liveness: whatever has not left
// goes at the next tick, and at once when something waits for the commit round itself: a read-only request
// (it needs last_committed == last_executed), a batch at a checkpoint boundary (execution past it waits for its
// commit), and a view change.
void Replica::Impl::defer_commit(const Entry& e) {
  const Commit c{e.view, e.seq, e.digest};
  // A waiting read-only request needs no case here: after_step flushes for it before this call's sends go.
  if (!commits_piggybacked() || e.seq % opt.checkpoint_interval == 0) {
    flush_commits();
    broadcast(c);
    return;
  }
  if (deferred_commits.empty()) commits_deferred_tick = ticks;
  deferred_commits.push_back(c);
}

void Replica::Impl::flush_commits() {
  std::vector<Commit> commits;
  commits.swap(deferred_commits);  // broadcast() must not see them again
  for (Commit& c : commits) broadcast(std::move(c));
}

}  // namespace bftfs
