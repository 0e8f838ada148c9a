// The PBFT-CS client library (NSDI'09 §3.2, §3.4, §5). See spec_client.h for the contract.
//
// Why the events are safe to act on:
//   - kFirst is only a prediction; the caller must be able to undo what it does with it (CRIU rollback, or the
//     counter's own bookkeeping). The library never reports a prediction as final.
//   - The final event is the PBFT client core's certificate (f+1 committed or 2f+1 tentative replies, never the
//     primary's early reply), so it is what the replicated state machine decided.
//   - An operation that relied on a misprediction carries a predicate that every correct replica evaluates
//     against the same log (the shim's, replicated state), so they all turn it into the same no-op: the caller
//     never has to undo an effect on the replicas, only its own local state.
#include "relay/spec_client.h"

#include <deque>
#include <unordered_map>
#include <utility>

#include "common/assert.h"
#include "common/crypto.h"

namespace bftfs {

struct SpecClient::Impl {
  struct Op {
    bool read_only = false;
    // Predicates this operation carries: (dependency id, digest of the result envelope relied on).
    std::vector<std::pair<std::uint64_t, Digest>> predicates;
    std::vector<std::uint64_t> dependents;  // later operations whose predicates name this one
    bool has_first = false;                 // a first reply was seen (delivered or not)
    NodeId first_from = 0;
    Digest first_digest;                    // digest of the first reply's whole result envelope
    bool first_delivered = false;
    bool doomed = false;  // relies (directly or not) on a result that turned out different: will be a no-op
    bool final_produced = false;
    bool mispredicted = false;  // final: the consensus differs from the delivered first reply
    Digest final_digest;
  };

  Impl(const SpecClientOptions& spec_options, NodeId self, const Crypto& crypto, std::uint64_t seed)
      : options(spec_options),
        core(spec_options.client, self, crypto, seed),
        outcomes(spec_options.client.n),
        failures(spec_options.client.n, 0),
        compared_total(spec_options.client.n, 0),
        mismatched_total(spec_options.client.n, 0) {}

  // What the library keeps of an operation once the caller took its final event: enough to judge a later
  // dependency on it (spec_client.h, "Predicates").
  struct Settled {
    bool read_only = false;
    Digest shown;         // what the caller was shown: the delivered first reply, else the consensus
    Digest final_digest;  // the consensus
  };

  const SpecClientOptions options;
  Client core;
  std::map<std::uint64_t, Op> ops;  // submitted, final event not yet taken by the caller
  // The last options.finals_remembered operations whose final event the caller took, oldest first in order.
  std::unordered_map<std::uint64_t, Settled> settled;
  std::deque<std::uint64_t> settled_order;
  std::uint64_t highest_id = 0;      // ids above this were never issued
  std::size_t in_flight = 0;
  std::size_t ordered_in_flight = 0;  // not read-only, final event not produced
  std::vector<SpecEvent> events;
  SpecClientStats stats;
  // §3.4: per replica, whether each of its last `failure_window` first replies matched the consensus.
  std::vector<std::deque<bool>> outcomes;
  std::vector<std::uint32_t> failures;
  std::vector<std::uint64_t> compared_total, mismatched_total;  // since the start, for STATUS

  // §3.4: "more than 1% of its last n early replies": the rate is taken over n even before n replies were
  // seen, so one early failure does not stop speculation (with n = 100 it takes two failures in a row of 100).
  bool trusts(NodeId r) const {
    BFT_ASSERT(r < outcomes.size());
    return std::uint64_t{failures[r]} * 1000 <= std::uint64_t{options.failure_permille_max} * options.failure_window;
  }

  void record_outcome(NodeId r, bool matched) {
    if (r >= outcomes.size()) return;
    compared_total[r]++;
    if (!matched) mismatched_total[r]++;
    if (options.failure_window == 0) return;
    std::deque<bool>& history = outcomes[r];
    history.push_back(matched);
    if (!matched) failures[r]++;
    if (history.size() > options.failure_window) {
      if (!history.front()) failures[r]--;
      history.pop_front();
    }
  }

  // The digest of the result envelope the caller predicts for dependency `d`: its own prediction, else the
  // first reply delivered for it, else (none delivered, final known) the consensus, the only result it knows.
  static Digest predicted(const SpecDependency& d, const Digest& shown) {
    if (d.predicted_inner) {
      return digest_of(shim::encode_envelope_result(shim::ShimStatus::kExecuted, *d.predicted_inner));
    }
    return shown;
  }

  // Judges one dependency (spec_client.h, "Predicates"): appends the predicate it needs, if any, and sets
  // `doomed` when it cannot hold.
  void add_predicate(const SpecDependency& d, std::vector<std::pair<std::uint64_t, Digest>>& predicates,
                     bool& doomed) const {
    BFT_ASSERT(d.id != 0);
    BFT_ASSERT(d.id <= highest_id);
    Digest prediction;
    Digest final_digest;
    if (auto it = ops.find(d.id); it != ops.end()) {
      const Op& dep = it->second;
      BFT_ASSERT(!dep.read_only);  // §3.3: writes never depend on optimized reads
      // Final but not yet taken, and no first reply delivered: the caller can only have its consensus value.
      BFT_ASSERT(d.predicted_inner || dep.first_delivered || dep.final_produced);
      prediction = predicted(d, dep.first_delivered ? dep.first_digest : dep.final_digest);
      if (!dep.final_produced) {
        predicates.emplace_back(d.id, prediction);
        if (dep.doomed) doomed = true;
        return;
      }
      final_digest = dep.final_digest;
    } else {
      auto done = settled.find(d.id);
      BFT_ASSERT(done != settled.end());  // forgotten: more than finals_remembered final events ago
      BFT_ASSERT(!done->second.read_only);
      prediction = predicted(d, done->second.shown);
      final_digest = done->second.final_digest;
    }
    // The consensus is known. A prediction that matches it is a settled fact: no predicate (the shim may have
    // truncated the dependency from its log by now, and the predicate would then fail although it holds). One
    // that does not can never hold: the predicate goes out so that every correct replica makes this a no-op.
    if (prediction == final_digest) return;
    predicates.emplace_back(d.id, prediction);
    doomed = true;
  }

  std::uint64_t submit(Bytes op, std::span<const SpecDependency> deps, bool read_only) {
    BFT_ASSERT(deps.size() <= shim::kDependenciesMax);
    BFT_ASSERT(!read_only || deps.empty());  // a read-only request is never predicated (the shim declines it)
    std::vector<std::pair<std::uint64_t, Digest>> predicates;
    bool doomed = false;
    for (const SpecDependency& d : deps) add_predicate(d, predicates, doomed);
    std::vector<shim::Dependency> wire;
    wire.reserve(predicates.size());
    for (const auto& [id, digest] : predicates) wire.push_back(shim::Dependency{id, digest});
    if (read_only && ordered_in_flight > 0) {
      read_only = false;  // §3.3: our own uncommitted writes must be visible to the read
      ++stats.reads_ordered;
    }
    const std::uint64_t id = core.submit(shim::encode_envelope(wire, op), read_only);
    if (!read_only) ++ordered_in_flight;
    BFT_ASSERT(id > highest_id);
    highest_id = id;
    Op entry;
    entry.read_only = read_only;
    entry.doomed = doomed;
    entry.predicates = std::move(predicates);
    for (const auto& [dep_id, digest] : entry.predicates) {
      // A settled dependency's predicate already dooms this one: only those in flight need to know of it.
      auto it = ops.find(dep_id);
      if (it != ops.end() && !it->second.final_produced) it->second.dependents.push_back(id);
    }
    stats.predicates_sent += entry.predicates.size();
    ops.emplace(id, std::move(entry));
    ++in_flight;
    ++stats.submitted;
    return id;
  }

  void drain_core() {
    for (FirstReply& fr : core.take_first_replies()) on_first(fr);
    for (Completion& c : core.take_completions()) on_final(c);
  }

  void on_first(FirstReply& fr) {
    auto it = ops.find(fr.request_id);
    if (it == ops.end()) return;
    Op& op = it->second;
    if (op.final_produced || op.has_first) return;
    op.has_first = true;
    op.first_from = fr.from;
    op.first_digest = digest_of(fr.result);
    if (!options.speculate) return;
    shim::ShimResult sr;
    if (!shim::decode_envelope_result(fr.result, sr)) return;  // not even an envelope: nothing to act on
    if (op.doomed) {
      ++stats.first_withheld_doomed;
      return;
    }
    if (!trusts(fr.from)) {
      ++stats.first_withheld_distrusted;
      return;
    }
    op.first_delivered = true;
    ++stats.first_delivered;
    events.push_back(SpecEvent{SpecEventKind::kFirst, fr.request_id, sr.status, std::move(sr.inner), fr.from});
  }

  void on_final(Completion& c) {
    auto it = ops.find(c.request_id);
    BFT_ASSERT(it != ops.end());  // the core completes each id once, and we keep it until the event is taken
    Op& op = it->second;
    BFT_ASSERT(!op.final_produced);
    op.final_produced = true;
    op.final_digest = digest_of(c.result);
    --in_flight;
    if (!op.read_only) --ordered_in_flight;
    if (op.has_first) {
      const bool matched = op.first_digest == op.final_digest;
      record_outcome(op.first_from, matched);
      if (!matched) ++stats.first_mismatches;
    }
    shim::ShimResult sr;
    if (!shim::decode_envelope_result(c.result, sr)) {
      // The replicas do not run the shim (or more than f are faulty): report it, never guess.
      sr.status = shim::ShimStatus::kMalformed;
      sr.inner.clear();
    }
    if (shim::is_retry(sr.status)) ++stats.retries;
    SpecEventKind kind = SpecEventKind::kCommit;
    if (op.first_delivered && op.first_digest != op.final_digest) {
      kind = SpecEventKind::kRollback;
      op.mispredicted = true;
      ++stats.rollbacks;
    } else {
      ++stats.commits;
    }
    // Every later operation whose predicate on this one names another digest is now known to fail.
    for (std::uint64_t dep_id : std::exchange(op.dependents, {})) {
      auto d = ops.find(dep_id);
      if (d == ops.end() || d->second.final_produced) continue;
      for (const auto& [pid, digest] : d->second.predicates) {
        if (pid == c.request_id && digest != op.final_digest) doom(dep_id);
      }
    }
    events.push_back(SpecEvent{kind, c.request_id, sr.status, std::move(sr.inner), 0});
  }

  // Marks `id` and everything that relies on it as doomed (their predicates cannot all hold).
  void doom(std::uint64_t id) {
    std::vector<std::uint64_t> todo{id};
    while (!todo.empty()) {
      const std::uint64_t x = todo.back();
      todo.pop_back();
      auto it = ops.find(x);
      if (it == ops.end() || it->second.final_produced || it->second.doomed) continue;
      it->second.doomed = true;
      todo.insert(todo.end(), it->second.dependents.begin(), it->second.dependents.end());
    }
  }

  std::vector<SpecEvent> take_events() {
    std::vector<SpecEvent> out = std::exchange(events, {});
    for (const SpecEvent& e : out) {
      if (e.kind != SpecEventKind::kFirst) settle(e.id);  // the caller now holds the final value
    }
    return out;
  }

  // Moves a final operation from `ops` to `settled`, forgetting the oldest settled one beyond the limit.
  void settle(std::uint64_t id) {
    auto it = ops.find(id);
    BFT_ASSERT(it != ops.end());
    const Op& op = it->second;
    BFT_ASSERT(op.final_produced);
    BFT_ASSERT(op.dependents.empty());  // on_final handed them on
    settled[id] = Settled{op.read_only, op.first_delivered ? op.first_digest : op.final_digest, op.final_digest};
    settled_order.push_back(id);
    ops.erase(it);
    while (settled_order.size() > options.finals_remembered) {
      settled.erase(settled_order.front());
      settled_order.pop_front();
    }
    BFT_ASSERT(settled.size() == settled_order.size());
  }
};

SpecClient::SpecClient(const SpecClientOptions& options, NodeId self, const Crypto& crypto, std::uint64_t prng_seed)
    : impl_(std::make_unique<Impl>(options, self, crypto, prng_seed)) {
  BFT_ASSERT(options.failure_permille_max <= 1000);
}

SpecClient::~SpecClient() = default;

std::uint64_t SpecClient::submit(Bytes op, std::span<const SpecDependency> depends_on, bool read_only) {
  const std::uint64_t id = impl_->submit(std::move(op), depends_on, read_only);
  impl_->drain_core();
  return id;
}

void SpecClient::on_message(NodeId from, const Message& message) {
  impl_->core.on_message(from, message);
  impl_->drain_core();
}

void SpecClient::on_tick() {
  impl_->core.on_tick();
  impl_->drain_core();
}

Effects SpecClient::take_effects() { return impl_->core.take_effects(); }
std::vector<SpecEvent> SpecClient::take_events() { return impl_->take_events(); }
bool SpecClient::trusts(NodeId replica) const { return impl_->trusts(replica); }
std::uint64_t SpecClient::first_compared(NodeId replica) const {
  return replica < impl_->compared_total.size() ? impl_->compared_total[replica] : 0;
}
std::uint64_t SpecClient::first_mismatched(NodeId replica) const {
  return replica < impl_->mismatched_total.size() ? impl_->mismatched_total[replica] : 0;
}
std::size_t SpecClient::in_flight() const { return impl_->in_flight; }
const SpecClientStats& SpecClient::stats() const { return impl_->stats; }
const ClientStats& SpecClient::client_stats() const { return impl_->core.stats(); }

}  // namespace bftfs
