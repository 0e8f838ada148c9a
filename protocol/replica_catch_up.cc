// Catch-up by retransmission (TOCS §5.2-§5.3): the periodic STATUS and the answers to it, FETCH-BATCH for a
// body whose digest is decided, and BATCH-DATA. Fetching a whole checkpoint is in replica_state_transfer.cc.
// See replica_impl.h for the map of the replica's files.
#include <algorithm>

#include "common/assert.h"
#include "protocol/replica_impl.h"

namespace bftfs {

// Periodic STATUS (TOCS §5.2-§5.3 retransmission): peers that are ahead answer with what we miss. It is sent
// only when it can help (status_needed), and otherwise every kStatusHeartbeatIntervals intervals: on this
// machine the four replicas' STATUS frames were a fifth of all their frames during a slow file-system workload,
// each one a wake-up of an otherwise idle process, while almost none of them led to a retransmission.
void Replica::Impl::on_status_timeout() {
  status_ticks_left = opt.status_interval_ticks;
  if (status_needed() || ++statuses_skipped >= kStatusHeartbeatIntervals) {
    statuses_skipped = 0;
    broadcast(own_status());
  }
  const bool stalled = last_committed == committed_at_last_status;
  committed_at_last_status = last_committed;
  check_state_transfer(stalled);
}

Status Replica::Impl::own_status() const { return Status{view, in_view_change, h, last_executed, last_committed}; }

// Whether our STATUS can help this interval. Peers act on a STATUS in two ways (on_status): they retransmit
// what its sender misses once two of its STATUS in a row show no progress, and they count its positions
// (view-change timer, lagging_behind_view, check_state_transfer). So it matters when we wait for something
// without progress, while views change or state is fetched, and when a peer claims to be ahead of us (we may
// have missed what it did: retransmission needs our STATUS). While batches keep committing, or while nothing is
// outstanding, it tells no one anything they act on; a peer that falls behind learns our position from the
// answer to its own STATUS (on_status) or from the heartbeat.
bool Replica::Impl::status_needed() const {
  if (in_view_change || pending_new_view || fetcher.active() || service_diverged || !fetching_seqs.empty()) {
    return true;
  }
  const bool outstanding = queued_count > 0 || max_ordered_seq > last_committed || last_executed < last_committed ||
                           !read_only_queue.empty() || open_batch.has_value();
  if (outstanding && last_committed == committed_at_last_status) return true;
  for (NodeId r = 0; r < opt.n; r++) {
    const std::optional<Status>& st = peer_status[r];
    if (r == self || !st) continue;
    if (st->view > view || (st->view == view && st->in_view_change != in_view_change)) return true;
    if (st->last_committed > last_committed || st->stable_seq > h) return true;
  }
  return false;
}

bool Replica::Impl::may_help(NodeId peer) {
  const std::uint64_t gap = std::max<std::uint64_t>(1, opt.status_interval_ticks / 2);
  if (last_help_tick[peer] != UINT64_MAX && ticks - last_help_tick[peer] < gap) return false;
  last_help_tick[peer] = ticks;
  return true;
}

// A peer's STATUS (TOCS §5.2-§5.3): we record its position (the view-change timer, lagging_behind_view and
// check_state_transfer count it) and, at most once per half status interval (may_help), answer with what it
// misses.
void Replica::Impl::on_status(NodeId from, const Status& st) {
  const std::optional<Status> prev = peer_status[from];
  peer_status[from] = st;
  const bool no_progress = prev && prev->last_committed == st.last_committed;
  peer_stuck_rounds[from] = no_progress ? peer_stuck_rounds[from] + 1 : 0;
  if (!may_help(from)) return;
  send_position(from, st);
  // A peer that made no progress since its previous STATUS is stuck; one that moves will get there itself.
  const bool stuck = !prev || prev->last_committed == st.last_committed;
  if (stuck) help_stuck_peer(from, st);
}

// What a peer behind us needs to know of our position: our STATUS, the proof of our view, our stable checkpoint.
void Replica::Impl::send_position(NodeId from, const Status& st) {
  // A peer behind the view we run, or behind us in it, may not know it (we send STATUS only when it helps,
  // on_status_timeout): our position tells it, so that its own STATUS keeps asking for what it misses and its
  // view-change decisions (update_timer, lagging_behind_view) see us. Only an installed view is a position worth
  // telling, and the answer never asks for one back (the peer is behind us), so two replicas never ping-pong.
  const bool behind_us =
      st.view < view ||
      (st.view == view && (st.in_view_change || st.last_committed < last_committed || st.stable_seq < h));
  if (!in_view_change && behind_us) send(from, own_status());

  // View help: a peer behind our view gets the NEW-VIEW that proves it; a peer in our view change gets our
  // VIEW-CHANGE again (both are self-certifying, so forwarding them is safe).
  if (!in_view_change && last_new_view && last_new_view->view == view &&
      (st.view < view || (st.view == view && st.in_view_change))) {
    send(from, *last_new_view);
  }
  if (in_view_change && view_changes[self] && (st.view < view || (st.view == view && st.in_view_change))) {
    send(from, *view_changes[self]);
  }

  // Checkpoint help: a peer below our stable checkpoint cannot get that part of the log from anyone any more;
  // our CHECKPOINT (with f others) lets it start state transfer.
  if (st.last_committed < h) send(from, Checkpoint{h, stable_digest});
}

// A peer that made no progress since its previous STATUS: our checkpoints above its stable one, and the part of
// our log it misses (votes, and bodies only when it has been stuck for a while).
void Replica::Impl::help_stuck_peer(NodeId from, const Status& st) {
  for (auto it = own_checkpoints.upper_bound(std::max(st.stable_seq, h)); it != own_checkpoints.end(); ++it) {
    send(from, Checkpoint{it->first, it->second.digest});
  }
  if (recovered_pending && recovered_pending->seq > st.stable_seq) {
    send(from, Checkpoint{recovered_pending->seq, recovered_pending->digest});  // our claim, waiting for theirs
  }
  // A peer changing views alone (ahead of our view) learns our decisions from commit certificates
  // (on_old_commit): it gets our COMMITs of committed batches and the bodies, nothing else.
  const bool peer_alone_ahead = st.in_view_change && st.view > view && !in_view_change;
  if (!peer_alone_ahead && (st.view != view || in_view_change || st.in_view_change)) return;
  const std::uint64_t lo = std::max(st.last_committed, h) + 1;
  const std::uint64_t hi = std::min({h + opt.log_window, max_ordered_seq, lo + kStatusResendSeqsMax - 1});
  const bool primary = primary_of(view) == self;
  // Bodies are the expensive part, and a peer that is merely slow (a batch of megabytes takes a while to log and
  // execute) has them already: answering each of its STATUS messages with up to 128 batches of megabytes
  // overflowed its connection (the transport drops a peer that does not read, losing everything queued), so
  // the resend started again, held gigabytes in memory, and turned one slow batch into a view-change storm.
  // Bodies go only to a peer stuck for two STATUS rounds in a row, and at most kStatusResendBytesMax of them;
  // a peer missing a body whose digest it knows fetches it itself (FETCH-BATCH).
  // And the same bodies to the same stuck position at most once per kStatusBodyIntervals status intervals: a
  // peer that takes longer than one interval to take in what it was sent (megabytes, on a busy disk) stays
  // "stuck" meanwhile, and answering each of its STATUS messages again multiplied the load it was stuck on.
  auto& [resent_pos, resent_tick] = status_bodies_sent[from];
  const bool resent_recently = resent_tick != UINT64_MAX && resent_pos == st.last_committed &&
                               ticks - resent_tick < std::uint64_t{kStatusBodyIntervals} * opt.status_interval_ticks;
  const bool send_bodies = peer_stuck_rounds[from] >= 2 && !resent_recently;
  std::uint64_t body_bytes = 0;
  for (std::uint64_t s = lo; s <= hi; s++) {
    const Entry* e = find(s);
    if (e == nullptr || e->view != view || !e->has_digest) continue;
    const bool body = send_bodies && body_bytes < kStatusResendBytesMax && e->batch && s > st.last_executed;
    if (body) {
      body_bytes += batch_op_bytes(*e->batch);
      resent_pos = st.last_committed;
      resent_tick = ticks;
    }
    if (peer_alone_ahead) {
      if (!e->committed || !e->sent_commit) continue;
      send(from, Commit{view, s, e->digest});
      if (body) send(from, BatchData{s, *e->batch});
      continue;
    }
    // Votes first, then the body: a body that is not a pre-prepare is accepted only for a digest the receiver
    // already knows (a certificate or a NEW-VIEW choice).
    if (e->sent_prepare) send(from, Prepare{view, s, e->digest});
    if (e->sent_commit) send(from, Commit{view, s, e->digest});
    if (body) {
      if (primary && e->pre_prepared) {
        send(from, PrePrepare{view, s, *e->batch});
      } else {
        send(from, BatchData{s, *e->batch});
      }
    }
  }
}

void Replica::Impl::start_fetch(Entry& e) {
  BFT_ASSERT(e.has_digest);
  BFT_ASSERT(!e.batch);
  if (e.digest == null_batch_digest()) {
    attach_body(e, std::make_shared<const Batch>());
    return;
  }
  e.fetching = true;
  e.fetch_attempts = 0;
  fetching_seqs.insert(e.seq);
  // A body of the current view that we lack is most likely still on its way from the primary: a batch of
  // megabytes takes a while on a busy link, and its PREPAREs and COMMITs (small, from other replicas) overtake
  // it. Asking at once made every backup of a slow replica send it the same megabytes again, on the link
  // that was already the bottleneck (finding 14: a view-change storm on one large write). So the first
  // FETCH-BATCH waits one retry interval then.
  if (e.view == view && !in_view_change && primary_of(view) != self) {
    e.fetch_ticks_left = fetch_retry_after(0);
    return;
  }
  send_fetch(e);
}

// One FETCH-BATCH, to one peer: the entry's primary first (it proposed the body), then the others in turn,
// so that a faulty or slow peer costs one retry and every peer is asked eventually (at least one of f+1 is
// correct and, if the body was prepared, has it). A broadcast made all n-1 peers answer with the body, which
// for large batches was the very load that kept the body from arriving. Retries back off (doubling, up to 16
// intervals) because an answer of megabytes may simply need longer than one interval.
void Replica::Impl::send_fetch(Entry& e) {
  BFT_ASSERT(e.fetching);
  BFT_ASSERT(opt.n >= 2);
  const NodeId first = primary_of(e.view);
  NodeId target = self;
  for (std::uint32_t k = 0, skip = e.fetch_attempts % (opt.n - 1);; k++) {
    const NodeId r = static_cast<NodeId>((first + k) % opt.n);
    if (r == self) continue;
    if (skip == 0) {
      target = r;
      break;
    }
    skip--;
  }
  BFT_ASSERT(target != self);
  send(target, FetchBatch{e.seq, e.digest});
  e.fetch_ticks_left = fetch_retry_after(e.fetch_attempts);
  e.fetch_attempts++;
}

// Ticks until FETCH-BATCH attempt `attempts` + 1: the retry interval doubled per earlier attempt (up to 16
// intervals), with jitter so that replicas missing the same body do not ask in lockstep.
std::uint32_t Replica::Impl::fetch_retry_after(std::uint32_t attempts) {
  return (opt.fetch_retry_ticks << std::min<std::uint32_t>(attempts, 4)) +
         static_cast<std::uint32_t>(prng.below(opt.fetch_retry_ticks / 4 + 1));
}

void Replica::Impl::on_fetch_batch(NodeId from, const FetchBatch& fb) {
  // The same body to the same peer at most once per retry interval: a correct peer never asks again sooner
  // (send_fetch backs off), and a faulty one must not turn small requests into a stream of megabytes.
  auto& [last_seq, last_tick] = last_fetch_served[from];
  if (last_tick != UINT64_MAX && last_seq == fb.seq && ticks - last_tick < opt.fetch_retry_ticks) {
    stats.fetches_refused_repeat++;
    return;
  }
  std::shared_ptr<const Batch> body;
  if (find_body(fb.seq, fb.digest, body)) {
    last_seq = fb.seq;
    last_tick = ticks;
    send(from, BatchData{fb.seq, *body});
  }
}

bool Replica::Impl::find_body(std::uint64_t s, const Digest& d, std::shared_ptr<const Batch>& out) {
  if (d == null_batch_digest()) {
    out = std::make_shared<const Batch>();
    return true;
  }
  if (const Entry* e = find(s)) {
    if (e->batch && e->has_digest && e->digest == d) {
      out = e->batch;
      return true;
    }
    if (e->alt_batch && e->alt_batch->digest() == d) {
      out = e->alt_batch;
      return true;
    }
  }
  if (pending_new_view) {
    auto it = pending_new_view->bodies.find(s);
    if (it != pending_new_view->bodies.end() && it->second->digest() == d) {
      out = it->second;
      return true;
    }
  }
  auto it = deferred.find(s);
  if (it != deferred.end() && it->second.body && it->second.digest == d) {
    out = it->second.body;
    return true;
  }
  return false;
}

// BATCH-DATA is self-certifying: it is accepted only for a digest this replica already decided to order.
void Replica::Impl::on_batch_data(NodeId from, const BatchData& bd) {
  (void)from;
  if (bd.batch.requests.size() > kBatchRequestsMax) {
    stats.rejected_invalid++;
    return;
  }
  if (pending_new_view) {
    auto it = pending_new_view->missing.find(bd.seq);
    if (it != pending_new_view->missing.end()) {
      if (bd.batch.digest() != it->second) {
        stats.rejected_invalid++;
        return;
      }
      pending_new_view->bodies[bd.seq] = std::make_shared<const Batch>(bd.batch);
      pending_new_view->missing.erase(it);
      if (pending_new_view->missing.empty()) finish_new_view();
      return;
    }
  }
  auto dit = deferred.find(bd.seq);
  if (dit != deferred.end() && !dit->second.body) {
    if (bd.batch.digest() == dit->second.digest) dit->second.body = std::make_shared<const Batch>(bd.batch);
    return;
  }
  Entry* e = find(bd.seq);
  if (e == nullptr || !e->has_digest || e->batch) return;  // unsolicited or already known: nothing to do
  if (bd.batch.digest() != e->digest) {
    if (e->fetching) stats.rejected_invalid++;
    return;
  }
  attach_body(*e, std::make_shared<const Batch>(bd.batch));
}

}  // namespace bftfs
