// PBFT-CS early execution (Wester et al., NSDI'09 §3.1): "the primary in PBFT-CS executes an operation
// immediately upon receiving a request and sends the early reply to the client as a speculative response. The
// primary then forms a pre-prepare message for the next batch of requests". Executing at receipt, not when the
// batch goes out, is what lets a speculating client pipeline: with batching, a request that arrives while a
// batch is in flight would otherwise wait for that batch to commit before the client hears anything.
//
// The executions land in the open batch at seq next_seq - 1 (reserved when it opens); the batch goes out as the
// next PRE-PREPARE, with its requests in execution order, when the batch window allows, exactly as a batch of
// queued requests would. Until then nothing about it is in the log: a crash, view change or state transfer
// simply undoes it (discard_open_batch) and its requests wait in the queue again. See replica_impl.h for the
// map of the replica's files.
#include "common/assert.h"
#include "common/log.h"
#include "protocol/replica_impl.h"

namespace bftfs {

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

}  // namespace bftfs
