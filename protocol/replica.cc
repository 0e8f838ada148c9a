// The replica's entry points: construction, call framing (every public call runs begin_call(); handler;
// end_call()), dispatch of messages and ticks, and the public interface of protocol/replica.h. The state and the
// map of the other parts are in replica_impl.h.
#include "protocol/replica.h"

#include <deque>
#include <utility>
#include <vector>

#include "common/assert.h"
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
// Dispatch of messages, and messages for a view not entered yet
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

// Replica::idle() (replica.h): nothing queued, ordered, fetched or awaited, and no timer running.
bool Replica::Impl::idle() const {
  return !in_view_change && !pending_new_view && !fetcher.active() && !service_diverged && fetching_seqs.empty() &&
         vc_timer_ticks_left == 0 && queued_count == 0 && read_only_queue.empty() && !open_batch &&
         max_ordered_seq <= last_committed && last_executed == last_committed && deferred_commits.empty();
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
