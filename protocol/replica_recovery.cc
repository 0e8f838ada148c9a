// Recovery from the write-ahead log: the replica rebuilds its view, checkpoints and log from the records it
// persisted (effects.h), pairs the service's durable state with its client table, re-executes what committed
// above it, and rejoins so that it never contradicts a vote it may have sent before the crash. See
// replica_impl.h for the map of the replica's files.
#include <algorithm>

#include "common/assert.h"
#include "common/log.h"
#include "protocol/replica_impl.h"

namespace bftfs {

// What the write-ahead log says, folded record by record in log order (read_log): later records of a kind
// supersede earlier ones where the replica's state only moves forward.
struct Replica::Impl::RecoveredLog {
  // What the records say about one seq.
  struct Seq {
    std::map<Digest, std::shared_ptr<const Batch>> bodies;  // every body pre-prepared at the seq
    std::uint64_t pp_view = 0;  // the pre-prepare of the highest view
    bool has_pp = false;
    Digest pp_digest;
    std::optional<PreparedClaim> p;  // the prepared claim of the highest view
    std::vector<PreparedClaim> q;    // one per pre-prepared digest, with its highest view
    bool committed = false;
    Digest committed_digest;
  };
  std::map<std::uint64_t, Seq> seqs;
  std::map<std::uint64_t, std::pair<Digest, Bytes>> checkpoints;  // CheckpointRecord: digest, client table
  std::uint64_t view = 0;  // the last ViewRecord
  bool in_view_change = false;
  bool has_stable = false;  // the highest StableRecord
  std::uint64_t stable_seq = 0;
  Digest stable_digest;
  std::map<std::uint64_t, std::uint64_t> max_pp_seq_by_view;  // the highest pre-prepared seq of each view
};

void Replica::Impl::recover(const std::vector<PersistRecord>& log) {
  RecoveredLog rl = read_log(log);
  // The service knows which state is on disk; pair it with the client table recorded at that seq.
  const CheckpointId sc = service.recovered_checkpoint();
  const std::uint64_t base = pair_service_state(rl, sc);
  restore_stable_checkpoint(rl, sc, base);
  last_executed = base;
  last_committed = base;
  view = rl.view;
  in_view_change = rl.in_view_change;
  rebuild_log(rl);
  // Re-execute the committed batches above the service's checkpoint, in order, without replies (clients that
  // missed them retransmit and get the cached reply).
  if (!service_diverged) {
    replaying = true;
    run_execution();
    replaying = false;
  }
  rejoin(rl, log.empty());
  LOG_INFO(ctx(), "recovered: stable s%llu, committed s%llu, %zu log entries%s", static_cast<unsigned long long>(h),
           static_cast<unsigned long long>(last_committed), rl.seqs.size(), in_view_change ? ", in view change" : "");
  broadcast(Status{view, in_view_change, h, last_executed, last_committed});
}

Replica::Impl::RecoveredLog Replica::Impl::read_log(const std::vector<PersistRecord>& log) {
  RecoveredLog rl;
  for (const PersistRecord& record : log) {
    std::visit(
        [&](const auto& r) {
          using T = std::decay_t<decltype(r)>;
          if constexpr (std::is_same_v<T, ViewRecord>) {
            rl.view = r.view;
            rl.in_view_change = r.in_view_change;
          } else if constexpr (std::is_same_v<T, PrePrepareRecord>) {
            RecoveredLog::Seq& x = rl.seqs[r.seq];
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
            auto& m = rl.max_pp_seq_by_view[r.view];
            m = std::max(m, r.seq);
          } else if constexpr (std::is_same_v<T, PreparedRecord>) {
            RecoveredLog::Seq& x = rl.seqs[r.seq];
            if (!x.p || r.view >= x.p->view) x.p = PreparedClaim{r.seq, r.digest, r.view};
          } else if constexpr (std::is_same_v<T, CommittedRecord>) {
            RecoveredLog::Seq& x = rl.seqs[r.seq];
            x.committed = true;
            x.committed_digest = r.digest;
          } else if constexpr (std::is_same_v<T, CheckpointRecord>) {
            rl.checkpoints[r.seq] = {r.digest, r.client_table};
          } else if constexpr (std::is_same_v<T, StableRecord>) {
            if (!rl.has_stable || r.seq >= rl.stable_seq) {
              rl.has_stable = true;
              rl.stable_seq = r.seq;
              rl.stable_digest = r.digest;
            }
          }
        },
        record);
  }
  return rl;
}

// Pairs the service's durable checkpoint `sc` with its client table and returns the seq execution restarts
// from. The table is the one the service stored with its checkpoint (Service::recovered_engine_state), or,
// for a store written before services kept it, the one of the CheckpointRecord at sc.seq. Without a table
// (an old store whose log lost the record) the replica waits for a state transfer (diverge_at_recovery).
std::uint64_t Replica::Impl::pair_service_state(const RecoveredLog& rl, const CheckpointId& sc) {
  own_checkpoints.clear();
  for (auto& c : claims) c.clear();
  clients = ClientTable(opt.client_window);
  recovered_pending.reset();
  const Bytes stored = service.recovered_engine_state();
  const auto record = rl.checkpoints.find(sc.seq);
  if (!stored.empty()) return pair_with_table(rl, sc, stored);
  if (record != rl.checkpoints.end()) return pair_with_table(rl, sc, record->second.second);
  if (sc.seq == 0) {
    Bytes table = clients.encode();
    const Digest d = checkpoint_digest(0, sc.digest, digest_of(table));
    own_checkpoints[0] = OwnCheckpoint{d, std::move(table), true};  // as in the constructor
    return 0;
  }
  LOG_WARN(ctx(), "service checkpoint s%llu has no client table; waiting for state transfer",
           static_cast<unsigned long long>(sc.seq));
  return diverge_at_recovery(rl, sc);
}

// `table` is the client table at sc.seq. When the log holds every batch committed between the recorded stable
// checkpoint and sc.seq (always, if its CheckpointRecord was written after them), execution resumes at sc.seq.
// Otherwise (the crash came after Service::checkpoint but before the log's tail was synced) the state waits to
// become stable (recovered_pending), since the log cannot back an h below it with a complete committed prefix.
std::uint64_t Replica::Impl::pair_with_table(const RecoveredLog& rl, const CheckpointId& sc, const Bytes& table) {
  ClientTable decoded(opt.client_window);
  const Digest d = checkpoint_digest(sc.seq, sc.digest, digest_of(table));
  const auto record = rl.checkpoints.find(sc.seq);
  const bool has_record = record != rl.checkpoints.end();
  if (!ClientTable::decode(table, opt.client_window, decoded) || (has_record && record->second.first != d)) {
    LOG_ERROR(ctx(), "recovered service checkpoint s%llu does not match its client table",
              static_cast<unsigned long long>(sc.seq));
    return diverge_at_recovery(rl, sc);
  }
  // The claim below is backed by the service's durable checkpoint; the record lets a later recovery (and a
  // view change) know we made it, and is the log's evidence that our CHECKPOINT was "durable before sent".
  if (!has_record) persist(CheckpointRecord{sc.seq, d, table});
  const std::uint64_t stable = rl.has_stable ? rl.stable_seq : 0;
  if (sc.seq == 0 || log_committed_through(rl, std::min(stable, sc.seq), sc.seq)) {
    clients = std::move(decoded);
    own_checkpoints[sc.seq] = OwnCheckpoint{d, table, true};
    if (!has_record) broadcast(Checkpoint{sc.seq, d});
    return sc.seq;
  }
  LOG_WARN(ctx(), "service checkpoint s%llu is ahead of the log; claiming it and waiting for it to become stable",
           static_cast<unsigned long long>(sc.seq));
  const std::uint64_t base = diverge_at_recovery(rl, sc);
  recovered_pending = RecoveredCheckpoint{sc.seq, d, table};
  claims[self][sc.seq] = d;
  broadcast(Checkpoint{sc.seq, d});
  return base;
}

// The service state cannot be used yet: start, as far as the log is concerned, from the newest checkpoint
// below it that the log recorded with every committed batch up to it, and fetch a newer one before executing
// anything.
std::uint64_t Replica::Impl::diverge_at_recovery(const RecoveredLog& rl, const CheckpointId& sc) {
  service_diverged = true;
  diverged_service_seq = sc.seq;
  const std::uint64_t stable = rl.has_stable ? rl.stable_seq : 0;
  for (auto it = rl.checkpoints.rbegin(); it != rl.checkpoints.rend(); ++it) {
    if (it->first < sc.seq && log_committed_through(rl, std::min(stable, it->first), it->first)) return it->first;
  }
  return 0;
}

// Whether every seq in (from, to] is committed in the log with its body, inside the log window above `from`:
// what the replica needs to stand at `to` with h = from (replica_invariants.cc).
bool Replica::Impl::log_committed_through(const RecoveredLog& rl, std::uint64_t from, std::uint64_t to) const {
  if (to > from + opt.log_window) return false;
  for (std::uint64_t s = from + 1; s <= to; s++) {
    auto it = rl.seqs.find(s);
    if (it == rl.seqs.end() || !it->second.committed) return false;
    if (it->second.bodies.count(it->second.committed_digest) == 0) return false;
  }
  return true;
}

// The stable checkpoint h (the recorded stable one, never above `base`) and our checkpoints from h up, which are
// also our CHECKPOINT claims.
void Replica::Impl::restore_stable_checkpoint(const RecoveredLog& rl, const CheckpointId& sc, std::uint64_t base) {
  // Checkpoints the log recorded up to the base are claims we made (C in a view change); the service may no
  // longer hold their state, so they are not served. Those below h are dropped further down.
  for (const auto& [s, c] : rl.checkpoints) {
    if (s <= base && own_checkpoints.count(s) == 0) own_checkpoints[s] = OwnCheckpoint{c.first, c.second, false};
  }
  h = std::min(rl.has_stable ? rl.stable_seq : 0, base);
  if (own_checkpoints.count(h) == 0) {
    if (rl.has_stable && h == rl.stable_seq) {
      own_checkpoints[h] = OwnCheckpoint{rl.stable_digest, {}, false};
    } else if (auto it = rl.checkpoints.find(h); it != rl.checkpoints.end()) {
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
}

// The log above h, entry by entry from what the records say about each seq, in the view we recovered in.
void Replica::Impl::rebuild_log(RecoveredLog& rl) {
  for (auto& e : ring) e = Entry{};
  for (auto& [s, x] : rl.seqs) {
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
}

// Takes part again without contradicting a vote it may have sent before the crash and no longer remembers
// (`first_start`: the log was empty, so there is none).
void Replica::Impl::rejoin(const RecoveredLog& rl, bool first_start) {
  // A restarted primary never reuses a seq it pre-prepared in its view.
  next_seq = std::max(last_committed, h) + 1;
  if (auto it = rl.max_pp_seq_by_view.find(view); it != rl.max_pp_seq_by_view.end()) {
    next_seq = std::max(next_seq, it->second + 1);
  }
  next_seq_floor = next_seq;
  if (in_view_change) {
    ViewChange vc = build_view_change();
    vc.signature = crypto.sign(view_change_signing_bytes(vc));
    view_changes[self] = vc;
    broadcast(std::move(vc));
  } else if (first_start) {
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
}

}  // namespace bftfs
