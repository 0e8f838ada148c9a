// The replica's entry points: construction, call framing (every public call runs begin_call(); handler;
// end_call()), dispatch of messages and ticks, and the public interface of protocol/replica.h. The state and the
// map of the other parts are in replica_impl.h.
#include "protocol/replica.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "common/assert.h"
#include "common/log.h"
#include "protocol/replica_impl.h"

namespace bftfs {

namespace {

// Approximate in-memory size of a message, for the future-message buffer bound.
std::size_t approx_bytes(const Message& m) {
  if (const auto* pp = std::get_if<PrePrepare>(&m)) {
    std::size_t s = 64;
    for (const Request& r : pp->batch.requests) s += 64 + r.op.size() + r.authenticator.size() * kMacBytes;
    return s;
  }
  return 128;
}

}  // namespace

Replica::Impl::Impl(const ReplicaOptions& options, NodeId self_id, Service& svc, const Crypto& crypto_ctx,
                    std::uint64_t prng_seed)
    : opt(options),
      self(self_id),
      service(svc),
      crypto(crypto_ctx),
      quorum(2 * options.f + 1),
      weak(options.f + 1),
      prng(prng_seed),
      fetcher(options.n, self_id, options.fetch_retry_ticks, prng),
      clients(options.client_window) {
  BFT_ASSERT(opt.n == 3 * opt.f + 1);
  BFT_ASSERT(opt.timer_bytes_per_tick >= 1);
  BFT_ASSERT(opt.n <= kReplicasMax);
  BFT_ASSERT(self < opt.n);
  BFT_ASSERT(crypto.self() == self);
  BFT_ASSERT(opt.checkpoint_interval > 0);
  BFT_ASSERT(opt.log_window >= opt.checkpoint_interval);
  BFT_ASSERT(opt.log_window % opt.checkpoint_interval == 0);
  // Q holds at most two entries per seq and a view change carries at most kViewChangeEntriesMax of them.
  BFT_ASSERT(2 * opt.log_window <= kViewChangeEntriesMax);
  BFT_ASSERT(opt.batch_requests_max >= 1);
  BFT_ASSERT(opt.batch_requests_max <= kBatchRequestsMax);
  BFT_ASSERT(opt.client_window >= 1 && opt.client_window <= 64);
  BFT_ASSERT(opt.view_change_timeout_ticks >= 1);
  BFT_ASSERT(opt.view_change_timeout_ticks_max >= opt.view_change_timeout_ticks);
  BFT_ASSERT(opt.status_interval_ticks >= 1);
  ring.resize(opt.log_window);
  claims.resize(opt.n);
  view_changes.resize(opt.n);
  peer_status.resize(opt.n);
  peer_stuck_rounds.resize(opt.n, 0);
  last_help_tick.assign(opt.n, UINT64_MAX);
  last_fetch_served.assign(opt.n, {0, UINT64_MAX});
  status_bodies_sent.assign(opt.n, {0, UINT64_MAX});
  future_per_sender.assign(opt.n, 0);
  status_ticks_left = opt.status_interval_ticks;
  // The initial state is checkpoint 0 on every correct replica: the service's initial root and an empty client
  // table. It is the stable checkpoint until the first one at K (and what C claims in an early view change).
  const CheckpointId initial = service.recovered_checkpoint();
  Bytes table = clients.encode();
  stable_digest = checkpoint_digest(0, initial.digest, digest_of(table));
  // Retained: every service keeps its newest checkpoint readable (protocol/service.h), and the initial state's
  // tree lets a new or wiped replica fetch only the partitions that differ from it.
  own_checkpoints[0] = OwnCheckpoint{stable_digest, std::move(table), true};
  claims[self][0] = stable_digest;
}

// ---------------------------------------------------------------------------------------------------------------
// Log entries
// ---------------------------------------------------------------------------------------------------------------

Replica::Impl::Entry& Replica::Impl::get_or_create(std::uint64_t s) {
  BFT_ASSERT(in_window(s));
  Entry& e = ring[s % opt.log_window];
  if (e.seq != s) {
    // A slot's previous occupant is s - L or older, at or below h: garbage collected.
    BFT_ASSERT(e.seq == 0 || e.seq <= h);
    e = Entry{};
    e.seq = s;
    e.view = view;
  }
  return e;
}

// Forgets the ordering state of an older view (TOCS §4.5: a new view starts with fresh pre-prepares, prepares
// and commits), keeping what the view change needs (P, Q) and, for a committed batch, its digest and body.
void Replica::Impl::reset_view_state(Entry& e, std::uint64_t v, bool keep_digest) {
  e.view = v;
  e.votes.clear();
  e.prepare_senders = 0;
  e.commit_senders = 0;
  e.pre_prepared = false;
  e.sent_prepare = false;
  e.prepared = false;
  e.sent_commit = false;
  e.quiet = false;
  e.old_commit_senders = 0;
  e.old_commits.clear();
  if (e.fetching) {
    e.fetching = false;
    fetching_seqs.erase(e.seq);
  }
  if (!keep_digest) {
    BFT_ASSERT(!e.committed);
    if (e.batch) e.alt_batch = std::move(e.batch);
    e.batch.reset();
    e.has_digest = false;
  }
}

Replica::Impl::VoteSet& Replica::Impl::votes_for(Entry& e, const Digest& d) {
  for (VoteSet& vs : e.votes) {
    if (vs.digest == d) return vs;
  }
  e.votes.push_back(VoteSet{d, 0, 0});
  return e.votes.back();
}

const Replica::Impl::VoteSet* Replica::Impl::find_votes(const Entry& e, const Digest& d) const {
  for (const VoteSet& vs : e.votes) {
    if (vs.digest == d) return &vs;
  }
  return nullptr;
}

// Q keeps, per seq, the pre-prepared digests with the highest views (TOCS §4.5: at most two are needed, since a
// correct replica pre-prepares at most one digest per view and only the two most recent matter for A2).
void Replica::Impl::add_q(Entry& e, std::uint64_t v, const Digest& d) {
  for (std::uint8_t i = 0; i < e.q_count; i++) {
    if (e.q[i].digest == d) {
      e.q[i].view = std::max(e.q[i].view, v);
      return;
    }
  }
  const PreparedClaim c{e.seq, d, v};
  if (e.q_count < 2) {
    e.q[e.q_count++] = c;
    return;
  }
  const std::uint8_t lowest = e.q[0].view <= e.q[1].view ? 0 : 1;
  if (e.q[lowest].view < v) e.q[lowest] = c;
}

// ---------------------------------------------------------------------------------------------------------------
// Call framing: every public entry point runs begin_call(); handler; end_call().
// ---------------------------------------------------------------------------------------------------------------

void Replica::Impl::begin_call() {
  if (filter) {
    scratch.clear();
    cur = &scratch;
  } else {
    cur = &out;
  }
}

void Replica::Impl::end_call() {
  after_step();
  // The O(1) invariants after every call; the full scan of the log (O(L)) every kFullCheckEvery calls, which
  // keeps it off the per-message cost (it was a third of the CPU per request at L = 256) while still catching a
  // broken log soon. Tests and the simulator call the full check after every step.
  check_invariants_fast();
  if (++calls_since_full_check >= kFullCheckEvery) {
    calls_since_full_check = 0;
    check_invariants();
  }
  if (filter) {
    filter(scratch);
    for (auto& r : scratch.persist) out.persist.push_back(std::move(r));
    for (auto& s : scratch.sends) out.sends.push_back(std::move(s));
    scratch.clear();
  }
  cur = &out;
}

// Everything a state change may allow, in dependency order.
void Replica::Impl::after_step() {
  poll_fetcher();
  run_execution();
  maybe_send_pre_prepares();
  if (!read_only_queue.empty() && !deferred_commits.empty()) flush_commits();  // reads wait for the commit round
  process_read_only();
  poll_fetcher();
  update_timer();
}

// ---------------------------------------------------------------------------------------------------------------
// Dispatch
// ---------------------------------------------------------------------------------------------------------------

void Replica::Impl::dispatch(NodeId from, const Message& m) {
  if (const auto* r = std::get_if<Request>(&m)) {
    on_request(from, *r);
    return;
  }
  // Everything else only replicas send; the wire layer checks it too, but the core does not rely on that.
  if (from >= opt.n || from == self) {
    stats.rejected_invalid++;
    return;
  }
  std::visit(
      [&](const auto& msg) {
        using T = std::decay_t<decltype(msg)>;
        if constexpr (std::is_same_v<T, PrePrepare>) {
          on_pre_prepare(from, msg, m);
        } else if constexpr (std::is_same_v<T, Prepare>) {
          on_prepare(from, msg, m);
        } else if constexpr (std::is_same_v<T, Commit>) {
          on_commit(from, msg, m);
        } else if constexpr (std::is_same_v<T, Checkpoint>) {
          on_checkpoint(from, msg);
        } else if constexpr (std::is_same_v<T, ViewChange>) {
          on_view_change(from, msg);
        } else if constexpr (std::is_same_v<T, NewView>) {
          on_new_view(from, msg);
        } else if constexpr (std::is_same_v<T, Status>) {
          on_status(from, msg);
        } else if constexpr (std::is_same_v<T, FetchBatch>) {
          on_fetch_batch(from, msg);
        } else if constexpr (std::is_same_v<T, BatchData>) {
          on_batch_data(from, msg);
        } else if constexpr (std::is_same_v<T, FetchState>) {
          on_fetch_state(from, msg);
        } else if constexpr (std::is_same_v<T, StateNode>) {
          fetcher.on_state_node(from, msg);
        } else if constexpr (std::is_same_v<T, StateLeaf>) {
          fetcher.on_state_leaf(from, msg);
        } else {
          // Reply (replicas never receive one) and Request (handled above).
          stats.rejected_invalid++;
        }
      },
      m);
}

// Normal-case messages are processed only in the current view once it is entered (TOCS §2.3: "the replica is
// in view v"). Messages for a later view, or for the view being changed to, are buffered (bounded) and replayed
// when the view is entered; older ones are dropped.
bool Replica::Impl::accept_view(NodeId from, std::uint64_t msg_view, const Message& m) {
  if (msg_view < view) {
    stats.rejected_wrong_view++;
    return false;
  }
  if (msg_view > view || in_view_change) {
    buffer_future(from, m);
    return false;
  }
  return true;
}

void Replica::Impl::buffer_future(NodeId from, const Message& m) {
  BFT_ASSERT(from < opt.n);
  const std::size_t bytes = approx_bytes(m);
  if (future.size() >= kFutureMessagesMax || future_bytes + bytes > kFutureBytesMax ||
      future_per_sender[from] >= kFutureMessagesMax / opt.n) {
    stats.rejected_wrong_view++;
    return;
  }
  future_bytes += bytes;
  future_per_sender[from]++;
  future.emplace_back(from, m);
}

void Replica::Impl::replay_future() {
  std::deque<std::pair<NodeId, Message>> pending_msgs;
  pending_msgs.swap(future);
  future_bytes = 0;
  future_per_sender.assign(opt.n, 0);
  for (auto& [from, m] : pending_msgs) {
    std::uint64_t v = 0;
    if (const auto* pp = std::get_if<PrePrepare>(&m)) v = pp->view;
    if (const auto* p = std::get_if<Prepare>(&m)) v = p->view;
    if (const auto* c = std::get_if<Commit>(&m)) v = c->view;
    if (v < view) continue;
    if (v > view || in_view_change) {
      buffer_future(from, m);
      continue;
    }
    dispatch(from, m);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Requests (TOCS §2.1, §3.2 authenticators, §5.1.3 read-only)
// ---------------------------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------------------------
// Primary: batching and pre-prepare (TOCS §2.3, §5.1.4)
// ---------------------------------------------------------------------------------------------------------------

void Replica::Impl::maybe_send_pre_prepares() {
  batch_held = false;
  if (!is_primary() || service_diverged || pending_new_view) return;
  if (opt.early_replies) {
    order_early();
    return;
  }
  while (queued_count > 0 && !tickets.empty()) {
    BFT_ASSERT(next_seq >= last_committed + 1);
    const std::uint64_t in_flight = batches_in_flight(next_seq - 1);
    // Sliding window of batches: while fewer than batch_window are in flight a request goes out at once, so a
    // lone request never waits; otherwise requests accumulate and leave in one batch when a batch commits.
    if (opt.batch_window > 0 && in_flight >= opt.batch_window) break;
    if (next_seq > h + opt.log_window) break;  // high watermark: wait for a stable checkpoint
    if (hold_for_returning()) {
      batch_held = true;
      break;
    }
    const std::uint32_t limit = opt.batch_window == 0 ? 1 : opt.batch_requests_max;
    Batch b;
    std::size_t bytes = 0;
    while (b.requests.size() < limit && !tickets.empty()) {
      std::size_t size = 0;
      std::optional<QueuedRequest> qr = pop_ticket(bytes, b.requests.empty(), size);
      if (!qr) break;
      const NodeId c = qr->request.client;
      if (clients.classify(c, qr->request.request_id) != ClientTable::Freshness::kFresh) continue;
      if (!pending.insert({c, qr->request.request_id}).second) continue;
      bytes += size;
      b.requests.push_back(std::move(qr->request));
    }
    if (b.requests.empty()) break;
    send_pre_prepare(std::move(b));
  }
  trim_tickets();
}

// The request of the next ticket (the ticket's client's lowest queued id that ready_to_order allows: each
// client's requests are ordered in the order it issued them), removed from the queue, with `size` its share of a batch. Nothing when a ticket's request would
// take a non-empty batch of `batch_bytes` past kBatchBytesMax (it stays queued). Tickets whose client has nothing
// queued any more are dropped on the way; nothing when no ticket is left.
std::optional<Replica::Impl::QueuedRequest> Replica::Impl::pop_ticket(std::size_t batch_bytes, bool batch_empty, std::size_t& size) {
  // Tickets of clients whose queued requests all wait for their predecessors go to the back, each at most once
  // per call, so that one waiting client never holds up the others.
  std::size_t waiting_tickets_left = tickets.size();
  while (!tickets.empty()) {
    const NodeId c = tickets.front();
    auto qit = queue.find(c);
    if (qit == queue.end()) {
      tickets.pop_front();
      continue;
    }
    // The client's lowest queued request that may be ordered now. Usually its lowest: a later one can be ready
    // first when the lowest belongs to an earlier incarnation of the client whose predecessor is lost for good
    // (a restarted client names no predecessor, and its first execution makes those old ids stale).
    auto rit = qit->second.begin();
    while (rit != qit->second.end() && !ready_to_order(rit->second.request)) ++rit;
    if (rit == qit->second.end()) {
      if (waiting_tickets_left == 0) return std::nullopt;
      waiting_tickets_left--;
      tickets.pop_front();
      tickets.push_back(c);
      continue;
    }
    size = rit->second.request.op.size() + opt.n * kMacBytes + 64;
    if (!batch_empty && batch_bytes + size > kBatchBytesMax) return std::nullopt;
    tickets.pop_front();
    unqueue_bytes(rit->second);
    QueuedRequest qr = std::move(rit->second);
    qit->second.erase(rit);
    queued_count--;
    if (qit->second.empty()) queue.erase(qit);
    return qr;
  }
  return std::nullopt;
}

// The per-client order rule at the primary (TOCS §5.1.4 pipelining, order kept per client): a request is
// ordered only after its predecessor executed or was ordered by us (pending), so a correct primary never puts
// a client's request before the one it was issued after, in a batch or across batches. Execution enforces the
// rule again (execute_request) against a primary that does.
bool Replica::Impl::ready_to_order(const Request& r) const {
  return clients.predecessor_done(r.client, r.prev_request_id) ||
         pending.count({r.client, r.prev_request_id}) != 0;
}

// True if some queued request can execute as soon as it is ordered (its predecessor executed): the requests a
// backup waits for with its view-change timer. One whose predecessor never reached us is not the primary's
// fault, so it must not start a view change; the client's retransmission brings the predecessor. Usually the
// first request looked at answers (the queue holds what is not executed yet).
bool Replica::Impl::any_ready_queued() const {
  for (const auto& [c, reqs] : queue) {
    BFT_ASSERT(!reqs.empty());
    for (const auto& [id, q] : reqs) {
      if (clients.predecessor_done(c, q.request.prev_request_id)) return true;
    }
  }
  return false;
}

// Tickets can outlive their requests (executed through another path); keep them bounded.
void Replica::Impl::trim_tickets() {
  if (tickets.size() <= 2 * queued_count + 64) return;
  tickets.clear();
  for (const auto& [c, reqs] : queue) {
    for (std::size_t i = 0; i < reqs.size(); i++) tickets.push_back(c);
  }
}

// Batch hold. With one batch in flight (batch_window 1) and K closed-loop clients, the primary sends the next
// batch the moment the window opens, with whatever has arrived: the clients of the batch that just executed are
// still waiting for their replies (behind the log write), so they miss it and form the next batch, and the
// clients settle into two cohorts that alternate batches of about K/2. Each batch round costs every replica a
// durable log write and a fixed number of messages, so halving the batch doubles the cost per request: with 32
// clients on the 2-core test machine, holding until all 32 had arrived gave +50% requests/s, -32% CPU per
// request and -35% latency (benchmarks/ab_cpu.py). The hold waits only for clients that are certain to come
// back soon: those answered since our last PRE-PREPARE with nothing else queued or ordered. A client that stops
// costs one bounded wait (the driver's end_batch_hold, else the second tick), after which it is forgotten until it
// is answered again; a lone client never waits, since its next request removes it from `returning` as it
// arrives. TOCS §5.1.4 batches on a window of batches in flight; this is the same idea applied to how a batch
// fills once the window opens. Only the timing of PRE-PREPAREs changes, never what is ordered.
bool Replica::Impl::hold_for_returning() const {
  if (!opt.batch_hold || opt.batch_window == 0 || hold_ended || returning.empty()) return false;
  return queued_count < opt.batch_requests_max;  // a full batch never waits
}

// `client` was just answered by this primary; the next batch waits for its next request if it has nothing else
// queued or ordered (a pipelining client's next request may already be here, and waiting for it is pointless).
void Replica::Impl::note_returning(NodeId client) {
  if (!opt.batch_hold || opt.batch_window == 0 || opt.early_replies || replaying || !is_primary()) return;
  if (queue.count(client) != 0) return;
  const auto it = pending.lower_bound({client, 0});
  if (it != pending.end() && it->first == client) return;
  returning.insert(client);
}

void Replica::Impl::end_batch_hold() {
  if (batch_held) hold_ended = true;
}

void Replica::Impl::reset_batch_hold() {
  returning.clear();
  batch_held = false;
  hold_ended = false;
  hold_ticks = 0;
}

void Replica::Impl::send_pre_prepare(Batch&& b) {
  reset_batch_hold();  // whoever did not make this batch is not waited for again until answered again
  b.timestamp_ns = next_batch_timestamp();
  propose(next_seq++, std::make_shared<const Batch>(std::move(b)));
}

// The agreed non-determinism (TOCS §2.3 "non-determinism"): the primary picks the batch's time, strictly
// increasing so that backups can check it against the previous batch.
std::uint64_t Replica::Impl::next_batch_timestamp() {
  last_timestamp_ns = std::max({last_timestamp_ns + 1, last_executed_timestamp_ns + 1, wall_clock_ns});
  return last_timestamp_ns;
}

// The primary orders `body` at `s` in its view: the log entry takes the digest and the body, and the PRE-PREPARE
// goes out behind its record.
Replica::Impl::Entry& Replica::Impl::propose(std::uint64_t s, std::shared_ptr<const Batch> body) {
  BFT_ASSERT(in_window(s));
  Entry& e = get_or_create(s);
  BFT_ASSERT(!e.committed);
  if (e.view != view) reset_view_state(e, view, false);
  BFT_ASSERT(!e.has_digest);
  e.has_digest = true;
  e.digest = body->digest();
  max_ordered_seq = std::max(max_ordered_seq, s);
  attach_body(e, body);  // persists the PrePrepareRecord first: a restarted primary never reuses s
  broadcast(PrePrepare{view, s, *body});
  return e;
}

// ---------------------------------------------------------------------------------------------------------------
// PBFT-CS early execution (Wester et al., NSDI'09 §3.1): "the primary in PBFT-CS executes an operation
// immediately upon receiving a request and sends the early reply to the client as a speculative response. The
// primary then forms a pre-prepare message for the next batch of requests". Executing at receipt, not when the
// batch goes out, is what lets a speculating client pipeline: with batching, a request that arrives while a
// batch is in flight would otherwise wait for that batch to commit before the client hears anything.
//
// The executions land in the open batch at seq next_seq - 1 (reserved when it opens); the batch goes out as the
// next PRE-PREPARE, with its requests in execution order, when the batch window allows, exactly as a batch of
// queued requests would. Until then nothing about it is in the log: a crash, view change or state transfer
// simply undoes it (discard_open_batch) and its requests wait in the queue again.
// ---------------------------------------------------------------------------------------------------------------

// Batches sent and not yet committed (the open batch is not sent).
std::uint64_t Replica::Impl::closed_in_flight() const {
  const std::uint64_t last_sent = open_batch ? open_batch->seq - 1 : next_seq - 1;
  BFT_ASSERT(last_sent >= last_committed);
  return batches_in_flight(last_sent);
}

// The batches up to `last_sent` that count against the batch window: those not committed, or with piggybacked
// commits those not yet prepared here (their commits ride on the next PRE-PREPARE, see defer_commit). So that the
// commit round cannot fall behind without bound, the window also closes when more than 2 * batch_window + 2
// batches are uncommitted (this also bounds the scan).
std::uint64_t Replica::Impl::batches_in_flight(std::uint64_t last_sent) const {
  BFT_ASSERT(last_sent >= last_committed);
  const std::uint64_t uncommitted = last_sent - last_committed;
  if (!commits_piggybacked() || opt.batch_window == 0) return uncommitted;
  if (uncommitted > 2 * static_cast<std::uint64_t>(opt.batch_window) + 2) return uncommitted;
  std::uint64_t unprepared = 0;
  for (std::uint64_t s = last_committed + 1; s <= last_sent; s++) {
    const Entry* e = find(s);
    if (e == nullptr || !(e->committed || (e->prepared && e->view == view))) unprepared++;
  }
  return unprepared;
}

// A new batch may open at next_seq when every batch ordered so far was executed (the open batch executes after
// them), the seq is inside the log window, and execution would not pass a checkpoint boundary that has not
// committed (the same rule as tentative execution: the state at a checkpoint is always final).
bool Replica::Impl::can_open_batch() const {
  if (open_batch || fetcher.active() || service_diverged) return false;
  if (last_executed + 1 != next_seq) return false;
  if (next_seq > h + opt.log_window) return false;
  const std::uint64_t boundary = ((next_seq - 1) / opt.checkpoint_interval) * opt.checkpoint_interval;
  return boundary <= last_committed;
}

void Replica::Impl::order_early() {
  BFT_ASSERT(is_primary());
  const std::uint32_t limit = opt.batch_window == 0 ? 1 : opt.batch_requests_max;
  for (;;) {
    const bool window_open = opt.batch_window == 0 || closed_in_flight() < opt.batch_window;
    if (open_batch && window_open) {
      close_open_batch();
      continue;
    }
    if (queued_count == 0 || tickets.empty()) break;
    if (open_batch && open_batch->batch.requests.size() >= limit) break;  // full: waits for the window
    if (!open_batch && !can_open_batch()) break;
    std::size_t size = 0;
    std::optional<QueuedRequest> qr =
        pop_ticket(open_batch ? open_batch->bytes : 0, !open_batch || open_batch->batch.requests.empty(), size);
    if (!qr) break;
    const NodeId c = qr->request.client;
    if (clients.classify(c, qr->request.request_id) != ClientTable::Freshness::kFresh) continue;
    if (pending.count({c, qr->request.request_id}) != 0) continue;  // re-proposed by our NEW-VIEW
    if (!clients.predecessor_done(c, qr->request.prev_request_id)) {
      // Its predecessor is pending but not executed: ordered in no batch this primary will execute before
      // this one (every earlier batch has executed: can_open_batch), e.g. in one a view change dropped. The
      // request waits in the queue until the predecessor executes (or its client retransmits it).
      enqueue(qr->request, qr->digest);
      break;
    }
    if (!open_batch) {
      open_batch.emplace();
      open_batch->seq = next_seq++;
      open_batch->batch.timestamp_ns = next_batch_timestamp();
    }
    const bool executed = execute_request(qr->request, open_batch->seq, view, open_batch->batch.timestamp_ns,
                                          ReplyKind::kSpeculative);
    BFT_ASSERT(executed);  // fresh, ordered, authenticated: nothing left to skip it
    open_batch->bytes += size;
    open_batch->batch.requests.push_back(std::move(qr->request));
  }
  trim_tickets();
}

// The open batch becomes the PRE-PREPARE at its seq; it is already executed (speculatively).
void Replica::Impl::close_open_batch() {
  BFT_ASSERT(open_batch);
  BFT_ASSERT(!open_batch->batch.requests.empty());
  const std::uint64_t s = open_batch->seq;
  BFT_ASSERT(s == last_executed + 1);
  auto body = std::make_shared<const Batch>(std::move(open_batch->batch));
  open_batch.reset();
  Entry& e = propose(s, body);
  e.executed_early = true;
  e.vote_replies_sent = false;
  last_executed = s;
  last_executed_timestamp_ns = body->timestamp_ns;
}

// Undoes the open batch (its seq was never sent) and queues its requests again.
void Replica::Impl::discard_open_batch() {
  if (!open_batch) return;
  const std::uint64_t s = open_batch->seq;
  BFT_ASSERT(s == last_executed + 1);
  BFT_ASSERT(s >= 1 && s - 1 >= last_committed);
  service.rollback_to(s - 1);
  clients.rollback_to(s - 1);
  BFT_ASSERT(!clients.has_tentative_above(s - 1));
  Batch b = std::move(open_batch->batch);
  open_batch.reset();
  next_seq = s;
  stats.open_batches_discarded += b.requests.size();
  LOG_INFO(ctx(), "discarding %zu early-executed requests at s%llu", b.requests.size(),
           static_cast<unsigned long long>(s));
  for (const Request& r : b.requests) {
    if (clients.classify(r.client, r.request_id) == ClientTable::Freshness::kFresh) enqueue(r, r.digest());
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Backups: pre-prepare, prepare, commit (TOCS §2.3)
// ---------------------------------------------------------------------------------------------------------------

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

// Quiet primary. The client needs 2f+1 matching tentative votes (or f+1 committed ones) and a batch commits on
// 2f+1 COMMITs, each backed by a synced PreparedRecord (effects.h); n = 3f+1 replicas have 3f >= 2f+1 backups,
// so while the backups answer, the primary's own record, COMMIT and votes are never needed, and its durable
// write per batch (one of the four on the disk the replicas share here, measured at ~90 us of CPU each) is
// saved. Clients designate a backup as the replier of ordered requests (Client::Impl::ordered_replier_offset),
// so a quiet primary sends nothing; when it is asked for the full result (kReplierAll, a retransmission) its
// reply is flagged speculative (kQuiet): the client keeps the bytes for the certificate's digest but counts no
// vote (Client::on_reply). Safety is untouched: every promise the primary does send is still
// backed by a durable record; withholding one is always allowed. `p` is set in memory, and persist_quiet_claims
// makes it durable when the primary leaves the view, before any VIEW-CHANGE of its own can claim it. Liveness: a batch goes quiet only when 2f+1 backups sent their
// PREPARE for it or for the batch before it (they answer); one that has not committed quiet_release_ticks later
// is released (release_quiet_on_timer), and so is one a client asks for again (send_cached_reply). After a
// release by the timer nothing goes quiet for the next kQuietPauseSeqs seqs, so a backup that prepares but
// withholds its COMMIT costs one timeout, not one per batch. Not at a checkpoint seq (execution past it waits for
// its commit, and the primary's COMMIT there leaves at once, see defer_commit).
bool Replica::Impl::may_go_quiet(const Entry& e) const {
  if (!opt.quiet_primary || !is_primary() || e.view != view || e.seq < quiet_resume_seq) return false;
  if (e.seq % opt.checkpoint_interval == 0) return false;
  const int backups_needed = static_cast<int>(2 * opt.f + 1);
  if (popcount(e.prepare_senders) >= backups_needed) return true;
  const Entry* prev = e.seq > h + 1 ? find(e.seq - 1) : nullptr;
  return prev != nullptr && prev->view == view && popcount(prev->prepare_senders) >= backups_needed;
}

// What prepared(e) promises: the PreparedRecord, which backs our COMMIT (and P in a view change), and the COMMIT.
void Replica::Impl::promise_prepared(Entry& e) {
  persist(PreparedRecord{e.view, e.seq, e.digest});
  e.sent_commit = true;
  record_vote(e, self, e.digest, true);
  defer_commit(e);
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

// ---------------------------------------------------------------------------------------------------------------
// Execution (TOCS §2.3 "executes in seq order", §5.1.2 tentative execution)
// ---------------------------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------------------------
// Checkpoints and garbage collection (TOCS §2.5)
// ---------------------------------------------------------------------------------------------------------------

void Replica::Impl::take_checkpoint(std::uint64_t s) {
  BFT_ASSERT(s % opt.checkpoint_interval == 0);
  if (service_diverged) return;  // damaged while executing up to s: the state at s is not ours to claim
  BFT_ASSERT(s == last_committed);
  BFT_ASSERT(s == last_executed);
  const CheckpointId id = service.checkpoint(s);  // durable on return
  if (check_service_damage()) return;  // nothing was taken: no record, no claim, no CHECKPOINT
  BFT_ASSERT(id.seq == s);
  Bytes table = clients.encode();
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

// ---------------------------------------------------------------------------------------------------------------
// Catch-up: STATUS, FETCH-BATCH, BATCH-DATA (TOCS §5.2/§5.3 retransmission)
// ---------------------------------------------------------------------------------------------------------------

bool Replica::Impl::may_help(NodeId peer) {
  const std::uint64_t gap = std::max<std::uint64_t>(1, opt.status_interval_ticks / 2);
  if (last_help_tick[peer] != UINT64_MAX && ticks - last_help_tick[peer] < gap) return false;
  last_help_tick[peer] = ticks;
  return true;
}

void Replica::Impl::on_status(NodeId from, const Status& st) {
  const std::optional<Status> prev = peer_status[from];
  peer_status[from] = st;
  const bool no_progress = prev && prev->last_committed == st.last_committed;
  peer_stuck_rounds[from] = no_progress ? peer_stuck_rounds[from] + 1 : 0;
  if (!may_help(from)) return;

  // A peer behind the view we run, or behind us in it, may not know it (we send STATUS only when it helps,
  // on_status_timeout): our position tells it, so that its own STATUS keeps asking for what it misses and its
  // view-change decisions (update_timer, lagging_behind_view) see us. Only an installed view is a position worth
  // telling, and the answer never asks for one back (the peer is behind us), so two replicas never ping-pong.
  if (!in_view_change && (st.view < view || (st.view == view && (st.in_view_change || st.last_committed < last_committed ||
                                                                 st.stable_seq < h)))) {
    send(from, own_status());
  }

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

  // A peer that made no progress since its previous STATUS is stuck; one that moves will get there itself.
  const bool stuck = !prev || prev->last_committed == st.last_committed;
  if (!stuck) return;
  for (auto it = own_checkpoints.upper_bound(std::max(st.stable_seq, h)); it != own_checkpoints.end(); ++it) {
    send(from, Checkpoint{it->first, it->second.digest});
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

void Replica::Impl::on_fetch_state(NodeId from, const FetchState& fs) {
  auto it = own_checkpoints.find(fs.checkpoint_seq);
  if (it == own_checkpoints.end() || !it->second.retained) return;  // a correct fetcher asks someone else
  std::optional<Message> reply = serve_fetch_state(fs, service, fs.checkpoint_seq, it->second.client_table);
  if (reply) send(from, std::move(*reply));
}

// ---------------------------------------------------------------------------------------------------------------
// State transfer (TOCS §5.3)
// ---------------------------------------------------------------------------------------------------------------

// f+1 matching CHECKPOINT claims above what we committed mean at least one correct replica has that state
// (tentative execution does not count: it may be undone, and the commits for it may be garbage collected at the
// others). We fetch it at once when it is beyond our window (the log cannot get us there), otherwise only when
// no batch committed over a status interval (the peers may have garbage collected the log we need).
void Replica::Impl::check_state_transfer(bool stalled) {
  std::map<std::pair<std::uint64_t, Digest>, std::uint32_t> counts;
  for (NodeId r = 0; r < opt.n; r++) {
    for (auto it = claims[r].upper_bound(last_committed); it != claims[r].end(); ++it) {
      counts[{it->first, it->second}]++;
    }
  }
  const std::pair<std::uint64_t, Digest>* best = nullptr;
  for (auto it = counts.rbegin(); it != counts.rend(); ++it) {
    if (it->second >= weak) {
      best = &it->first;
      break;
    }
  }
  if (best == nullptr) return;
  const std::uint64_t s = best->first;
  if (service_diverged && s < diverged_service_seq) return;
  if (fetcher.active() && fetcher.target_seq() >= s) return;
  if (s > h + opt.log_window || stalled || service_diverged) start_state_fetch(s, best->second);
}

// The service found its stored state damaged (a checksum mismatch): the replica becomes one of the f faults
// until a state transfer repairs it. It stops executing and replying (service_diverged) and fetches the next
// stable checkpoint, diffing against its own newest checkpoint with the damaged partitions blanked, so only
// those and what changed since are fetched. Returns whether the service is damaged.
bool Replica::Impl::check_service_damage() {
  if (service_damaged) return true;
  const std::vector<std::uint64_t> damaged = service.damaged_partitions();
  if (damaged.empty()) return false;
  LOG_WARN(ctx(), "service storage damaged in %zu partition(s) (first %llu); silent until repaired by state transfer",
           damaged.size(), static_cast<unsigned long long>(damaged.front()));
  stats.service_damaged++;
  service_damaged = true;
  if (!service_diverged) {
    service_diverged = true;
    diverged_service_seq = last_committed;
  }
  return true;
}

void Replica::Impl::start_state_fetch(std::uint64_t s, const Digest& d) {
  if (s <= last_committed) return;
  if (fetcher.active() && fetcher.target_seq() >= s) return;
  discard_open_batch();  // the state is about to be replaced; the primary stops executing early meanwhile
  // The fetcher skips subtrees equal to `local`, and an install starts from the service's newest checkpoint
  // (what it executed after that is discarded): so `local` is the tree of our newest checkpoint, which is the
  // service's newest, when the service still holds it; otherwise everything is fetched.
  const PartitionTree* local = nullptr;
  auto newest = own_checkpoints.rbegin();
  if (!service_diverged && newest->second.retained) local = &service.checkpoint_tree(newest->first);
  if (service_damaged && newest->second.retained) {
    repair_tree = service.checkpoint_tree(newest->first);
    for (std::uint64_t p : service.damaged_partitions()) {
      if (p < repair_tree->leaves()) repair_tree->set_leaf(p, Digest{});  // no partition's digest is zero
    }
    local = &*repair_tree;
  }
  fetch_bytes_at_start = fetcher.bytes_fetched();
  LOG_INFO(ctx(), "state transfer to checkpoint s%llu %s (local %s)", static_cast<unsigned long long>(s),
           d.short_hex().c_str(), local ? "diff" : "full");
  fetcher.start(s, d, local, service.partition_count());
}

void Replica::Impl::poll_fetcher() {
  for (Send& s : fetcher.take_sends()) cur->sends.push_back(std::move(s));
  if (std::optional<FetchedState> result = fetcher.take_result()) install_fetched_state(std::move(*result));
}

void Replica::Impl::install_fetched_state(FetchedState&& fs) {
  const std::uint64_t fetched = fetcher.bytes_fetched();
  stats.state_transfer_bytes += fetched >= fetch_bytes_at_start ? fetched - fetch_bytes_at_start : fetched;
  if (fs.seq <= last_committed && !service_diverged) {
    LOG_INFO(ctx(), "state transfer to s%llu no longer needed", static_cast<unsigned long long>(fs.seq));
    return;
  }
  // The fetcher checked every byte against the agreed digest, so the table comes from a correct replica; we
  // still validate it before touching the service (decoding never trusts bytes).
  ClientTable table(opt.client_window);
  if (!ClientTable::decode(fs.client_table, opt.client_window, table)) {
    LOG_WARN(ctx(), "fetched client table for s%llu does not decode; dropped", static_cast<unsigned long long>(fs.seq));
    stats.rejected_invalid++;
    return;
  }
  BFT_ASSERT(checkpoint_digest(fs.seq, fs.service_root, digest_of(fs.client_table)) == fs.checkpoint_digest);
  discard_open_batch();
  if (last_executed > last_committed && !service_diverged) rollback_to(last_committed);
  service.begin_install(fs.seq);
  for (const auto& [index, data] : fs.partitions) service.install_partition(index, data);
  const CheckpointId id = service.finish_install(fs.seq);
  if (id.seq != fs.seq || id.digest != fs.service_root) {
    // The service refused bytes that matched their digests (they describe no state it can hold): it keeps its
    // state, and so do we; a later checkpoint may be fetched instead.
    LOG_WARN(ctx(), "service rejected the state of checkpoint s%llu", static_cast<unsigned long long>(fs.seq));
    stats.rejected_invalid++;
    return;
  }
  clients = std::move(table);
  service_diverged = false;
  service_damaged = false;
  repair_tree.reset();
  last_executed = fs.seq;
  last_committed = fs.seq;
  last_executed_timestamp_ns = 0;
  // The StableRecord first: a crash may keep any prefix of records not yet durable, and the service's state is
  // already on disk. With the CheckpointRecord alone, recover() would pair that state with its client table and
  // find no log between the older stable checkpoint and it (a state transfer has no pre-prepares to replay);
  // with the StableRecord alone it finds no client table for the state and fetches it again, which is safe.
  persist(StableRecord{fs.seq, fs.checkpoint_digest});
  persist(CheckpointRecord{fs.seq, fs.checkpoint_digest, fs.client_table});
  own_checkpoints[fs.seq] = OwnCheckpoint{fs.checkpoint_digest, std::move(fs.client_table), true};
  add_claim(self, fs.seq, fs.checkpoint_digest);
  h = fs.seq;
  stable_digest = fs.checkpoint_digest;
  advance_window();
  broadcast(Checkpoint{fs.seq, fs.checkpoint_digest});
  // Requests the installed state already executed no longer wait.
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
  // A primary's `pending` named requests of batches up to fs.seq that it never executed itself; one that every
  // replica skipped there for per-client order is still fresh, and a stale entry would make the primary drop
  // its retransmissions forever (sim/FINDINGS.md F9).
  rebuild_pending();
  stats.state_transfers++;
  LOG_INFO(ctx(), "state transfer complete at s%llu", static_cast<unsigned long long>(fs.seq));
}

// ---------------------------------------------------------------------------------------------------------------
// View change (TOCS §4.5)
// ---------------------------------------------------------------------------------------------------------------

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
// there is to order, log and execute. Fixed timeouts sized for small requests fire on every batch of large
// writes on a busy machine, and each needless view change re-proposes (and re-sends) those megabytes again.
// A faulty primary gains at most the time the queued bytes would take at a conservative rate; the allowance is
// capped like the backoff.
std::uint64_t Replica::Impl::work_allowance_ticks() const {
  std::uint64_t bytes = queued_bytes;
  for (std::uint64_t s = last_committed + 1; s <= max_ordered_seq; s++) {
    const Entry* e = find(s);
    if (e != nullptr && e->batch) bytes += batch_op_bytes(*e->batch);
  }
  return std::min<std::uint64_t>(bytes / opt.timer_bytes_per_tick, opt.view_change_timeout_ticks_max);
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

void Replica::Impl::install_new_view(const NewView& nv, const NewViewDecision& decision,
                                     const std::map<std::uint64_t, std::shared_ptr<const Batch>>& bodies) {
  const std::uint64_t v = nv.view;
  BFT_ASSERT(v > view || (v == view && in_view_change));
  const std::uint64_t hs = decision.checkpoint_seq;
  // A replica may install a later view straight from normal operation (it never timed out itself); as the old
  // primary its open batch was never sent and goes now, before the rollback decision below.
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

  // Committed batches are final: the decision must re-propose exactly them (TOCS §4.5 safety argument).
  for (std::uint64_t s = std::max(h, hs) + 1; s <= last_committed && s <= hs + opt.log_window; s++) {
    const Entry* e = find(s);
    BFT_ASSERT(e != nullptr && e->committed);
    const NewViewChoice* c = decision.choice(s);
    BFT_ASSERT(c != nullptr);
    BFT_ASSERT(c->digest == e->digest);
  }

  // Tentatively executed batches that the new view does not re-propose identically are undone (TOCS §5.1.2).
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

  // The new view starts from checkpoint (h*, d*): ours if we have it, otherwise fetched.
  if (hs > h) {
    auto own = own_checkpoints.find(hs);
    if (own != own_checkpoints.end() && own->second.digest == decision.checkpoint_digest && last_committed >= hs) {
      make_stable(hs, decision.checkpoint_digest);
    } else if (hs > last_committed) {
      start_state_fetch(hs, decision.checkpoint_digest);
    } else {
      LOG_ERROR(ctx(), "new-view checkpoint s%llu differs from ours", static_cast<unsigned long long>(hs));
    }
  }

  // Fresh ordering state for the new view; only committed batches keep their digest outside the choices.
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

  if (primary_of(v) == self) {
    // The new primary continues after the last re-proposed seq.
    next_seq = std::max({h, hs, decision.max_seq(), last_committed}) + 1;
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
  forwarded.clear();
  vc_timer_ticks_left = 0;
  stats.new_views_installed++;
  LOG_INFO(ctx(), "new view installed primary=%u checkpoint=s%llu reproposed=%zu", primary_of(v),
           static_cast<unsigned long long>(hs), decision.choices.size());
  replay_future();
}

// ---------------------------------------------------------------------------------------------------------------
// Ticks
// ---------------------------------------------------------------------------------------------------------------

void Replica::Impl::on_tick() {
  ticks++;
  // The hold's bound when the driver does not end it sooner: the second tick after it began.
  if (batch_held && ++hold_ticks >= kBatchHoldTicksMax) end_batch_hold();
  if (!deferred_commits.empty() && ticks > commits_deferred_tick) flush_commits();  // no PRE-PREPARE came along
  release_quiet_on_timer();
  check_service_damage();  // damage found outside execution (serving a fetch of a corrupt partition)
  if (vc_timer_ticks_left > 0 && --vc_timer_ticks_left == 0) on_view_change_timeout();
  if (--status_ticks_left == 0) on_status_timeout();
  for (std::uint64_t s : std::vector<std::uint64_t>(fetching_seqs.begin(), fetching_seqs.end())) {
    Entry* e = find(s);
    if (e == nullptr || !e->fetching) {
      fetching_seqs.erase(s);
      continue;
    }
    if (--e->fetch_ticks_left == 0) send_fetch(*e);
  }
  if (pending_new_view && --pending_new_view->fetch_ticks_left == 0) {
    pending_new_view->fetch_ticks_left = fetch_retry_after(++pending_new_view->fetch_rounds);
    for (const auto& [s, d] : pending_new_view->missing) broadcast(FetchBatch{s, d});
  }
  fetcher.on_tick();
}

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

bool Replica::Impl::idle() const {
  return !in_view_change && !pending_new_view && !fetcher.active() && !service_diverged && fetching_seqs.empty() &&
         vc_timer_ticks_left == 0 && queued_count == 0 && read_only_queue.empty() && !open_batch &&
         max_ordered_seq <= last_committed && last_executed == last_committed && deferred_commits.empty();
}

// ---------------------------------------------------------------------------------------------------------------
// Recovery from the write-ahead log
// ---------------------------------------------------------------------------------------------------------------

void Replica::Impl::recover(const std::vector<PersistRecord>& log) {
  struct Rebuilt {
    std::map<Digest, std::shared_ptr<const Batch>> bodies;
    std::uint64_t pp_view = 0;
    bool has_pp = false;
    Digest pp_digest;
    std::optional<PreparedClaim> p;
    std::vector<PreparedClaim> q;
    bool committed = false;
    Digest committed_digest;
  };
  std::map<std::uint64_t, Rebuilt> rebuilt;
  std::map<std::uint64_t, std::pair<Digest, Bytes>> checkpoints;
  std::uint64_t rec_view = 0;
  bool rec_in_view_change = false;
  std::uint64_t rec_h = 0;
  Digest rec_stable_digest;
  bool has_stable = false;
  std::map<std::uint64_t, std::uint64_t> max_pp_seq_by_view;
  for (const PersistRecord& record : log) {
    std::visit(
        [&](const auto& r) {
          using T = std::decay_t<decltype(r)>;
          if constexpr (std::is_same_v<T, ViewRecord>) {
            rec_view = r.view;
            rec_in_view_change = r.in_view_change;
          } else if constexpr (std::is_same_v<T, PrePrepareRecord>) {
            Rebuilt& x = rebuilt[r.seq];
            auto body = std::make_shared<const Batch>(r.batch);
            const Digest d = body->digest();
            x.bodies[d] = body;
            if (!x.has_pp || r.view >= x.pp_view) {
              x.has_pp = true;
              x.pp_view = r.view;
              x.pp_digest = d;
            }
            bool merged = false;
            for (PreparedClaim& q : x.q) {
              if (q.digest == d) {
                q.view = std::max(q.view, r.view);
                merged = true;
              }
            }
            if (!merged) x.q.push_back(PreparedClaim{r.seq, d, r.view});
            auto& m = max_pp_seq_by_view[r.view];
            m = std::max(m, r.seq);
          } else if constexpr (std::is_same_v<T, PreparedRecord>) {
            Rebuilt& x = rebuilt[r.seq];
            if (!x.p || r.view >= x.p->view) x.p = PreparedClaim{r.seq, r.digest, r.view};
          } else if constexpr (std::is_same_v<T, CommittedRecord>) {
            Rebuilt& x = rebuilt[r.seq];
            x.committed = true;
            x.committed_digest = r.digest;
          } else if constexpr (std::is_same_v<T, CheckpointRecord>) {
            checkpoints[r.seq] = {r.digest, r.client_table};
          } else if constexpr (std::is_same_v<T, StableRecord>) {
            if (!has_stable || r.seq >= rec_h) {
              has_stable = true;
              rec_h = r.seq;
              rec_stable_digest = r.digest;
            }
          }
        },
        record);
  }

  // The service knows which state is on disk; pair it with the client table recorded at that seq.
  const CheckpointId sc = service.recovered_checkpoint();
  std::uint64_t base = sc.seq;
  own_checkpoints.clear();
  for (auto& c : claims) c.clear();
  clients = ClientTable(opt.client_window);
  if (sc.seq == 0 && checkpoints.count(0) == 0) {
    Bytes table = clients.encode();
    const Digest d = checkpoint_digest(0, sc.digest, digest_of(table));
    own_checkpoints[0] = OwnCheckpoint{d, std::move(table), true};  // as in the constructor
  } else if (auto it = checkpoints.find(sc.seq); it != checkpoints.end()) {
    ClientTable table(opt.client_window);
    const bool ok = ClientTable::decode(it->second.second, opt.client_window, table);
    const bool match = ok && checkpoint_digest(sc.seq, sc.digest, digest_of(it->second.second)) == it->second.first;
    if (match) {
      clients = std::move(table);
      own_checkpoints[sc.seq] = OwnCheckpoint{it->second.first, it->second.second, true};
    } else {
      LOG_ERROR(ctx(), "recovered service checkpoint s%llu does not match its record",
                static_cast<unsigned long long>(sc.seq));
      service_diverged = true;
    }
  } else {
    service_diverged = true;
  }
  if (service_diverged) {
    // The service state cannot be paired with a client table: start from the last recorded checkpoint as far
    // as the log is concerned and fetch a newer one before executing anything.
    diverged_service_seq = sc.seq;
    base = 0;
    for (const auto& [s, c] : checkpoints) {
      if (s <= sc.seq) base = s;
    }
    LOG_WARN(ctx(), "service checkpoint s%llu has no client table; waiting for state transfer",
             static_cast<unsigned long long>(sc.seq));
  }
  // Checkpoints the log recorded up to the base are claims we made (C in a view change); the service may no
  // longer hold their state, so they are not served. Those below h are dropped further down.
  for (const auto& [s, c] : checkpoints) {
    if (s <= base && own_checkpoints.count(s) == 0) own_checkpoints[s] = OwnCheckpoint{c.first, c.second, false};
  }
  h = std::min(has_stable ? rec_h : 0, base);
  if (own_checkpoints.count(h) == 0) {
    if (has_stable && h == rec_h) {
      own_checkpoints[h] = OwnCheckpoint{rec_stable_digest, {}, false};
    } else if (auto it = checkpoints.find(h); it != checkpoints.end()) {
      own_checkpoints[h] = OwnCheckpoint{it->second.first, it->second.second, false};
    } else {
      // h is the base (<= the recorded stable seq) without a record: only possible for h == 0.
      BFT_ASSERT(h == 0);
      Bytes table = ClientTable(opt.client_window).encode();
      own_checkpoints[0] = OwnCheckpoint{checkpoint_digest(0, sc.digest, digest_of(table)), std::move(table), false};
    }
  }
  stable_digest = own_checkpoints[h].digest;
  own_checkpoints.erase(own_checkpoints.begin(), own_checkpoints.lower_bound(h));
  for (const auto& [s, c] : own_checkpoints) claims[self][s] = c.digest;
  last_executed = base;
  last_committed = base;
  view = rec_view;
  in_view_change = rec_in_view_change;

  // The log above h.
  for (auto& e : ring) e = Entry{};
  for (auto& [s, x] : rebuilt) {
    if (!in_window(s)) continue;
    Entry& e = get_or_create(s);
    e.view = x.pp_view;
    if (x.committed) {
      auto b = x.bodies.find(x.committed_digest);
      e.has_digest = true;
      e.digest = x.committed_digest;
      e.committed = true;
      if (b != x.bodies.end()) e.batch = b->second;
      e.pre_prepared = e.batch != nullptr && x.has_pp && x.pp_digest == x.committed_digest;
    } else if (x.has_pp) {
      e.has_digest = true;
      e.digest = x.pp_digest;
      e.batch = x.bodies[x.pp_digest];
      e.pre_prepared = true;
    }
    for (const auto& [d, body] : x.bodies) {
      if (!e.batch || d != e.digest) e.alt_batch = body;
    }
    e.sent_prepare = e.pre_prepared && primary_of(e.view) != self;
    e.p = x.p;
    e.prepared = e.pre_prepared && x.p && x.p->view == e.view && x.p->digest == e.digest;
    e.sent_commit = e.prepared;
    std::sort(x.q.begin(), x.q.end(), [](const PreparedClaim& a, const PreparedClaim& b) { return a.view > b.view; });
    for (std::size_t i = 0; i < x.q.size() && i < 2; i++) e.q[e.q_count++] = x.q[i];
    if (e.view != view || in_view_change) reset_view_state(e, view, e.committed);
    // Our COMMIT in this view (backed by the synced PreparedRecord) still counts toward the certificate: peers
    // counted it, and without it a batch whose other commits are all we get could never commit here.
    if (e.prepared) record_vote(e, self, e.digest, true);
    if (e.has_digest) max_ordered_seq = std::max(max_ordered_seq, s);
    if (x.p) reads_wait_for_seq = std::max(reads_wait_for_seq, s);
    if (e.batch) last_timestamp_ns = std::max(last_timestamp_ns, e.batch->timestamp_ns);
    if (e.has_digest && !e.batch && e.view == view && !in_view_change) start_fetch(e);
  }

  // Re-execute the committed batches above the service's checkpoint, in order, without replies (clients that
  // missed them retransmit and get the cached reply).
  if (!service_diverged) {
    replaying = true;
    run_execution();
    replaying = false;
  }
  // A restarted primary never reuses a seq it pre-prepared in its view.
  next_seq = std::max(last_committed, h) + 1;
  if (auto it = max_pp_seq_by_view.find(view); it != max_pp_seq_by_view.end()) {
    next_seq = std::max(next_seq, it->second + 1);
  }
  next_seq_floor = next_seq;
  if (in_view_change) {
    ViewChange vc = build_view_change();
    vc.signature = crypto.sign(view_change_signing_bytes(vc));
    view_changes[self] = vc;
    broadcast(std::move(vc));
  } else if (log.empty()) {
    // A first start. The synced ViewRecord marks this data directory as having run, so that a later restart
    // can never mistake "every record was lost" for "never voted" (the next branch depends on it).
    persist(ViewRecord{view, false});
  } else if (primary_of(view) == self) {
    // effects.h: PrePrepareRecords are not synced before the PRE-PREPARE they back, so a restarted primary may
    // have assigned sequence numbers it no longer remembers; it must never pre-prepare in this view again, so
    // it leaves the view now (the backups follow once their timers expire, or at once with f+1 VIEW-CHANGEs).
    start_view_change(view + 1);
  } else {
    // A backup may likewise have sent PREPAREs it no longer remembers: it stays in the view but sends no
    // PREPARE in it (prepare_silenced), and rejoins fully at the next view.
    prepare_silenced = true;
    silenced_view = view;
  }
  LOG_INFO(ctx(), "recovered: stable s%llu, committed s%llu, %zu log entries%s", static_cast<unsigned long long>(h),
           static_cast<unsigned long long>(last_committed), rebuilt.size(), in_view_change ? ", in view change" : "");
  broadcast(Status{view, in_view_change, h, last_executed, last_committed});
}

// ---------------------------------------------------------------------------------------------------------------
// Invariants (house style: checked after every step)
// ---------------------------------------------------------------------------------------------------------------

void Replica::Impl::check_invariants_fast() const {
  const std::uint64_t L = opt.log_window;
  const std::uint64_t K = opt.checkpoint_interval;
  // Batch hold: only a primary in normal operation waits, only for clients it answered, and only with requests.
  BFT_ASSERT(returning.empty() || (opt.batch_hold && !opt.early_replies && is_primary()));
  BFT_ASSERT(!batch_held || (!returning.empty() && !hold_ended && queued_count > 0));
  BFT_ASSERT(h % K == 0);
  BFT_ASSERT(h <= last_committed);
  BFT_ASSERT(last_committed <= last_executed);
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

// ---------------------------------------------------------------------------------------------------------------
// Public interface
// ---------------------------------------------------------------------------------------------------------------

Replica::Replica(const ReplicaOptions& options, NodeId self, Service& service, const Crypto& crypto,
                 std::uint64_t prng_seed)
    : impl_(std::make_unique<Impl>(options, self, service, crypto, prng_seed)) {}

Replica::~Replica() = default;

void Replica::recover(const std::vector<PersistRecord>& log) {
  impl_->begin_call();
  impl_->recover(log);
  impl_->end_call();
}

void Replica::on_message(NodeId from, const Message& message) {
  impl_->begin_call();
  impl_->dispatch(from, message);
  impl_->end_call();
}

void Replica::on_tick() {
  impl_->begin_call();
  impl_->on_tick();
  impl_->end_call();
}

bool Replica::batch_held() const { return impl_->batch_held; }

void Replica::end_batch_hold() {
  impl_->begin_call();
  impl_->end_batch_hold();
  impl_->end_call();
}

void Replica::set_wall_clock_ns(std::uint64_t now_ns) { impl_->wall_clock_ns = now_ns; }

Effects Replica::take_effects() {
  Effects e = std::move(impl_->out);
  impl_->out.clear();
  return e;
}

void Replica::check_invariants() const {
  impl_->check_invariants();
  impl_->clients.check_invariants();
}

NodeId Replica::id() const { return impl_->self; }
std::uint64_t Replica::view() const { return impl_->view; }
bool Replica::in_view_change() const { return impl_->in_view_change; }
bool Replica::is_primary() const { return impl_->is_primary(); }
std::uint64_t Replica::last_executed() const { return impl_->last_executed; }
std::uint64_t Replica::last_committed() const { return impl_->last_committed; }
std::uint64_t Replica::stable_checkpoint() const { return impl_->h; }
bool Replica::idle() const { return impl_->idle(); }
const ReplicaStats& Replica::stats() const { return impl_->stats; }
const std::vector<ExecutedBatch>& Replica::committed_history() const { return impl_->history; }
void Replica::trim_history() { impl_->history.clear(); }
void Replica::set_effects_filter(EffectsFilter filter) { impl_->filter = std::move(filter); }

}  // namespace bftfs
