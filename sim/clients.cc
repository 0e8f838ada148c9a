// The simulated clients (simulation.h): closed-loop counter clients (increments and reads, with think time), the
// null variant's pipelining client, and PBFT-CS speculating counter clients that chain increments on first
// replies. Every submission, first reply and completion goes to the checker.
//
// What a client asks for is decided in submit_one (and spec_submit for the speculating ones), what a result
// means in describe_result: a new kind of client changes those and feeds its own checker from on_completion.
#include "sim/simulation.h"

#include <algorithm>

#include "common/assert.h"
#include "services/null_service.h"
#include "sim/strfmt.h"

namespace bftfs::sim {

void Simulation::receive(ClientNode& c, NodeId from, const Message& m) {
  if (!c.spec) {
    c.client->on_message(from, m);
  } else {
    if (const auto* rep = std::get_if<Reply>(&m);
        rep != nullptr && (rep->flags & kReplySpeculative) != 0 && (rep->flags & kReplyHasResult) != 0) {
      ++stats_.early_replies_received;
      c.speculative_seen.emplace(rep->request_id, from);
    }
    c.spec->on_message(from, m);
  }
  drain_client(c);
}

void Simulation::drain_client(ClientNode& c) {
  // Events may submit further requests (a speculating client chains on first replies): drain until quiet.
  for (;;) {
    Effects e = c.spec ? c.spec->take_effects() : c.client->take_effects();
    if (!e.persist.empty()) fail(fmt("client %u asked to persist records", c.id));
    for (const auto& s : e.sends) cluster_->route(c.id, s);
    if (!c.spec) {
      for (const auto& comp : c.client->take_completions()) on_completion(c, comp, FinalKind::kPlain);
      return;
    }
    std::vector<SpecEvent> events = c.spec->take_events();
    if (events.empty()) return;
    for (SpecEvent& ev : events) on_spec_event(c, ev);
  }
}

void Simulation::workload(ClientNode& c) {
  if (c.epochs) {
    // A stopped epoch client still runs its program: up to the length fixed when it stopped, again after a
    // rollback, and until its last epoch commits (property 15).
    if (!c.stopped && phase_ == Phase::kLiveness && c.completed_after_heal >= kLivenessOps) {
      c.stopped = true;
      epoch_stop(c);
    }
    epoch_pump(c);
    drain_client(c);
    return;
  }
  if (c.stopped) return;
  if (phase_ == Phase::kLiveness && c.completed_after_heal >= kLivenessOps) {
    c.stopped = true;
    return;
  }
  if (c.spec_window > 0) {
    if (sc_.fs()) {
      fs_spec_pump(c);
    } else {
      spec_pump(c);
    }
    drain_client(c);
    return;
  }
  while (c.in_flight() < c.window && now() >= c.next_submit_tick) submit_one(c, true);
}

void Simulation::submit_one(ClientNode& c, bool allow_read) {
  if (sc_.fs()) {
    fs_submit(c, allow_read);
    return;
  }
  Bytes op;
  OpKind kind = OpKind::kNull;
  bool read_only = false;
  if (sc_.service == ServiceKind::kNull) {
    op = null_op(static_cast<std::uint32_t>(prng_.below(64)), static_cast<std::uint32_t>(prng_.below(32)));
  } else if (allow_read && prng_.below(100) < sc_.read_percent) {
    op = counter_read_op();
    kind = OpKind::kRead;
    read_only = true;
  } else {
    op = counter_increment_op(c.token);
    kind = OpKind::kIncrement;
  }
  const std::uint64_t step = cluster_->next_step();
  const std::uint64_t rid =
      c.spec ? c.spec->submit(std::move(op), {}, read_only) : c.client->submit(std::move(op), read_only);
  checker_->on_submit(c.id, rid, kind, step);
  c.outstanding[rid] = kind;
  ++stats_.submitted;
  event(fmt("submit c%u r%llu %s", c.id, ull(rid), to_string(kind).c_str()));
  drain_client(c);
  check_checker();
}

// The counter result inside `comp` for the trace; takes the next token from an increment's result (a refused one
// tells the token to use). A speculating client keeps its own chain of tokens (spec_on_final).
std::string Simulation::describe_result(ClientNode& c, const Completion& comp, OpKind kind) {
  if (!sc_.counter()) return "";
  std::string detail;
  std::span<const std::uint8_t> inner = comp.result;
  shim::ShimResult sr;
  if (sc_.shim && shim::decode_envelope_result(comp.result, sr)) {
    detail = fmt(" %s", std::string(shim::to_string(sr.status)).c_str());
    inner = sr.inner;
  }
  CounterResult res;
  if (parse_counter_result(inner, res)) {
    detail += fmt(" status=%u value=%llu", res.status, ull(res.value));
    if (kind == OpKind::kIncrement && c.spec_window == 0) c.token = res.next_token;
  }
  return detail;
}

void Simulation::on_completion(ClientNode& c, const Completion& comp, FinalKind final_kind) {
  checker_->on_completion(c.id, comp, steps(), final_kind);
  auto it = c.outstanding.find(comp.request_id);
  OpKind kind = OpKind::kNull;
  if (it != c.outstanding.end()) {
    kind = it->second;
    c.outstanding.erase(it);
  }
  const std::string detail = sc_.fs() ? fs_completed(c, comp, final_kind) : describe_result(c, comp, kind);
  const char* how =
      final_kind == FinalKind::kCommit ? " commit" : (final_kind == FinalKind::kRollback ? " ROLLBACK" : "");
  event(fmt("complete c%u r%llu %s v%llu%s%s%s", c.id, ull(comp.request_id), to_string(kind).c_str(),
            ull(comp.view), comp.read_only ? " read-only" : "", how, detail.c_str()));
  ++c.completed;
  c.newest_completed = std::max(c.newest_completed, comp.request_id);
  if (phase_ == Phase::kLiveness) ++c.completed_after_heal;
  c.next_submit_tick = now() + prng_.below(std::uint64_t{sc_.think_ticks_max} + 1);
  check_checker();
}

void Simulation::on_spec_event(ClientNode& c, SpecEvent& ev) {
  // The checker sees whole result envelopes, as the replicas returned them (decode_result is canonical).
  Bytes envelope = shim::encode_envelope_result(ev.status, ev.result);
  if (ev.kind == SpecEventKind::kFirst) {
    on_first(c, ev, envelope);
    return;
  }
  c.speculative_seen.erase(c.speculative_seen.lower_bound({ev.id, 0}),
                           c.speculative_seen.upper_bound({ev.id, ~NodeId{0}}));
  Completion comp;
  comp.request_id = ev.id;
  comp.wire_request_id = ev.id;
  comp.result = std::move(envelope);
  on_completion(c, comp, ev.kind == SpecEventKind::kRollback ? FinalKind::kRollback : FinalKind::kCommit);
  if (c.epochs) {
    epoch_on_final(c, ev);
    return;
  }
  if (c.spec_window == 0) return;
  if (sc_.fs()) {
    fs_spec_on_final(c, ev);
  } else {
    spec_on_final(c, ev);
  }
}

void Simulation::on_first(ClientNode& c, const SpecEvent& ev, const Bytes& envelope) {
  checker_->on_first(c.id, ev.id, envelope);
  const bool speculative = c.speculative_seen.count({ev.id, ev.from}) != 0;
  stats_.speculative_firsts += speculative ? 1 : 0;
  event(fmt("first c%u r%llu from r%u%s %s %s", c.id, ull(ev.id), ev.from, speculative ? " (early)" : "",
            std::string(shim::to_string(ev.status)).c_str(), digest_of(envelope).short_hex().c_str()));
  check_checker();
  if (c.epochs) {
    epoch_on_first(c, ev);
    return;
  }
  if (c.spec_window == 0 || c.dead.count(ev.id) != 0) return;
  if (sc_.fs()) {
    fs_on_first(c, ev);
    return;
  }
  // Speculate only on the newest live increment's reply, and only on a successful increment.
  CounterResult cr;
  if (c.waiting_first && !c.chain.empty() && c.chain.back() == ev.id && ev.status == shim::ShimStatus::kExecuted &&
      parse_counter_result(ev.result, cr) && cr.status == 0) {
    c.token = cr.next_token;
    c.waiting_first = false;
    spec_pump(c);
  }
}

void Simulation::spec_pump(ClientNode& c) {
  while (!c.stopped && !c.recovering && !c.waiting_first && c.chain.size() < c.spec_window &&
         now() >= c.next_submit_tick) {
    spec_submit(c);
  }
}

void Simulation::spec_submit(ClientNode& c) {
  BFT_ASSERT(!c.waiting_first);
  BFT_ASSERT(!c.recovering);
  // The newest live increment had its first reply delivered (that is where the token comes from): the new one
  // is predicated on it. With nothing live, the token comes from a final result and needs no predicate.
  std::vector<SpecDependency> deps;
  if (!c.chain.empty()) deps.push_back(SpecDependency{c.chain.back(), std::nullopt});
  const std::uint64_t step = cluster_->next_step();
  const std::uint64_t rid = c.spec->submit(counter_increment_op(c.token), deps);
  checker_->on_submit(c.id, rid, OpKind::kIncrement, step);
  c.outstanding[rid] = OpKind::kIncrement;
  c.chain.push_back(rid);
  c.waiting_first = true;
  ++stats_.submitted;
  event(deps.empty() ? fmt("submit c%u r%llu increment", c.id, ull(rid))
                     : fmt("submit c%u r%llu increment on r%llu", c.id, ull(rid), ull(deps[0].id)));
  check_checker();
}

void Simulation::spec_on_final(ClientNode& c, const SpecEvent& ev) {
  CounterResult cr;
  const bool executed = ev.status == shim::ShimStatus::kExecuted && parse_counter_result(ev.result, cr);
  if (c.dead.erase(ev.id) != 0) {
    // It relied on a failed prediction: the replicas must have made it a no-op (NSDI'09 §3.2).
    ++stats_.spec_dead_finals;
    if (executed) {
      fail(fmt("speculation: client %u increment r%llu relied on a failed prediction but executed (value %llu)",
               c.id, ull(ev.id), ull(cr.value)));
    }
    spec_resume(c);
    return;
  }
  auto it = std::find(c.chain.begin(), c.chain.end(), ev.id);
  if (it == c.chain.end()) {
    fail(fmt("speculation: client %u got a final event for r%llu, not in flight", c.id, ull(ev.id)));
  }
  const bool newest = it + 1 == c.chain.end();
  if (executed) {
    // Every increment of a speculating client presents the token of the result it was predicated on, or of a
    // final one: a refused token means a prediction that failed was acted on anyway.
    if (cr.status != 0) {
      fail(fmt("speculation: client %u increment r%llu reached the counter with a stale token", c.id, ull(ev.id)));
    }
    if (ev.id > c.committed_id) {
      c.committed_id = ev.id;
      c.committed_token = cr.next_token;
    }
  }
  if (ev.kind == SpecEventKind::kCommit && executed) {
    c.chain.erase(it);
    if (newest && c.waiting_first) {  // no first reply was used (withheld, or none came first): now it is known
      c.token = cr.next_token;
      c.waiting_first = false;
    }
    spec_resume(c);
    return;
  }
  // A rollback or a no-op: everything after it in the chain relied on it.
  for (auto later = it + 1; later != c.chain.end(); ++later) c.dead.insert(*later);
  c.chain.erase(it, c.chain.end());
  c.recovering = true;
  c.waiting_first = false;
  spec_resume(c);
}

void Simulation::spec_resume(ClientNode& c) {
  // Finals may arrive in any order: an older increment may still be in flight when a newer one failed, so
  // recovery waits for the chain and the dead to drain, whichever way each of them ends.
  if (c.recovering && c.chain.empty() && c.dead.empty()) {
    c.recovering = false;
    c.token = c.committed_token;
    event(fmt("c%u resumes from r%llu", c.id, ull(c.committed_id)));
  }
  spec_pump(c);
}

}  // namespace bftfs::sim
