// Client requests at the replica (TOCS §2.1; §3.2 authenticators; §5.1.3 read-only requests): validation, the
// queue of requests known but not ordered yet, forwarding to the primary, cached replies to retransmissions, and
// the read-only path. See replica_impl.h for the map of the replica's files.
#include <iterator>

#include "common/assert.h"
#include "protocol/replica_impl.h"

namespace bftfs {

// Checks the fields a correct client always sets and this replica's authenticator entry (TOCS §3.2); returns
// the request digest, or nothing (counted) if the request is not acceptable.
std::optional<Digest> Replica::Impl::validate_request(const Request& r) {
  if (r.client < opt.n || r.request_id == 0 || r.authenticator.size() != opt.n ||
      (r.flags & ~kRequestFlagsKnown) != 0 || r.op.size() > kOpBytesMax) {
    stats.rejected_invalid++;
    return std::nullopt;
  }
  const Digest d = r.digest();
  if (!crypto.verify_mac(r.client, d.bytes, r.authenticator[self])) {
    stats.rejected_bad_authenticator++;
    return std::nullopt;
  }
  return d;
}

void Replica::Impl::on_request(NodeId from, const Request& r) {
  // A client speaks only for itself; a replica may relay any client's request (the authenticator is what
  // authenticates the client, TOCS §3.2).
  if (from >= opt.n && from != r.client) {
    stats.rejected_invalid++;
    return;
  }
  const std::optional<Digest> valid = validate_request(r);
  if (!valid) return;
  const Digest& d = *valid;
  if (r.read_only()) {
    // Executed only when no tentative state exists (TOCS §5.1.3); never ordered.
    if (read_only_queue.size() >= kReadOnlyQueueMax) {
      read_only_queue.pop_front();
      stats.rejected_out_of_window++;
    }
    read_only_queue.push_back(r);
    return;
  }
  if (service_diverged) return;  // our client table is not valid until state transfer completes
  switch (clients.classify(r.client, r.request_id)) {
    case ClientTable::Freshness::kStale:
      stats.rejected_out_of_window++;
      return;
    case ClientTable::Freshness::kExecuted:
      // A retransmission: answer with the cached reply instead of executing twice (TOCS §2.1).
      send_cached_reply(r.client, r.request_id);
      return;
    case ClientTable::Freshness::kFresh:
      break;
  }
  if (pending.count({r.client, r.request_id}) != 0) return;  // primary: already ordered, not yet executed
  enqueue(r, d);
  if (!in_view_change && primary_of(view) != self && from == r.client && forwarded.count(d) == 0) {
    // A backup relays a request it got directly to the primary, once (TOCS §2.3), and waits for it to execute
    // with the view-change timer running (update_timer, TOCS §4.5.2).
    if (forwarded.size() >= kForwardedMax) forwarded.clear();
    forwarded.insert(d);
    send(primary_of(view), r);
  }
}

void Replica::Impl::enqueue(const Request& r, const Digest& d) {
  auto& per_client = queue[r.client];
  auto it = per_client.find(r.request_id);
  if (it != per_client.end()) return;  // first body for an id wins; a correct client sends one
  if (per_client.size() >= opt.client_window || queued_count >= kQueuedRequestsMax ||
      queued_bytes + r.op.size() > kQueuedBytesMax) {
    stats.rejected_out_of_window++;
    if (per_client.empty()) queue.erase(r.client);
    return;
  }
  per_client.emplace(r.request_id, QueuedRequest{r, d});
  returning.erase(r.client);
  queued_count++;
  queued_bytes += r.op.size();
  if (is_primary()) tickets.push_back(r.client);
}

// Called when (client, id) executed (or became stale): it no longer waits anywhere.
void Replica::Impl::forget_request(NodeId client, std::uint64_t request_id) {
  pending.erase({client, request_id});
  auto it = queue.find(client);
  if (it == queue.end()) return;
  auto& per_client = it->second;
  // Drop the executed id and every queued id the window has passed (they are stale now).
  const std::uint64_t hi = clients.highest_executed(client);
  const std::uint64_t stale_below = hi >= opt.client_window ? hi - opt.client_window + 1 : 0;
  for (auto q = per_client.begin(); q != per_client.end();) {
    if (q->first == request_id || q->first < stale_below) {
      unqueue_bytes(q->second);
      q = per_client.erase(q);
      queued_count--;
    } else {
      ++q;
    }
  }
  if (per_client.empty()) queue.erase(it);
}

// Drops every queued request the client table no longer holds fresh (after a state transfer installed a state
// that executed them): they no longer wait anywhere.
void Replica::Impl::forget_executed_requests() {
  for (auto it = queue.begin(); it != queue.end();) {
    auto& per_client = it->second;
    for (auto q = per_client.begin(); q != per_client.end();) {
      if (clients.classify(it->first, q->first) != ClientTable::Freshness::kFresh) {
        pending.erase({it->first, q->first});
        unqueue_bytes(q->second);
        q = per_client.erase(q);
        queued_count--;
      } else {
        ++q;
      }
    }
    it = per_client.empty() ? queue.erase(it) : std::next(it);
  }
}

// `pending` from the log: the requests of the batches this primary ordered in its view and has not executed.
// Nothing on a backup or during a view change. Called when the new primary installs its view and after a state
// transfer, where execution jumps past batches the primary never executed itself.
void Replica::Impl::rebuild_pending() {
  pending.clear();
  if (in_view_change || primary_of(view) != self) return;
  for (std::uint64_t s = last_executed + 1; s < next_seq; s++) {
    const Entry* e = find(s);
    if (e == nullptr || e->view != view || !e->has_digest || !e->batch) continue;
    for (const Request& r : e->batch->requests) pending.insert({r.client, r.request_id});
  }
}

void Replica::Impl::send_cached_reply(NodeId client, std::uint64_t request_id) {
  const CachedReply* cr = clients.cached_reply(client, request_id);
  BFT_ASSERT(cr != nullptr);
  Reply rep;
  rep.view = view;
  rep.client = client;
  rep.request_id = request_id;
  rep.flags = kReplyHasResult;
  if (cr->seq > last_committed) {
    // Executed but not committed: a tentative vote if this replica prepared that batch (in any view: the
    // execution survived the view change only if the new view re-proposed the same digest), otherwise an
    // early execution by the primary (PBFT-CS), which is only a prediction. A client asking again for a quiet
    // batch may lack the backups' votes: we make ours (release_quiet), and its vote leaves behind the record.
    Entry* e = find(cr->seq);
    if (e != nullptr && e->quiet && !in_view_change) {
      release_quiet(*e, true);
      return;
    }
    const bool prepared = e != nullptr && e->has_digest && e->p && e->p->digest == e->digest;
    rep.flags |= prepared ? kReplyTentative : kReplySpeculative;
  }
  rep.result_digest = digest_of(cr->result);
  rep.result = cr->result;
  send(client, std::move(rep));
}

void Replica::Impl::process_read_only() {
  if (read_only_queue.empty()) return;
  // TOCS §5.1.3: a read-only request sees no tentative state, and none while the state is being replaced.
  if (last_executed != last_committed || open_batch || service_diverged || fetcher.active()) return;
  // Nor a state older than one this replica may have answered from before a crash. A committed reply goes out
  // before its CommittedRecord is durable (effects.h), so a replica restarted after a crash of all replicas may
  // be back at a state below what a client already saw completed, and 2f+1 such replicas would agree on a stale
  // read (simulator seed 400488, --scenario all-crash). Every batch it answered for had its PreparedRecord
  // synced first, so it reads again once everything it had prepared has committed.
  if (last_committed < reads_wait_for_seq) return;
  // A read waits for the ordered request its client issued before it (Request::prev_request_id), so that a
  // pipelining client reads its own writes; it keeps its place among the other waiting reads.
  std::deque<Request> waiting;
  while (!read_only_queue.empty()) {
    Request r = std::move(read_only_queue.front());
    read_only_queue.pop_front();
    if (!clients.predecessor_done(r.client, r.prev_request_id)) {
      waiting.push_back(std::move(r));
      continue;
    }
    Bytes result;
    const bool answered = service.execute_read_only(r.client, r.op, result);
    if (check_service_damage()) {  // the queue waits for the repaired state
      read_only_queue.insert(read_only_queue.begin(), std::make_move_iterator(waiting.begin()),
                             std::make_move_iterator(waiting.end()));
      return;
    }
    if (!answered) continue;  // the client falls back to ordering
    Reply rep;
    rep.view = view;
    rep.client = r.client;
    rep.request_id = r.request_id;
    rep.flags = kReplyReadOnly;
    rep.result_digest = digest_of(result);
    if (r.replier == self || r.replier == kReplierAll) {
      rep.flags |= kReplyHasResult;
      rep.result = std::move(result);
    }
    stats.read_only_executed++;
    send(r.client, std::move(rep));
  }
  read_only_queue = std::move(waiting);
}

}  // namespace bftfs
