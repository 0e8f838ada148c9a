// The in-process cluster driver (cluster.h).
#include "sim/cluster.h"

#include <map>

#include "common/assert.h"
#include "protocol/wire.h"
#include "sim/describe.h"
#include "sim/mix.h"
#include "sim/strfmt.h"

namespace bftfs::sim {

static_assert(kRejectReasons > static_cast<std::size_t>(Reject::kNone));

void PromiseIndex::add(const PersistRecord& rec) {
  if (const auto* r = std::get_if<PrePrepareRecord>(&rec)) pre_prepared.emplace(r->view, r->seq, r->batch.digest());
  if (const auto* r = std::get_if<PreparedRecord>(&rec)) prepared.emplace(r->view, r->seq, r->digest);
  if (const auto* r = std::get_if<CheckpointRecord>(&rec)) checkpoints.emplace(r->seq, r->digest);
  if (const auto* r = std::get_if<ViewRecord>(&rec)) {
    if (r->in_view_change) view_changes.insert(r->view);
  }
}

std::string PromiseIndex::missing_for(NodeId self, const Send& send) const {
  const Message& m = send.message;
  if (const auto* x = std::get_if<PrePrepare>(&m)) {
    if (pre_prepared.count({x->view, x->seq, x->batch.digest()}) == 0) return "no PrePrepareRecord";
  } else if (const auto* x = std::get_if<Prepare>(&m)) {
    if (pre_prepared.count({x->view, x->seq, x->digest}) == 0) return "no PrePrepareRecord";
  } else if (const auto* x = std::get_if<Commit>(&m)) {
    if (prepared.count({x->view, x->seq, x->digest}) == 0) return "no PreparedRecord";
  } else if (const auto* x = std::get_if<Checkpoint>(&m)) {
    if (checkpoints.count({x->seq, x->state_digest}) == 0) return "no CheckpointRecord";
  } else if (const auto* x = std::get_if<ViewChange>(&m)) {
    if (x->replica == self && view_changes.count(x->new_view) == 0) return "no ViewRecord{in_view_change}";
  }
  return "";
}

void add_stats(ReplicaStats& into, const ReplicaStats& s) {
  into.requests_executed += s.requests_executed;
  into.batches_committed += s.batches_committed;
  into.read_only_executed += s.read_only_executed;
  into.view_changes_started += s.view_changes_started;
  into.view_changes_deferred_lagging += s.view_changes_deferred_lagging;
  into.new_views_installed += s.new_views_installed;
  into.state_transfers += s.state_transfers;
  into.state_transfer_bytes += s.state_transfer_bytes;
  into.recovered_checkpoints_adopted += s.recovered_checkpoints_adopted;
  into.service_damaged += s.service_damaged;
  into.rollbacks += s.rollbacks;
  into.early_replies += s.early_replies;
  into.open_batches_discarded += s.open_batches_discarded;
  into.quiet_batches += s.quiet_batches;
  into.quiet_releases += s.quiet_releases;
  into.requests_deferred_order += s.requests_deferred_order;
  into.rejected_bad_authenticator += s.rejected_bad_authenticator;
  into.rejected_bad_signature += s.rejected_bad_signature;
  into.rejected_out_of_window += s.rejected_out_of_window;
  into.rejected_wrong_view += s.rejected_wrong_view;
  into.rejected_conflict += s.rejected_conflict;
  into.rejected_invalid += s.rejected_invalid;
  into.fetches_refused_repeat += s.fetches_refused_repeat;
}

Cluster::Cluster(ClusterOptions options, ClusterObserver* observer)
    : options_(std::move(options)), observer_(observer), n_(options_.replica.n) {
  BFT_ASSERT(n_ >= 3 * options_.replica.f + 1);
  BFT_ASSERT(options_.factory != nullptr);
  if (!options_.replica_seed) {
    const std::uint64_t base = options_.key_seed;
    options_.replica_seed = [base](NodeId id, std::uint64_t) { return base + id; };
  }
  const std::uint32_t count = nodes();
  std::map<NodeId, PublicKeys> pubs;
  std::vector<SecretKeys> secs(count);
  for (NodeId id = 0; id < count; ++id) generate_keys_from_seed(options_.key_seed, id, pubs[id], secs[id]);
  for (NodeId id = 0; id < n_; ++id) {
    auto r = std::make_unique<ReplicaHost>();
    r->id = id;
    r->crypto = std::make_unique<Crypto>(id, secs[id], pubs);
    replicas_.push_back(std::move(r));
  }
  for (NodeId id = n_; id < count; ++id) {
    auto c = std::make_unique<ClientHost>();
    c->id = id;
    c->crypto = std::make_unique<Crypto>(id, secs[id], pubs);
    clients_.push_back(std::move(c));
  }
  if (options_.delivery == Delivery::kNetwork) {
    BFT_ASSERT(options_.network_prng != nullptr);
    net_ = std::make_unique<Network>(count, options_.network, *options_.network_prng);
  }
}

// Cores go before the services and keys they refer to.
Cluster::~Cluster() {
  for (auto& r : replicas_) {
    r->replica.reset();
    r->stack.reset();
  }
}

std::vector<NodeId> Cluster::client_ids() const {
  std::vector<NodeId> ids;
  for (const auto& c : clients_) ids.push_back(c->id);
  return ids;
}

Replica& Cluster::replica(NodeId id) {
  ReplicaHost& r = host(id);
  BFT_ASSERT(r.up);
  return *r.replica;
}

const Crypto& Cluster::crypto(NodeId node) const {
  return node < n_ ? *replicas_.at(node)->crypto : *clients_.at(node - n_)->crypto;
}

void Cluster::set_byzantine(NodeId id, std::unique_ptr<Byzantine> byz) {
  BFT_ASSERT(options_.delivery == Delivery::kNetwork);
  BFT_ASSERT(host(id).incarnation == 0);
  host(id).byz = std::move(byz);
}

ReplicaStats Cluster::replica_stats(NodeId id) const {
  const ReplicaHost& r = host(id);
  ReplicaStats total = r.past;
  if (r.up) add_stats(total, r.replica->stats());
  return total;
}

void Cluster::fail(const std::string& what) const { throw Violation{what}; }

// ---- lifecycle ----

void Cluster::start(NodeId id, bool recovering) {
  ReplicaHost& r = host(id);
  BFT_ASSERT(!r.up);
  ++r.incarnation;
  if (net_) net_->kill(r.id);  // nothing sent to it while it was down arrives at the new incarnation
  r.stack = options_.factory(r.id, r.store);
  r.replica = std::make_unique<Replica>(options_.replica, r.id, r.stack->top(), *r.crypto,
                                        options_.replica_seed(r.id, r.incarnation));
  if (options_.start_wall_clock_ns) r.replica->set_wall_clock_ns(*options_.start_wall_clock_ns);
  if (r.byz) {
    Byzantine* b = r.byz.get();
    r.replica->set_effects_filter([b](Effects& e) { b->filter(e); });
  }
  r.up = true;
  r.armed = false;
  if (!recovering && options_.first_start_record) {
    // Recorded as durable without a step: the runtime's recover() on the empty log persists it before the
    // replica sends anything that needs the view.
    BFT_ASSERT(r.log.empty());
    append_record(r, ViewRecord{0, false});
    r.synced = r.log.size();
  }
  if (recovering) {
    if (traces()) event(fmt("restart r%u incarnation %llu log=%zu records", r.id, ull(r.incarnation), r.log.size()));
    ++step_;
    r.replica->recover(r.log);
    drain(r);
    after_step(r);
  }
}

void Cluster::start_all() {
  for (NodeId id = 0; id < n_; ++id) start(id, false);
}

void Cluster::crash(NodeId id, const std::string& how, bool lose_all_unsynced) {
  ReplicaHost& r = host(id);
  BFT_ASSERT(r.up);
  if (observer_ != nullptr) observer_->on_crashing(r);
  add_stats(r.past, r.replica->stats());
  // The core first (it refers to the services), then the services; the store and the log stay.
  r.replica.reset();
  r.stack.reset();
  r.up = false;
  r.armed = false;
  stats_.held_sends_lost += r.held.size();
  r.held.clear();  // never sent: the sync they waited for did not complete
  r.must_pos = 0;
  r.view_pos = 0;
  // Records never covered by a sync may be lost, any suffix of them (effects.h: pre-prepare and committed
  // records are appended without a sync, even though the messages they accompany may have left).
  if (options_.fault_prng != nullptr && r.log.size() > r.synced) {
    const std::size_t keep =
        lose_all_unsynced ? r.synced : r.synced + options_.fault_prng->below(r.log.size() - r.synced + 1);
    if (keep < r.log.size()) {
      ++stats_.unsynced_records_lost;
      r.log.resize(keep);
    }
  }
  r.synced = r.log.size();
  r.promises = PromiseIndex{};
  for (const auto& rec : r.log) r.promises.add(rec);
  if (net_) net_->kill(r.id);
  ++stats_.crashes;
  if (observer_ != nullptr) observer_->on_crashed(r, how);
}

void Cluster::arm_crash(NodeId id, std::uint64_t deadline) {
  BFT_ASSERT(options_.fault_prng != nullptr);
  ReplicaHost& r = host(id);
  BFT_ASSERT(r.up);
  r.armed = true;
  r.armed_deadline = deadline;
}

// ---- effects ----

void Cluster::append_record(ReplicaHost& r, const PersistRecord& rec) {
  r.log.push_back(rec);
  r.promises.add(rec);
  if (observer_ != nullptr) observer_->on_record(r, rec);
}

void Cluster::send_checked(ReplicaHost& r, const Send& send) {
  if (r.correct()) {
    if (const std::string missing = r.promises.missing_for(r.id, send); !missing.empty()) {
      fail(fmt("durable before sent: replica %u sent %s to %u with %s behind it", r.id,
               describe(send.message).c_str(), send.to, missing.c_str()));
    }
  }
  route(r.id, send);
}

// An armed replica crashes after the records reached the disk and before any send left: the promises were
// never made. Sometimes the tail of this write is lost too (a torn write), which is also before any send.
void Cluster::drain_armed(ReplicaHost& r, Effects& e) {
  std::size_t keep = e.persist.size();
  if (options_.fault_prng->chance(1, 3)) keep = options_.fault_prng->below(e.persist.size() + 1);
  for (std::size_t i = 0; i < keep; ++i) append_record(r, e.persist[i]);
  ++stats_.crashes_between_persist_and_send;
  if (keep < e.persist.size()) ++stats_.torn_persists;
  crash(r.id, fmt("after persisting %zu of %zu records, before %zu sends", keep, e.persist.size(), e.sends.size()));
}

void Cluster::drain(ReplicaHost& r) {
  Effects e = r.replica->take_effects();
  if (e.empty()) return;
  if (r.armed && !e.persist.empty()) {
    drain_armed(r, e);
    return;
  }
  bool must_sync = false;
  for (const auto& rec : e.persist) {
    append_record(r, rec);
    must_sync = must_sync || record_must_sync(rec);
    if (record_must_sync(rec)) r.must_pos = r.log.size();
    if (std::holds_alternative<ViewRecord>(rec)) r.view_pos = r.log.size();
  }
  if (!options_.async_sync) {
    if (must_sync) r.synced = r.log.size();
    for (const auto& s : e.sends) send_checked(r, s);
    return;
  }
  for (auto& s : e.sends) {
    const std::size_t need = send_waits_for_log(s) ? r.must_pos : r.view_pos;
    if (need <= r.synced) {
      // A send that does not wait may overtake held ones, as in the runtime (a waiting one never does: must_pos
      // only grows, and an unsynced ViewRecord is itself a must-sync record).
      send_checked(r, s);
    } else {
      ++stats_.sends_held_for_sync;
      r.held.emplace_back(need, std::move(s));
    }
  }
}

void Cluster::complete_sync(NodeId id) {
  ReplicaHost& r = host(id);
  r.synced = r.log.size();
  std::vector<std::pair<std::size_t, Send>> held = std::move(r.held);
  r.held.clear();
  for (auto& [need, s] : held) {
    BFT_ASSERT(need <= r.synced);
    send_checked(r, s);
  }
}

void Cluster::after_step(ReplicaHost& r) {
  if (!r.up) return;  // crashed while draining: its pre-crash steps were checked already
  r.replica->check_invariants();
  if (observer_ != nullptr) observer_->after_replica_step(r);
}

// ---- steps ----

void Cluster::route(NodeId from, const Send& send) {
  Byzantine* byz = from < n_ ? host(from).byz.get() : nullptr;
  if (send.to != kAllReplicas && (send.to == from || send.to >= nodes())) {
    if (byz == nullptr) fail(fmt("node %u sent %s to node %u", from, describe(send.message).c_str(), send.to));
    return;
  }
  if (!net_) {
    if (send.to != kAllReplicas) {
      queue_.push_back(Envelope{from, send.to, send.message});
      return;
    }
    for (NodeId to = 0; to < n_; ++to) {
      if (to != from) queue_.push_back(Envelope{from, to, send.message});
    }
    return;
  }
  const Crypto& c = crypto(from);
  auto put = [&](NodeId to, Bytes frame) {
    if (byz != nullptr) byz->mangle(frame);
    net_->send(from, to, std::move(frame), now_);
  };
  if (send.to != kAllReplicas) {
    put(send.to, encode_frame(send.message, from, send.to, c));
    return;
  }
  const Bytes unsealed = encode_unsealed(send.message, from);
  for (NodeId to = 0; to < n_; ++to) {
    if (to != from) put(to, seal_for(unsealed, to, c));
  }
}

void Cluster::tick_replica(NodeId id) {
  ReplicaHost& r = host(id);
  ++step_;
  if (options_.wall_clock_from_ticks) r.replica->set_wall_clock_ns(now_ * 1'000'000 + r.clock_skew_ns);
  r.replica->on_tick();
  drain(r);
  after_step(r);
}

void Cluster::end_batch_hold(NodeId id) {
  ReplicaHost& r = host(id);
  ++step_;
  r.replica->end_batch_hold();
  drain(r);
  after_step(r);
}

void Cluster::byzantine_tick() {
  for (auto& r : replicas_) {
    if (!r->up || !r->byz) continue;
    for (auto& inj : r->byz->on_tick(r->replica->view(), r->replica->stable_checkpoint())) {
      if (inj.to == r->id || inj.to >= nodes()) continue;
      net_->send(r->id, inj.to, std::move(inj.frame), now_);
    }
  }
}

void Cluster::deliver_due() {
  Packet p;
  while (net_->pop_due(now_, p)) deliver_frame(p);
}

void Cluster::deliver_frame(Packet& p) {
  ++step_;
  const bool to_replica = p.to < n_;
  const Decoded d = decode_frame(p.frame, n_, crypto(p.to));
  fingerprint_ = mix(fingerprint_, (now_ << 16) ^ (std::uint64_t{p.from} << 8) ^ p.to);
  if (p.frame.size() >= kMacBytes) {
    std::uint64_t tail = 0;
    for (std::size_t i = 0; i < 8; ++i) tail = (tail << 8) | p.frame[p.frame.size() - 1 - i];
    fingerprint_ = mix(fingerprint_, tail);
  }
  if (!d.ok()) {
    ++stats_.frames_rejected;
    const auto reason = static_cast<std::size_t>(d.reject);
    ++stats_.rejected_by_reason[reason < kRejectReasons ? reason : kRejectReasons - 1];
    if (traces()) {
      event(fmt("reject %u->%u %zuB: %s", p.from, p.to, p.frame.size(), std::string(to_string(d.reject)).c_str()));
    }
    return;
  }
  if (to_replica && !host(p.to).up) {
    // Sent while the replica was down (to its next incarnation): the process is not there to receive it.
    if (traces()) event(fmt("drop %u->%u %s: replica down", d.sender, p.to, describe(d.message).c_str()));
    return;
  }
  if (traces()) event(fmt("deliver %u->%u %s", d.sender, p.to, describe(d.message).c_str()));
  if (to_replica) {
    deliver_to_replica(host(p.to), d.sender, d.message);
  } else {
    deliver_to_client(client(p.to), d.sender, d.message);
  }
}

void Cluster::deliver_to_replica(ReplicaHost& r, NodeId from, const Message& m) {
  if (r.byz) {
    r.byz->observe(from, m);
    std::vector<Byzantine::Injection> injected;
    const bool admitted = r.byz->admit(from, m, r.replica->view(), r.replica->is_primary(), injected);
    for (auto& inj : injected) {
      if (traces()) event(fmt("r%u injects a fake early reply to %u", r.id, inj.to));
      net_->send(r.id, inj.to, std::move(inj.frame), now_);
    }
    if (!admitted) {
      if (traces()) event(fmt("r%u swallows %s", r.id, describe(m).c_str()));
      return;
    }
  }
  r.replica->on_message(from, m);
  drain(r);
  after_step(r);
}

void Cluster::deliver_to_client(ClientHost& c, NodeId from, const Message& m) {
  if (c.receive) {
    c.receive(from, m);
    return;
  }
  if (const auto* rep = std::get_if<Reply>(&m)) c.inbox.emplace_back(from, *rep);
}

// ---- kFifo ----

void Cluster::fifo_step() {
  Envelope env = std::move(queue_.front());
  queue_.pop_front();
  if (drop && drop(env)) return;
  if (env.to >= n_) {
    deliver_to_client(client(env.to), env.from, env.message);
    return;
  }
  ReplicaHost& r = host(env.to);
  if (!r.up) return;
  ++step_;
  delivered_.push_back(env);
  deliver_to_replica(r, env.from, env.message);
}

void Cluster::run(std::size_t max_steps) {
  BFT_ASSERT(!net_);
  while (!queue_.empty() && max_steps-- > 0) fifo_step();
  if (!queue_.empty()) fail(fmt("the queue did not drain: %zu packets left", queue_.size()));
}

void Cluster::tick(std::uint64_t ticks) {
  for (std::uint64_t t = 0; t < ticks; ++t) {
    for (NodeId i = 0; i < n_; ++i) {
      if (host(i).up) tick_replica(i);
    }
    run();
    advance();
  }
}

bool Cluster::tick_until(const std::function<bool()>& done, std::uint64_t max_ticks) {
  for (std::uint64_t t = 0; t < max_ticks; ++t) {
    if (done()) return true;
    tick();
  }
  return done();
}

std::size_t Cluster::count_delivered(const std::function<bool(const Envelope&)>& pred) const {
  std::size_t count = 0;
  for (const auto& e : delivered_) count += pred(e) ? 1 : 0;
  return count;
}

// ---- scripted clients ----

Request Cluster::make_request(NodeId client, std::uint64_t id, Bytes op, bool read_only, NodeId replier) const {
  Request req;
  req.client = client;
  req.request_id = id;
  req.flags = read_only ? kRequestReadOnly : 0;
  req.replier = replier;
  req.op = std::move(op);
  const Digest d = req.digest();
  for (NodeId i = 0; i < n_; ++i) req.authenticator.push_back(crypto(client).mac(i, d.bytes));
  return req;
}

void Cluster::send_all(const Request& req) {
  for (NodeId i = 0; i < n_; ++i) send(req, i);
}

std::optional<Bytes> Cluster::accepted(NodeId client_id, std::uint64_t request_id) {
  std::map<Digest, std::map<NodeId, bool>> weak_by_digest;  // digest -> sender -> only weak replies so far
  std::map<Digest, Bytes> full;
  for (const auto& [from, rep] : client(client_id).inbox) {
    if (rep.request_id != request_id) continue;
    if ((rep.flags & kReplyHasResult) != 0) {
      if (digest_of(rep.result) != rep.result_digest) {
        fail(fmt("client %u got a reply from %u to request %llu whose result does not match its digest", client_id,
                 from, ull(request_id)));
      }
      full[rep.result_digest] = rep.result;
    }
    if ((rep.flags & kReplySpeculative) != 0) continue;
    const bool weak = (rep.flags & (kReplyTentative | kReplyReadOnly)) != 0;
    auto& senders = weak_by_digest[rep.result_digest];
    auto it = senders.find(from);
    senders[from] = it == senders.end() ? weak : (it->second && weak);
  }
  for (const auto& [d, senders] : weak_by_digest) {
    std::size_t strong = 0;
    for (const auto& [from, weak] : senders) strong += weak ? 0 : 1;
    if ((strong >= f() + 1 || senders.size() >= 2 * f() + 1) && full.count(d) != 0) return full[d];
  }
  return std::nullopt;
}

std::optional<Bytes> Cluster::order(NodeId client_id, std::uint64_t request_id, Bytes op, std::uint64_t max_ticks) {
  send_all(make_request(client_id, request_id, std::move(op)));
  run();
  std::optional<Bytes> result;
  if (!tick_until([&] { return (result = accepted(client_id, request_id)).has_value(); }, max_ticks)) {
    return std::nullopt;
  }
  return result;
}

}  // namespace bftfs::sim
