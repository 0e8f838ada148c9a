// The primary: batching and PRE-PREPARE (TOCS §2.3, §5.1.4), the per-client order rule at ordering, the batch
// hold, and the agreed timestamp. Early execution (PBFT-CS) is in replica_early_execution.cc. See
// replica_impl.h for the map of the replica's files.
#include <algorithm>

#include "common/assert.h"
#include "protocol/replica_impl.h"

namespace bftfs {

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

// The request of the next ticket (the ticket's client's lowest queued id that ready_to_order allows: each client's
// requests are ordered in the order it issued them), removed from the queue, with `size` its share of a batch. Nothing
// when a ticket's request would take a non-empty batch of `batch_bytes` past kBatchBytesMax (it stays queued). Tickets
// whose client has nothing queued any more are dropped on the way; nothing when no ticket is left.
std::optional<Replica::Impl::QueuedRequest> Replica::Impl::pop_ticket(std::size_t batch_bytes, bool batch_empty,
                                                                      std::size_t& size) {
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
  e.ordered_tick = ticks;
  max_ordered_seq = std::max(max_ordered_seq, s);
  attach_body(e, body);  // persists the PrePrepareRecord first: a restarted primary never reuses s
  broadcast(PrePrepare{view, s, *body});
  return e;
}

}  // namespace bftfs
