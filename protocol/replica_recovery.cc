// Recovery from the write-ahead log: the replica rebuilds its view, checkpoints and log from the records it
// persisted (effects.h), pairs the service's durable state with its client table, re-executes what committed
// above it, and rejoins so that it never contradicts a vote it may have sent before the crash. See
// replica_impl.h for the map of the replica's files.
#include <algorithm>

#include "common/assert.h"
#include "common/log.h"
#include "protocol/replica_impl.h"

namespace bftfs {

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

}  // namespace bftfs
