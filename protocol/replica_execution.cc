// Execution (TOCS §2.3 "executes in seq order", §5.1.2 tentative execution): committed and tentative
// execution of ordered batches, the per-client order rule at execution, replies (committed, tentative, the
// PBFT-CS speculative ones, a quiet primary's), and rollback of tentative executions. See replica_impl.h for
// the map of the replica's files.
#include "common/assert.h"
#include "common/log.h"
#include "protocol/replica_impl.h"

namespace bftfs {

void Replica::Impl::run_execution() {
  if (service_diverged || fetcher.active()) return;  // the state is about to be replaced wholesale
  for (;;) {
    if (service_diverged) return;  // damaged by the batch just executed (check_service_damage)
    if (last_committed < last_executed) {
      const Entry* e = find(last_committed + 1);
      BFT_ASSERT(e != nullptr);
      if (e->committed) {
        commit_next();
        continue;
      }
    }
    if (open_batch) return;  // the open batch is next in execution order; it executed as it filled
    const std::uint64_t s = last_executed + 1;
    Entry* e = find(s);
    if (e == nullptr || !e->batch || !e->has_digest) return;
    if (e->committed && last_committed == last_executed) {
      // Final execution: the CommittedRecord goes out before the replies (effects rule).
      persist(CommittedRecord{s, e->digest});
      execute_batch(*e, ReplyKind::kCommitted);
      last_committed = s;
      service.commit_through(s);
      clients.commit_through(s);
      stats.batches_committed++;
      history.push_back(ExecutedBatch{s, e->digest});
      note_commit_latency(*e);
      on_commit_progress();
      if (s % opt.checkpoint_interval == 0) take_checkpoint(s);
      continue;
    }
    // Tentative execution (TOCS §5.1.2): once prepared (or committed) with every earlier batch executed, but
    // never past a checkpoint seq that has not committed, so that the state at a checkpoint is always final.
    const std::uint64_t boundary = ((s - 1) / opt.checkpoint_interval) * opt.checkpoint_interval;
    if (boundary > last_committed || replaying) return;
    if (opt.tentative_execution && (e->prepared || e->committed)) {
      execute_batch(*e, e->quiet && !e->committed ? ReplyKind::kQuiet : ReplyKind::kTentative);
      continue;
    }
    // PBFT-CS: a primary executes what it pre-prepared at once (batches its NEW-VIEW re-proposed; its own
    // batches executed while they were open).
    if (opt.early_replies && is_primary() && e->view == view && e->pre_prepared) {
      execute_batch(*e, ReplyKind::kSpeculative);
      continue;
    }
    return;
  }
}

// The batch at last_committed + 1 was executed tentatively and is now committed.
void Replica::Impl::commit_next() {
  const std::uint64_t s = last_committed + 1;
  Entry* e = find(s);
  BFT_ASSERT(e != nullptr && e->committed && s <= last_executed);
  persist(CommittedRecord{s, e->digest});
  // An early execution that never sent its tentative vote (tentative execution off, or committed by
  // certificate before it prepared here) owes the client its committed reply (NSDI'09 §3.1: the primary's
  // early reply is only a prediction).
  // A quiet batch owes nothing: it committed on the backups' votes, which the clients have.
  if (e->executed_early && !e->vote_replies_sent && !e->quiet) send_vote_replies(*e, ReplyKind::kCommitted);
  last_committed = s;
  service.commit_through(s);
  clients.commit_through(s);
  stats.batches_committed++;
  history.push_back(ExecutedBatch{s, e->digest});
  note_commit_latency(*e);
  on_commit_progress();
  if (s % opt.checkpoint_interval == 0) {
    BFT_ASSERT(last_executed == s);  // execution waited at the boundary
    take_checkpoint(s);
  }
}

void Replica::Impl::execute_batch(Entry& e, ReplyKind kind) {
  BFT_ASSERT(e.seq == last_executed + 1);
  BFT_ASSERT(e.batch != nullptr);
  BFT_ASSERT(!open_batch);
  const Batch& b = *e.batch;
  // The view that ordered the batch: what every correct replica executing it reports, also one that learned the
  // batch from a certificate while changing views alone (clients match replies by view).
  for (const Request& r : b.requests) execute_request(r, e.seq, e.view, b.timestamp_ns, kind);
  e.executed_early = kind == ReplyKind::kSpeculative;
  e.vote_replies_sent = false;
  if (b.timestamp_ns != 0) last_executed_timestamp_ns = b.timestamp_ns;
  last_executed = e.seq;
}

// Executes one ordered request at `seq` unless it is a duplicate, stale or invalid (then it only stops waiting);
// returns whether it executed. Bodies are validated by correct backups before they prepare them; the checks here
// are deterministic, so every correct replica skips the same requests even if more than f were faulty.
bool Replica::Impl::execute_request(const Request& r, std::uint64_t seq, std::uint64_t reply_view,
                                    std::uint64_t timestamp_ns, ReplyKind kind) {
  if (r.client < opt.n || r.request_id == 0 || r.read_only()) return false;
  if (clients.classify(r.client, r.request_id) != ClientTable::Freshness::kFresh) {
    forget_request(r.client, r.request_id);
    return false;  // a duplicate or stale id is never executed twice (TOCS §2.1)
  }
  if (service_diverged) return false;  // damaged earlier in this batch: nothing it computes is answered
  if (!clients.predecessor_done(r.client, r.prev_request_id)) {
    defer_out_of_order(r);
    return false;
  }
  const ExecContext exec{seq, r.client, r.request_id, timestamp_ns};
  Bytes result = service.execute(exec, r.op);
  BFT_ASSERT(result.size() <= kResultBytesMax);
  if (check_service_damage()) return false;  // the result may come from corrupt storage: never sent
  if (!replaying) send_reply(r, reply_view, kind, result);
  clients.record(r.client, r.request_id, seq, std::move(result), kind != ReplyKind::kCommitted);
  forget_request(r.client, r.request_id);
  note_returning(r.client);
  stats.requests_executed++;
  return true;
}

// The per-client order rule at execution: a batch ordered `r` before its predecessor executed (a faulty
// primary, or a view change that kept a later batch and dropped the earlier one). `r` is skipped without a
// record, deterministically (the rule reads only the client table), so every correct replica skips it alike and
// the client table stays equal everywhere; it stays fresh, waits in our queue for its turn and is ordered again.
void Replica::Impl::defer_out_of_order(const Request& r) {
  stats.requests_deferred_order++;
  pending.erase({r.client, r.request_id});
  if (!replaying) enqueue(r, r.digest());
}

void Replica::Impl::send_reply(const Request& r, std::uint64_t reply_view, ReplyKind kind, const Bytes& result) {
  Reply rep;
  rep.view = reply_view;
  rep.client = r.client;
  rep.request_id = r.request_id;
  rep.flags = reply_flags(kind);
  rep.result_digest = digest_of(result);
  // Reply digests (TOCS §5.1.1): only the designated replier sends the full result. An early reply always
  // carries it: a prediction is of no use without the value (NSDI'09 §3.1).
  if (r.replier == self || r.replier == kReplierAll || kind == ReplyKind::kSpeculative) {
    rep.flags |= kReplyHasResult;
    rep.result = result;
  } else if (kind == ReplyKind::kQuiet) {
    return;  // neither a vote nor the result: it would tell the client nothing
  }
  if (kind == ReplyKind::kSpeculative) stats.early_replies++;
  send(r.client, std::move(rep));
}

// The ordinary replies for a batch this primary executed early: one per request that the batch executed (a
// request skipped as a duplicate was answered, or will be, from the execution that counted).
void Replica::Impl::send_vote_replies(Entry& e, ReplyKind kind) {
  BFT_ASSERT(e.executed_early);
  BFT_ASSERT(!e.vote_replies_sent);
  BFT_ASSERT(e.batch != nullptr);
  BFT_ASSERT(e.seq <= last_executed);
  BFT_ASSERT(kind != ReplyKind::kSpeculative);
  e.vote_replies_sent = true;
  send_batch_replies(e, kind);
}

// Our reply for every request that executed in batch `e` (a request skipped as a duplicate was answered, or will
// be, from the execution that counted).
void Replica::Impl::send_batch_replies(const Entry& e, ReplyKind kind) {
  BFT_ASSERT(e.batch != nullptr);
  BFT_ASSERT(e.seq <= last_executed);
  if (replaying) return;
  for (const Request& r : e.batch->requests) {
    if (r.client < opt.n || r.request_id == 0) continue;
    const CachedReply* cr = clients.cached_reply(r.client, r.request_id);
    if (cr == nullptr || cr->seq != e.seq) continue;
    send_reply(r, e.view, kind, cr->result);
  }
}

// Batch `e` committed here: how long it took from the PRE-PREPARE we accepted (or sent) in this view, for the
// view-change timer's latency allowance (latency_allowance_ticks). RFC 6298's estimator, as the client's:
// srtt += (sample - srtt) / 8, rttvar += (|sample - srtt| - rttvar) / 4. Only batches ordered and committed in
// the current view count: a view change's re-proposals, catch-up and state transfer measure something else. A
// sample is never longer than the timer that was running (a longer wait would have started a view change and
// left the view), so a primary can lengthen the allowance only by batches that commit within it, and never past
// latency_allowance_ticks_max.
void Replica::Impl::note_commit_latency(const Entry& e) {
  if (in_view_change || replaying || e.view != view || e.ordered_tick == kNotTimed || e.ordered_tick > ticks) return;
  const std::int64_t sample8 = static_cast<std::int64_t>(std::min<std::uint64_t>(ticks - e.ordered_tick, 1u << 20)) * 8;
  if (commit_srtt8 == 0) {
    commit_srtt8 = std::max<std::int64_t>(sample8, 1);
    commit_rttvar8 = sample8 / 2;
    return;
  }
  const std::int64_t err = sample8 - commit_srtt8;
  commit_srtt8 = std::max<std::int64_t>(commit_srtt8 + err / 8, 1);
  commit_rttvar8 += ((err < 0 ? -err : err) - commit_rttvar8) / 4;
  BFT_ASSERT(commit_rttvar8 >= 0);
}

// A batch committed: the primary of this view works, so the view-change backoff starts over (TOCS §4.5.2) and
// the timer restarts for whatever we still wait for. Commits, not tentative executions, are the progress that
// counts: a batch that executed tentatively but never commits still needs a view change.
void Replica::Impl::on_commit_progress() {
  if (in_view_change) return;
  vc_backoff = 0;
  vc_timer_ticks_left = 0;
}

// Undoes tentative executions above s (TOCS §5.1.2: a view change may drop a tentatively executed batch).
void Replica::Impl::rollback_to(std::uint64_t s) {
  discard_open_batch();  // executed after everything below
  BFT_ASSERT(s >= last_committed);
  BFT_ASSERT(s < last_executed);
  LOG_INFO(ctx(), "rolling back tentative execution to s%llu", static_cast<unsigned long long>(s));
  service.rollback_to(s);
  clients.rollback_to(s);
  BFT_ASSERT(!clients.has_tentative_above(s));
  for (std::uint64_t q = s + 1; q <= last_executed; q++) {
    if (Entry* e = find(q)) {
      e->executed_early = false;
      e->vote_replies_sent = false;
    }
  }
  last_executed = s;
  last_executed_timestamp_ns = 0;  // unknown again; the next check is skipped once
  stats.rollbacks++;
}

}  // namespace bftfs
