#include "sim/checker.h"

#include <algorithm>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <limits>

#include "common/crypto.h"
#include "services/counter_service.h"
#include "sim/strfmt.h"

namespace bftfs::sim {

namespace {

constexpr std::uint8_t kCounterOpIncrement = 1;  // services/counter_service.h: increment is u8 1
constexpr std::uint8_t kCounterStatusOk = 0;
constexpr std::uint8_t kCounterStatusBadToken = 1;


}  // namespace

std::string to_string(OpKind k) {
  switch (k) {
    case OpKind::kIncrement:
      return "increment";
    case OpKind::kRead:
      return "read";
    case OpKind::kNull:
      return "null";
    case OpKind::kFs:
      return "fs";
  }
  return "?";
}

Checker::Checker(bool counter, bool shim) : counter_(counter), shim_(shim) {}

bool Checker::counter_result(std::span<const std::uint8_t> result, shim::ShimStatus& status, CounterResult& out) const {
  status = shim::ShimStatus::kExecuted;
  if (!shim_) return parse_counter_result(result, out);
  shim::ShimResult sr;
  if (!shim::decode_envelope_result(result, sr)) {
    status = shim::ShimStatus::kMalformed;
    return false;
  }
  status = sr.status;
  return sr.status == shim::ShimStatus::kExecuted && parse_counter_result(sr.inner, out);
}

void Checker::on_checkpoint(NodeId replica, std::uint64_t seq, const Digest& digest) {
  auto [it, inserted] = checkpoints_.try_emplace(seq, digest, replica);
  if (inserted || it->second.first == digest) return;
  fail(fmt("checkpoint agreement: checkpoint %llu is %s at replica %u but %s at replica %u", ull(seq),
           it->second.first.short_hex().c_str(), it->second.second, digest.short_hex().c_str(), replica));
}

// Property 8 for one record that is new to the agreed history (its first final report).
void Checker::check_predicates(NodeId replica, const ExecRecord& rec) {
  const std::string who = fmt("replica %u seq %llu client %u request %llu", replica, ull(rec.seq), rec.client,
                              ull(rec.request_id));
  switch (rec.shim_status) {
    case shim::ShimStatus::kExecuted:
      for (const shim::Dependency& d : rec.deps) {
        auto it = finals_.find(Key{rec.client, d.request_id});
        if (it == finals_.end() || it->second.seq > rec.seq) {
          fail(fmt("predicate: %s executed, but its dependency request %llu has no agreed result before it", who.c_str(),
                   ull(d.request_id)));
          return;
        }
        if (it->second.result_digest != d.result_digest) {
          fail(fmt("predicate: %s executed although it predicted %s for request %llu, whose agreed result (seq %llu) "
                   "is %s",
                   who.c_str(), d.result_digest.short_hex().c_str(), ull(d.request_id), ull(it->second.seq),
                   it->second.result_digest.short_hex().c_str()));
          return;
        }
      }
      return;
    case shim::ShimStatus::kRetryPredicateFailed:
      for (const shim::Dependency& d : rec.deps) {
        auto it = finals_.find(Key{rec.client, d.request_id});
        if (it != finals_.end() && it->second.seq <= rec.seq && it->second.result_digest != d.result_digest) return;
      }
      fail(fmt("predicate: %s was made a no-op for a failed predicate, but every dependency's agreed result is "
               "the predicted one or unknown (%zu dependencies)",
               who.c_str(), rec.deps.size()));
      return;
    case shim::ShimStatus::kRetryDependencyUnknown:
      if (rec.deps.empty()) fail(fmt("predicate: %s without dependencies was made a no-op for an unknown one", who.c_str()));
      return;
    case shim::ShimStatus::kMalformed:
      fail(fmt("predicate: %s is a malformed envelope in the agreed history (correct clients never send one)",
               who.c_str()));
      return;
  }
  fail(fmt("predicate: %s has an unknown shim status", who.c_str()));
}

void Checker::fail(std::string what) {
  if (violation_.empty()) violation_ = std::move(what);
}

void Checker::on_committed(NodeId replica, std::uint64_t seq, const Digest& digest) {
  auto [it, inserted] = committed_.try_emplace(seq, digest, replica);
  if (inserted || it->second.first == digest) return;
  fail(fmt("agreement: seq %llu committed as %s by replica %u but as %s by replica %u", ull(seq),
           it->second.first.short_hex().c_str(), it->second.second, digest.short_hex().c_str(), replica));
}

// Property 10: the request's neighbours in id order are its neighbours in the agreed order. Checking both sides
// at every insertion keeps the whole per-client map sorted by id and by place at once.
void Checker::check_client_order(NodeId replica, const ExecRecord& rec) {
  auto& order = client_order_[rec.client];
  const std::pair<std::uint64_t, std::uint32_t> place{rec.seq, rec.index};
  const auto [it, inserted] = order.emplace(rec.request_id, place);
  if (!inserted) return;  // finals_ admits each request once; nothing to add
  if (it != order.begin()) {
    const auto before = std::prev(it);
    if (before->second > place) {
      fail(fmt("client order: client %u request %llu executed at seq %llu #%u (replica %u) before its earlier request "
               "%llu at seq %llu #%u",
               rec.client, ull(rec.request_id), ull(rec.seq), rec.index, replica, ull(before->first),
               ull(before->second.first), before->second.second));
      return;
    }
  }
  const auto after = std::next(it);
  if (after != order.end() && after->second < place) {
    fail(fmt("client order: client %u request %llu executed at seq %llu #%u (replica %u) after its later request "
             "%llu at seq %llu #%u",
             rec.client, ull(rec.request_id), ull(rec.seq), rec.index, replica, ull(after->first),
             ull(after->second.first), after->second.second));
  }
}

// Property 4 for one record new to the agreed history: a successful increment's value is unique and grows with
// the agreed order. False when the record breaks it so that nothing more can be said about it.
bool Checker::check_counter_integrity(NodeId replica, const ExecRecord& rec) {
  if (!counter_ || rec.op_kind != kCounterOpIncrement || rec.shim_status != shim::ShimStatus::kExecuted) return true;
  CounterResult res;
  shim::ShimStatus status;
  if (!counter_result(rec.result, status, res)) {
    fail(fmt("counter: replica %u seq %llu: increment result of client %u request %llu does not parse", replica,
             ull(rec.seq), rec.client, ull(rec.request_id)));
    return false;
  }
  if (res.status != kCounterStatusOk) return true;
  auto [vit, fresh] = ok_values_.try_emplace(res.value, rec.seq, Key{rec.client, rec.request_id});
  if (!fresh) {
    fail(fmt("counter integrity: value %llu returned to client %u request %llu (seq %llu) and to client %u "
             "request %llu (seq %llu)",
             ull(res.value), vit->second.second.first, ull(vit->second.second.second), ull(vit->second.first),
             rec.client, ull(rec.request_id), ull(rec.seq)));
    return false;
  }
  // Values grow with the agreed order: the next smaller value was executed at or before this seq and the next
  // larger one at or after it.
  if (vit != ok_values_.begin()) {
    auto prev = std::prev(vit);
    if (prev->second.first > rec.seq) {
      fail(fmt("counter integrity: value %llu at seq %llu but smaller value %llu at later seq %llu", ull(res.value),
               ull(rec.seq), ull(prev->first), ull(prev->second.first)));
    }
  }
  auto next = std::next(vit);
  if (next != ok_values_.end() && next->second.first < rec.seq) {
    fail(fmt("counter integrity: value %llu at seq %llu but larger value %llu at earlier seq %llu", ull(res.value),
             ull(rec.seq), ull(next->first), ull(next->second.first)));
  }
  return true;
}

void Checker::on_final(NodeId replica, const ExecRecord& rec) {
  const Key key{rec.client, rec.request_id};
  if (shim_ && !rec.enveloped) {
    fail(fmt("shim: replica %u seq %llu executed client %u request %llu without the shim", replica, ull(rec.seq),
             rec.client, ull(rec.request_id)));
    return;
  }
  if (shim_ && finals_.count(key) == 0) {
    // Before the record joins the agreed history: its dependencies must already be there.
    check_predicates(replica, rec);
    if (failed()) return;
  }
  auto [it, inserted] = finals_.try_emplace(key, Final{replica, rec.seq, rec.result_digest, rec.shim_status});
  if (!inserted) {
    const Final& first = it->second;
    if (first.seq != rec.seq || first.result_digest != rec.result_digest) {
      const bool decision = shim_ && first.seq == rec.seq && first.shim_status != rec.shim_status;
      fail(fmt("agreed results%s: client %u request %llu executed at seq %llu with result %s (%s) by replica %u but "
               "at seq %llu with result %s (%s) by replica %u",
               decision ? " (shim decision)" : "", rec.client, ull(rec.request_id), ull(first.seq),
               first.result_digest.short_hex().c_str(), std::string(shim::to_string(first.shim_status)).c_str(),
               first.replica, ull(rec.seq), rec.result_digest.short_hex().c_str(),
               std::string(shim::to_string(rec.shim_status)).c_str(), replica));
    }
    return;
  }
  check_client_order(replica, rec);
  if (failed()) return;
  if (shim_ && shim::is_retry(rec.shim_status)) ++shim_retries_;

  if (!check_counter_integrity(replica, rec)) return;

  auto pit = pending_.find(key);
  if (pit != pending_.end()) {
    if (pit->second.result_digest != rec.result_digest) {
      fail(fmt("accepted result: client %u accepted %s for request %llu but the agreed result (seq %llu, "
               "replica %u) is %s",
               rec.client, pit->second.result_digest.short_hex().c_str(), ull(rec.request_id), ull(rec.seq),
               replica, rec.result_digest.short_hex().c_str()));
    }
    pending_.erase(pit);
  }
}

std::optional<std::uint64_t> Checker::agreed_seq(NodeId client, std::uint64_t request_id) const {
  const auto it = finals_.find(Key{client, request_id});
  if (it == finals_.end()) return std::nullopt;
  return it->second.seq;
}

std::optional<std::uint64_t> Checker::completion_step(NodeId client, std::uint64_t request_id) const {
  const auto it = ops_.find(Key{client, request_id});
  if (it == ops_.end() || !it->second.completed) return std::nullopt;
  return it->second.complete_step;
}

void Checker::on_submit(NodeId client, std::uint64_t request_id, OpKind kind, std::uint64_t step) {
  auto [it, inserted] = ops_.try_emplace(Key{client, request_id});
  if (!inserted) {
    fail(fmt("client %u submitted request id %llu twice", client, ull(request_id)));
    return;
  }
  it->second.kind = kind;
  it->second.submit_step = step;
}

void Checker::on_first(NodeId client, std::uint64_t request_id, const Bytes& result) {
  auto it = ops_.find(Key{client, request_id});
  if (it == ops_.end() || it->second.completed) {
    fail(fmt("speculation: client %u delivered a first reply for request %llu, which is not in flight", client,
             ull(request_id)));
    return;
  }
  if (it->second.has_first) {
    fail(fmt("speculation: client %u delivered two first replies for request %llu", client, ull(request_id)));
    return;
  }
  it->second.has_first = true;
  it->second.first_digest = digest_of(result);
}

void Checker::on_completion(NodeId client, const Completion& c, std::uint64_t step, FinalKind kind) {
  const Key key{client, c.request_id};
  auto it = ops_.find(key);
  if (it == ops_.end()) {
    fail(fmt("client %u completed request %llu that it never submitted", client, ull(c.request_id)));
    return;
  }
  Op& op = it->second;
  if (op.completed) {
    fail(fmt("client %u completed request %llu twice", client, ull(c.request_id)));
    return;
  }
  op.completed = true;
  op.complete_step = step;
  ++completions_;
  const Digest digest = digest_of(c.result);
  check_final_kind(client, c.request_id, op, kind, digest);
  if (failed()) return;

  if (op.kind == OpKind::kRead) ++read_completions_;
  // A read answered read-only is not in the agreed history (TOCS §5.1.3): real time checks it (property 5), or
  // the file service's oracle. One that fell back to ordering executed under the new request id its plain
  // client's completion names (a speculating client's final event does not say, and the read goes unchecked).
  const bool fell_back =
      op.kind == OpKind::kRead && !c.read_only && c.wire_request_id != 0 && c.wire_request_id != c.request_id;
  if (op.kind != OpKind::kRead || fell_back) {
    const Key agreed{client, fell_back ? c.wire_request_id : c.request_id};
    auto fit = finals_.find(agreed);
    if (fit != finals_.end()) {
      if (fit->second.result_digest != digest) {
        fail(fmt("accepted result: client %u accepted %s for request %llu but the agreed result (seq %llu, "
                 "replica %u) is %s",
                 client, digest.short_hex().c_str(), ull(c.request_id), ull(fit->second.seq), fit->second.replica,
                 fit->second.result_digest.short_hex().c_str()));
      }
    } else {
      pending_.emplace(agreed, Pending{digest, step});
    }
  }

  if (counter_ && op.kind != OpKind::kNull) record_counter_value(client, c, op);
}

// Property 9: the final event's kind follows from the first reply the client delivered.
void Checker::check_final_kind(NodeId client, std::uint64_t request_id, const Op& op, FinalKind kind,
                               const Digest& digest) {
  switch (kind) {
    case FinalKind::kPlain:
      if (op.has_first) {
        fail(fmt("speculation: plain client %u delivered a first reply for request %llu", client, ull(request_id)));
      }
      return;
    case FinalKind::kCommit:
      if (op.has_first && op.first_digest != digest) {
        fail(fmt("speculation: client %u committed request %llu with %s although the first reply it delivered was "
                 "%s (a mispredicted first reply must end in a rollback)",
                 client, ull(request_id), digest.short_hex().c_str(), op.first_digest.short_hex().c_str()));
      }
      return;
    case FinalKind::kRollback:
      if (!op.has_first || op.first_digest == digest) {
        fail(fmt("speculation: client %u rolled back request %llu (final %s) although %s", client, ull(request_id),
                 digest.short_hex().c_str(),
                 op.has_first ? "its first reply was the same" : "it delivered no first reply"));
      }
      return;
  }
}

// The counter value an accepted counter result carries, for properties 5 and 7.
void Checker::record_counter_value(NodeId client, const Completion& c, Op& op) {
  CounterResult res;
  shim::ShimStatus status;
  if (!counter_result(c.result, status, res)) {
    if (op.kind == OpKind::kIncrement && shim::is_retry(status)) {
      // A no-op (a predicate failed): it changed nothing and saw nothing; property 8 checks it was right to.
      op.kind = OpKind::kNull;
      return;
    }
    fail(fmt("client %u accepted a %s result for request %llu that does not parse (shim status %s)", client,
             to_string(op.kind).c_str(), ull(c.request_id), std::string(shim::to_string(status)).c_str()));
    return;
  }
  const bool ok = res.status == kCounterStatusOk;
  const bool bad_token = res.status == kCounterStatusBadToken && op.kind == OpKind::kIncrement;
  if (!ok && !bad_token) {
    fail(fmt("client %u request %llu: a well-formed %s got status %u", client, ull(c.request_id),
             to_string(op.kind).c_str(), res.status));
    return;
  }
  op.has_value = true;
  op.value = res.value;
  if (ok && op.kind == OpKind::kIncrement) ++accepted_increments_;
  // An increment refused for its token changed nothing and reports the value it saw: for real-time order it is a
  // read.
  if (bad_token) op.kind = OpKind::kRead;
}

void Checker::check_real_time() {
  std::vector<Obs> incs;   // completed successful increments
  std::vector<Obs> reads;  // completed reads (and refused increments)
  for (const auto& [key, op] : ops_) {
    if (!op.completed || !op.has_value) continue;
    (op.kind == OpKind::kIncrement ? incs : reads).push_back(Obs{&key, &op});
  }
  const std::uint64_t max_value = ok_values_.empty() ? 0 : ok_values_.rbegin()->first;
  if (!check_lower_bounds(incs, reads)) return;
  check_upper_bounds(incs, reads, max_value);
}

// Lower bounds: sweep operations by submit step, folding in increments that completed before it. False on a
// violation.
bool Checker::check_lower_bounds(const std::vector<Obs>& incs, const std::vector<Obs>& reads) {
  std::vector<Obs> by_complete = incs;
  std::sort(by_complete.begin(), by_complete.end(),
            [](const Obs& a, const Obs& b) { return a.op->complete_step < b.op->complete_step; });
  std::vector<Obs> all = incs;
  all.insert(all.end(), reads.begin(), reads.end());
  std::sort(all.begin(), all.end(), [](const Obs& a, const Obs& b) { return a.op->submit_step < b.op->submit_step; });
  std::size_t i = 0;
  std::uint64_t lo = 0;
  const Key* lo_key = nullptr;
  for (const Obs& o : all) {
    while (i < by_complete.size() && by_complete[i].op->complete_step < o.op->submit_step) {
      if (lo_key == nullptr || by_complete[i].op->value > lo) {
        lo = by_complete[i].op->value;
        lo_key = by_complete[i].key;
      }
      ++i;
    }
    if (lo_key == nullptr) continue;
    const bool inc = o.op->kind == OpKind::kIncrement;
    if (inc ? o.op->value <= lo : o.op->value < lo) {
      fail(fmt("linearizability: client %u %s %llu returned %llu but client %u request %llu had already "
               "completed with value %llu before it was submitted",
               o.key->first, to_string(o.op->kind).c_str(), ull(o.key->second), ull(o.op->value), lo_key->first,
               ull(lo_key->second), ull(lo)));
      return false;
    }
  }
  return true;
}

// Upper bounds for reads: increments submitted after the read completed are ordered after it; and no read sees
// more increments than were ever agreed.
void Checker::check_upper_bounds(const std::vector<Obs>& incs, std::vector<Obs> reads, std::uint64_t max_value) {
  std::vector<Obs> by_submit_desc = incs;
  std::sort(by_submit_desc.begin(), by_submit_desc.end(),
            [](const Obs& a, const Obs& b) { return a.op->submit_step > b.op->submit_step; });
  std::sort(reads.begin(), reads.end(),
            [](const Obs& a, const Obs& b) { return a.op->complete_step > b.op->complete_step; });
  std::size_t j = 0;
  std::uint64_t hi = std::numeric_limits<std::uint64_t>::max();
  const Key* hi_key = nullptr;
  for (const Obs& r : reads) {
    while (j < by_submit_desc.size() && by_submit_desc[j].op->submit_step > r.op->complete_step) {
      if (by_submit_desc[j].op->value < hi) {
        hi = by_submit_desc[j].op->value;
        hi_key = by_submit_desc[j].key;
      }
      ++j;
    }
    if (hi_key != nullptr && r.op->value >= hi) {
      fail(fmt("linearizability: client %u read %llu returned %llu but client %u request %llu, submitted after "
               "the read completed, returned %llu",
               r.key->first, ull(r.key->second), ull(r.op->value), hi_key->first, ull(hi_key->second), ull(hi)));
      return;
    }
    if (r.op->value > max_value) {
      fail(fmt("linearizability: client %u read %llu returned %llu but only %llu increments were ever agreed",
               r.key->first, ull(r.key->second), ull(r.op->value), ull(max_value)));
      return;
    }
  }
}

void Checker::finish(const std::vector<std::pair<NodeId, std::uint64_t>>& counter_values) {
  if (!pending_.empty()) {
    const auto& [key, p] = *pending_.begin();
    fail(fmt("accepted result: client %u accepted %s for request %llu but no correct replica ever executed it "
             "finally (%zu such requests)",
             key.first, p.result_digest.short_hex().c_str(), ull(key.second), pending_.size()));
    return;
  }
  if (!counter_) return;
  const std::uint64_t max_value = ok_values_.empty() ? 0 : ok_values_.rbegin()->first;
  if (ok_values_.size() != max_value) {
    fail(fmt("counter integrity: %zu successful increments in the agreed history but the largest value is %llu",
             ok_values_.size(), ull(max_value)));
    return;
  }
  // Every submitted request has completed (the liveness phase waited for it), so what the clients accepted
  // is the whole story.
  if (accepted_increments_ != max_value) {
    fail(fmt("counter integrity: the clients accepted %llu successful increments but the agreed history has %llu",
             ull(accepted_increments_), ull(max_value)));
    return;
  }
  for (const auto& [replica, value] : counter_values) {
    if (value != max_value) {
      fail(fmt("counter integrity: replica %u holds %llu after converging but the agreed history has %llu "
               "successful increments",
               replica, ull(value), ull(max_value)));
      return;
    }
  }
  check_real_time();
}

}  // namespace bftfs::sim
