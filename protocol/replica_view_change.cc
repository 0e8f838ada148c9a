// View change (TOCS §4.5): the view-change timer, VIEW-CHANGE, the new primary's NEW-VIEW, and installing a new
// view. The decision rule (which batches the new view re-proposes) is the pure function in new_view_decision.h.
// See replica_impl.h for the map of the replica's files.
#include <algorithm>

#include "common/assert.h"
#include "common/log.h"
#include "protocol/replica_impl.h"

namespace bftfs {

// Doubling backoff per view change without progress, capped, with jitter so that replicas do not time out in
// lock step (TOCS §4.5.2).
std::uint64_t Replica::Impl::view_change_timeout_ticks() {
  std::uint64_t t = opt.view_change_timeout_ticks;
  for (std::uint32_t i = 0; i < vc_backoff && t < opt.view_change_timeout_ticks_max; i++) t *= 2;
  t = std::min<std::uint64_t>(t, opt.view_change_timeout_ticks_max);
  return t + prng.below(t / 8 + 1);
}

// TOCS §4.5.2: a backup waiting for a request to execute runs the timer. We wait for known fresh requests and
// for ordered batches to commit (a tentatively executed batch that never commits blocks checkpoints). While
// changing views, the timer runs once 2f+1 VIEW-CHANGE messages for the new view are in (so a replica alone does
// not race ahead), or once a peer's STATUS shows that view installed or passed: then its NEW-VIEW exists but may
// be lost for good (a restarted primary cannot resend it), and only the next view change can help.
void Replica::Impl::update_timer() {
  if (in_view_change) {
    if (vc_timer_ticks_left != 0) return;
    bool start = view_changes_for(view) >= quorum;
    for (NodeId r = 0; r < opt.n && !start; r++) {
      const auto& st = peer_status[r];
      start = r != self && st && (st->view > view || (st->view == view && !st->in_view_change));
    }
    if (start) vc_timer_ticks_left = view_change_timeout_ticks();
    return;
  }
  const bool waiting = primary_of(view) != self && !fetcher.active() && !service_diverged &&
                       (max_ordered_seq > last_committed || (queued_count > 0 && any_ready_queued()));
  if (!waiting) {
    vc_timer_ticks_left = 0;
  } else if (vc_timer_ticks_left == 0) {
    vc_timer_ticks_left = view_change_timeout_ticks() + work_allowance_ticks();
  }
}

// The timer suspects a primary that does not get our requests committed in time; "in time" depends on how much
// there is to order, log and execute, and on how fast this machine commits at all. Fixed timeouts sized for
// small requests on an idle machine fire on every batch of large writes, and on every batch when the replicas
// share an overloaded machine; each needless view change re-proposes (and re-sends) its batches and stalls
// every client for a view change, which loads the machine further: a storm. So the timer waits for the queued
// and uncommitted bytes at a conservative rate, plus the latency allowance (what batches have been taking). A
// faulty primary gains at most the time the queued bytes would take at that rate plus the latency allowance
// (capped by latency_allowance_ticks_max); the sum is capped like the backoff.
std::uint64_t Replica::Impl::work_allowance_ticks() const {
  std::uint64_t bytes = queued_bytes;
  for (std::uint64_t s = last_committed + 1; s <= max_ordered_seq; s++) {
    const Entry* e = find(s);
    if (e != nullptr && e->batch) bytes += batch_op_bytes(*e->batch);
  }
  return std::min<std::uint64_t>(bytes / opt.timer_bytes_per_tick + latency_allowance_ticks(),
                                 opt.view_change_timeout_ticks_max);
}

// Twice the smoothed pre-prepare-to-commit latency plus four mean deviations (note_commit_latency): while the
// primary keeps committing, a batch may take twice as long as recent ones before its slowness alone starts a
// view change. A primary that stops ordering altogether is still suspected: the timer runs while we wait for a
// request or an uncommitted batch, restarts only at a commit, and this allowance is bounded.
std::uint64_t Replica::Impl::latency_allowance_ticks() const {
  if (commit_srtt8 == 0) return 0;
  const std::uint64_t ticks8 = static_cast<std::uint64_t>(2 * commit_srtt8 + 4 * commit_rttvar8);
  return std::min<std::uint64_t>(ticks8 / 8, opt.latency_allowance_ticks_max);
}

void Replica::Impl::on_view_change_timeout() {
  if (!in_view_change && lagging_behind_view()) {
    // Our requests wait for our own catch-up, not for the primary: f+1 peers (so at least one correct) report
    // committing a checkpoint interval past us in this very view, so its primary orders. Suspecting it now
    // would only strand us alone in the next view (the others have no reason to follow); catch up and wait
    // again. Bounded: once we are within an interval of them the timer fires as usual, so a primary that
    // censors our client is still suspected.
    stats.view_changes_deferred_lagging++;
    vc_timer_ticks_left = view_change_timeout_ticks();
    check_state_transfer(true);
    return;
  }
  LOG_WARN(ctx(), "view change timer expired%s", in_view_change ? " waiting for new-view" : "");
  start_view_change(view + 1);
}

bool Replica::Impl::lagging_behind_view() const {
  std::uint32_t ahead = 0;
  for (NodeId r = 0; r < opt.n; r++) {
    const auto& st = peer_status[r];
    if (r == self || !st || st->view != view || st->in_view_change) continue;
    if (st->last_committed >= last_committed + opt.checkpoint_interval) ahead++;
  }
  return ahead >= weak;
}

std::size_t Replica::Impl::view_changes_for(std::uint64_t v) const {
  std::size_t count = 0;
  for (const auto& vc : view_changes) {
    if (vc && vc->new_view == v) count++;
  }
  return count;
}

void Replica::Impl::start_view_change(std::uint64_t new_view) {
  BFT_ASSERT(new_view > view);
  LOG_INFO(ctx(), "view change to v%llu", static_cast<unsigned long long>(new_view));
  flush_commits();       // votes of the view we leave, sent before our VIEW-CHANGE
  persist_quiet_claims();
  discard_open_batch();  // never sent: nothing of it may survive into the next view
  reset_batch_hold();
  view = new_view;
  in_view_change = true;
  vc_backoff++;
  vc_timer_ticks_left = 0;
  stats.view_changes_started++;
  persist(ViewRecord{view, true});  // backs the VIEW-CHANGE below
  pending_new_view.reset();
  last_new_view.reset();
  deferred.clear();
  forwarded.clear();
  pending.clear();
  tickets.clear();
  ViewChange vc = build_view_change();
  vc.signature = crypto.sign(view_change_signing_bytes(vc));
  view_changes[self] = vc;
  broadcast(std::move(vc));
  try_new_view();
}

// VIEW-CHANGE(v+1, h, C, P, Q, i) (TOCS §4.5.1) from the replica's own state.
ViewChange Replica::Impl::build_view_change() const {
  ViewChange vc;
  vc.new_view = view;
  vc.replica = self;
  vc.stable_seq = h;
  BFT_ASSERT(own_checkpoints.count(h) == 1);
  for (const auto& [s, c] : own_checkpoints) {
    if (s >= h && s <= h + opt.log_window) vc.checkpoints.push_back(CheckpointClaim{s, c.digest});
  }
  for (std::uint64_t s = h + 1; s <= h + opt.log_window; s++) {
    const Entry* e = find(s);
    if (e == nullptr) continue;
    if (e->p) {
      BFT_ASSERT(e->p->view < view);
      vc.prepared.push_back(*e->p);
    }
    std::array<PreparedClaim, 2> q = e->q;
    if (e->q_count == 2 && q[1].view < q[0].view) std::swap(q[0], q[1]);
    for (std::uint8_t i = 0; i < e->q_count; i++) {
      BFT_ASSERT(q[i].view < view);
      vc.pre_prepared.push_back(q[i]);
    }
  }
  BFT_ASSERT(vc.checkpoints.size() <= kViewChangeEntriesMax);
  BFT_ASSERT(vc.prepared.size() <= kViewChangeEntriesMax);
  BFT_ASSERT(vc.pre_prepared.size() <= kViewChangeEntriesMax);
  return vc;
}

void Replica::Impl::on_view_change(NodeId from, const ViewChange& vc) {
  if (vc.replica != from) {
    stats.rejected_invalid++;
    return;
  }
  if (vc.new_view < view || (vc.new_view == view && !in_view_change)) {
    // The sender is behind: the NEW-VIEW of our view brings it here.
    if (last_new_view && !in_view_change && may_help(from)) send(from, *last_new_view);
    stats.rejected_wrong_view++;
    return;
  }
  const std::optional<ViewChange>& known = view_changes[from];
  if (known && known->new_view >= vc.new_view) return;  // a retransmission (or an older one)
  if (!view_change_well_formed(vc, opt.n, opt.checkpoint_interval, opt.log_window)) {
    stats.rejected_invalid++;
    return;
  }
  if (!crypto.verify_signature(from, view_change_signing_bytes(vc), vc.signature)) {
    stats.rejected_bad_signature++;
    return;
  }
  view_changes[from] = vc;
  // TOCS §4.5.2: f+1 replicas want a view above ours, so at least one correct replica timed out: join the
  // smallest such view rather than wait for our own timer.
  std::uint32_t above = 0;
  std::uint64_t smallest = UINT64_MAX;
  for (NodeId r = 0; r < opt.n; r++) {
    if (r == self || !view_changes[r] || view_changes[r]->new_view <= view) continue;
    above++;
    smallest = std::min(smallest, view_changes[r]->new_view);
  }
  if (above >= weak) {
    start_view_change(smallest);
    return;
  }
  if (in_view_change && vc.new_view == view) try_new_view();
}

// The new primary: once the VIEW-CHANGE messages for its view allow a decision, it fetches the chosen bodies
// it lacks and then sends NEW-VIEW (so that it can persist a PrePrepareRecord for every chosen seq first: a
// restarted primary must never reuse one of them).
void Replica::Impl::try_new_view() {
  if (!in_view_change || primary_of(view) != self || pending_new_view) return;
  std::vector<const ViewChange*> set;
  for (const auto& vc : view_changes) {
    if (vc && vc->new_view == view) set.push_back(&*vc);
  }
  if (set.size() < quorum) return;
  std::optional<NewViewDecision> decision = decide_new_view(set, opt.f, opt.log_window);
  if (!decision) return;  // wait for more VIEW-CHANGE messages
  PendingNewView p;
  p.nv.view = view;
  for (const ViewChange* vc : set) p.nv.view_changes.push_back(*vc);
  p.decision = std::move(*decision);
  pending_new_view = std::move(p);
  for (const NewViewChoice& c : pending_new_view->decision.choices) {
    if (c.seq <= h) continue;  // below our stable checkpoint: we do not order it again
    std::shared_ptr<const Batch> body;
    if (find_body(c.seq, c.digest, body)) {
      pending_new_view->bodies[c.seq] = body;
    } else {
      pending_new_view->missing[c.seq] = c.digest;
      broadcast(FetchBatch{c.seq, c.digest});
    }
  }
  pending_new_view->fetch_ticks_left = opt.fetch_retry_ticks;
  if (pending_new_view->missing.empty()) {
    finish_new_view();
  } else {
    LOG_INFO(ctx(), "new view waits for %zu batch bodies", pending_new_view->missing.size());
  }
}

void Replica::Impl::finish_new_view() {
  BFT_ASSERT(pending_new_view);
  BFT_ASSERT(pending_new_view->missing.empty());
  PendingNewView p = std::move(*pending_new_view);
  pending_new_view.reset();
  p.nv.signature = crypto.sign(new_view_signing_bytes(p.nv));
  install_new_view(p.nv, p.decision, p.bodies);
  broadcast(std::move(p.nv));
}

// A NEW-VIEW is signed by the new primary and carries its proof, so a copy relayed by any replica is as good as
// the original (a restarted primary holds no NEW-VIEW to resend: it is not among the records).
void Replica::Impl::on_new_view(NodeId from, const NewView& nv) {
  (void)from;
  if (nv.view == 0) {
    stats.rejected_invalid++;
    return;
  }
  if (nv.view < view || (nv.view == view && !in_view_change)) {
    if (nv.view < view) stats.rejected_wrong_view++;
    return;  // old, or a retransmission of the view we are in
  }
  if (!crypto.verify_signature(primary_of(nv.view), new_view_signing_bytes(nv), nv.signature)) {
    stats.rejected_bad_signature++;
    return;
  }
  // S must hold 2f+1 distinct, well-formed, signed VIEW-CHANGE messages for the view (this is the proof that
  // replaces TOCS's acknowledgement scheme), and the decision must follow from it.
  if (nv.view_changes.size() < quorum || nv.view_changes.size() > opt.n) {
    stats.rejected_invalid++;
    return;
  }
  std::uint64_t seen = 0;
  std::vector<const ViewChange*> set;
  for (const ViewChange& vc : nv.view_changes) {
    if (vc.new_view != nv.view || vc.replica >= opt.n || (seen & bit_of(vc.replica)) != 0 ||
        !view_change_well_formed(vc, opt.n, opt.checkpoint_interval, opt.log_window)) {
      stats.rejected_invalid++;
      return;
    }
    seen |= bit_of(vc.replica);
    if (!crypto.verify_signature(vc.replica, view_change_signing_bytes(vc), vc.signature)) {
      stats.rejected_bad_signature++;
      return;
    }
    set.push_back(&vc);
  }
  std::optional<NewViewDecision> decision = decide_new_view(set, opt.f, opt.log_window);
  if (!decision) {
    stats.rejected_invalid++;
    return;
  }
  install_new_view(nv, *decision, {});
}

// Installs the view of `nv` (TOCS §4.5): on the new primary from its own decision (finish_new_view), on a backup
// from a verified NEW-VIEW (on_new_view). `bodies` are chosen bodies the new primary fetched for it.
void Replica::Impl::install_new_view(const NewView& nv, const NewViewDecision& decision,
                                     const std::map<std::uint64_t, std::shared_ptr<const Batch>>& bodies) {
  BFT_ASSERT(nv.view > view || (nv.view == view && in_view_change));
  enter_view(nv);
  undo_unchosen_executions(decision);
  start_from_checkpoint(decision);
  install_choices(decision, bodies);
  if (primary_of(view) == self) continue_as_primary(decision);
  forwarded.clear();
  vc_timer_ticks_left = 0;
  stats.new_views_installed++;
  LOG_INFO(ctx(), "new view installed primary=%u checkpoint=s%llu reproposed=%zu", primary_of(view),
           static_cast<unsigned long long>(decision.checkpoint_seq), decision.choices.size());
  replay_future();
}

// Leaves the view we run (or are changing from) for the view of `nv`, which is now installed.
void Replica::Impl::enter_view(const NewView& nv) {
  const std::uint64_t v = nv.view;
  // A replica may install a later view straight from normal operation (it never timed out itself); as the old
  // primary its open batch was never sent and goes now, before the rollback decision (undo_unchosen_executions).
  discard_open_batch();
  flush_commits();  // deferred in normal operation of the view we leave (none when we changed views ourselves)
  persist_quiet_claims();
  reset_batch_hold();
  view = v;
  in_view_change = false;
  persist(ViewRecord{v, false});
  last_new_view = nv;
  pending_new_view.reset();
  deferred.clear();
  for (auto& vc : view_changes) {
    if (vc && vc->new_view <= v) vc.reset();
  }
}

// Tentatively executed batches that the new view does not re-propose identically are undone (TOCS §5.1.2).
void Replica::Impl::undo_unchosen_executions(const NewViewDecision& decision) {
  const std::uint64_t hs = decision.checkpoint_seq;
  // Committed batches are final: the decision must re-propose exactly them (TOCS §4.5 safety argument).
  for (std::uint64_t s = std::max(h, hs) + 1; s <= last_committed && s <= hs + opt.log_window; s++) {
    const Entry* e = find(s);
    BFT_ASSERT(e != nullptr && e->committed);
    const NewViewChoice* c = decision.choice(s);
    BFT_ASSERT(c != nullptr);
    BFT_ASSERT(c->digest == e->digest);
  }
  std::uint64_t first_bad = 0;
  for (std::uint64_t s = last_committed + 1; s <= last_executed; s++) {
    const Entry* e = find(s);
    BFT_ASSERT(e != nullptr);
    const NewViewChoice* c = decision.choice(s);
    if (s <= hs || c == nullptr || c->digest != e->digest) {
      first_bad = s;
      break;
    }
  }
  if (first_bad != 0) rollback_to(first_bad - 1);
}

// The new view starts from checkpoint (h*, d*): ours if we have it, otherwise fetched.
void Replica::Impl::start_from_checkpoint(const NewViewDecision& decision) {
  const std::uint64_t hs = decision.checkpoint_seq;
  if (hs <= h) return;
  auto own = own_checkpoints.find(hs);
  if (own != own_checkpoints.end() && own->second.digest == decision.checkpoint_digest && last_committed >= hs) {
    make_stable(hs, decision.checkpoint_digest);
  } else if (recovered_pending && recovered_pending->seq == hs && recovered_pending->digest == decision.checkpoint_digest) {
    adopt_recovered_checkpoint();
  } else if (hs > last_committed) {
    start_state_fetch(hs, decision.checkpoint_digest);
  } else {
    LOG_ERROR(ctx(), "new-view checkpoint s%llu differs from ours", static_cast<unsigned long long>(hs));
  }
}

// Fresh ordering state for the new view; only committed batches keep their digest outside the choices. Each
// chosen seq takes its digest, and its body when known (else it is fetched); choices above our window wait in
// `deferred` until the window moves (apply_deferred).
void Replica::Impl::install_choices(const NewViewDecision& decision,
                                    const std::map<std::uint64_t, std::shared_ptr<const Batch>>& bodies) {
  const std::uint64_t v = view;
  for (Entry& e : ring) {
    if (e.seq == 0) continue;
    if (decision.choice(e.seq) == nullptr) reset_view_state(e, v, e.committed);
  }
  max_ordered_seq = 0;
  for (const NewViewChoice& c : decision.choices) {
    const std::uint64_t s = c.seq;
    if (s <= h) continue;
    std::shared_ptr<const Batch> body;
    auto b = bodies.find(s);
    if (b != bodies.end()) body = b->second;
    if (s > h + opt.log_window) {
      deferred[s] = DeferredChoice{c.digest, body};
      continue;
    }
    Entry& e = get_or_create(s);
    if (e.committed) {
      BFT_ASSERT(e.digest == c.digest);
      reset_view_state(e, v, true);
    } else {
      if (!body) find_body(s, c.digest, body);
      reset_view_state(e, v, false);
      e.has_digest = true;
      e.digest = c.digest;
    }
    max_ordered_seq = std::max(max_ordered_seq, s);
    if (!body && e.batch) body = e.batch;
    if (body) {
      // The NEW-VIEW is the pre-prepare of every chosen seq in view v (TOCS §4.5.1); backups prepare it.
      e.batch.reset();
      attach_body(e, body);
    } else {
      start_fetch(e);
    }
  }
}

// The new primary continues after the last re-proposed seq, with the re-proposed batches counted as ordered by it.
void Replica::Impl::continue_as_primary(const NewViewDecision& decision) {
  next_seq = std::max({h, decision.checkpoint_seq, decision.max_seq(), last_committed}) + 1;
  next_seq_floor = next_seq;
  for (const NewViewChoice& c : decision.choices) {
    const Entry* e = c.seq > last_executed ? find(c.seq) : nullptr;
    if (e != nullptr && e->batch) last_timestamp_ns = std::max(last_timestamp_ns, e->batch->timestamp_ns);
  }
  rebuild_pending();  // the re-proposed batches (and any committed one) are ordered by us now
  tickets.clear();
  for (const auto& [c, reqs] : queue) {
    for (std::size_t i = 0; i < reqs.size(); i++) tickets.push_back(c);
  }
}

}  // namespace bftfs
