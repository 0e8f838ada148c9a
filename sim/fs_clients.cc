// The file-service clients (simulation.h): each draws requests from its own FsWorkload (sim/fs_workload.h) and
// sends them as shim envelopes, learning only from what it accepted.
//
//   - A plain client is a PBFT client core (protocol/client.h), one request at a time; a request made only of
//     read-only ops may go on the read-only path (TOCS §5.1.3).
//   - A speculating client (relay/spec_client.h, NSDI'09 §3.2) chains its requests as the counter's do: each one
//     is predicated on the first reply of the newest live one, whose result the client has already learned from,
//     so the next request may name what that one created. A final event that shows a prediction failed leaves
//     everything after it doomed: each must come back as a no-op (checked here), and the client waits for them
//     before it goes on. It sends a read on the read-only path only with nothing else in flight.
//
// Every read on the read-only path has a window [lo, hi] in the oracle (sim/fs_oracle.h): lo is the agreed seq of
// the client's last ordered request known when it sends the read (a replica answers the read only after that
// request executed there, Request::prev_request_id, from committed state), hi the largest seq any correct replica
// had executed when the client accepted it.
#include <algorithm>

#include "common/assert.h"
#include "services/fs/fs_codec.h"
#include "shim/envelope.h"
#include "sim/mix.h"
#include "sim/simulation.h"
#include "sim/strfmt.h"

namespace bftfs::sim {

namespace {

// The file-service result inside a shim result envelope, when there is one the request could have produced.
bool fs_result_of(const ClientNode::FsInFlight& f, shim::ShimStatus status, std::span<const std::uint8_t> inner,
                  fs::Result& out) {
  return status == shim::ShimStatus::kExecuted && fs::decode_result(inner, out) == fs::FsDecodeError::kOk &&
         out.results.size() <= f.request.ops.size();
}

// One line about a result, for the trace: the shim status, the outcome and the errno of the op that stopped it.
std::string describe_fs(shim::ShimStatus status, const fs::Result* r) {
  std::string out = fmt(" %s", std::string(shim::to_string(status)).c_str());
  if (r == nullptr) return out;
  static constexpr const char* kOutcomes[] = {"done", "op-failed", "predicate-failed", "malformed"};
  out += fmt(" %s", kOutcomes[static_cast<unsigned>(r->outcome)]);
  if (r->outcome != fs::Outcome::kDone && r->stop < r->results.size()) {
    out += fmt(" at op %u errno %u", r->stop, r->results[r->stop].err);
  }
  return out;
}

}  // namespace

void Simulation::make_fs_client(ClientNode& c) {
  c.fs = std::make_unique<FsWorkload>(sc_.fs_workload);
  c.fs_prng = Prng(mix(config_.seed, 0xF5C0 + c.id));
}

std::uint64_t Simulation::fs_read_lo(ClientNode& c) {
  std::erase_if(c.fs_ordered, [&](std::uint64_t id) {
    const std::optional<std::uint64_t> seq = checker_->agreed_seq(c.id, id);
    if (seq) c.fs_lo = std::max(c.fs_lo, *seq);
    return seq.has_value();
  });
  return c.fs_lo;
}

// What every submission of a file-service request records: the checker's op, the request itself, the trace.
void Simulation::fs_register(ClientNode& c, std::uint64_t rid, ClientNode::FsInFlight f, std::uint64_t step,
                             const FsWorkRequest& w, const std::string& how) {
  const OpKind kind = f.read_only ? OpKind::kRead : OpKind::kFs;
  checker_->on_submit(c.id, rid, kind, step);
  c.outstanding[rid] = kind;
  if (!f.read_only) c.fs_ordered.push_back(rid);
  c.fs_ops.emplace(rid, std::move(f));
  ++stats_.submitted;
  event(fmt("submit c%u r%llu fs %s, %zu ops%s", c.id, ull(rid), std::string(to_string(w.shape)).c_str(),
            w.request.ops.size(), how.c_str()));
}

void Simulation::fs_submit(ClientNode& c, bool allow_read) {
  const FsWorkRequest w = c.fs->next(c.fs_prng);
  ClientNode::FsInFlight f;
  f.request = w.request;
  f.read_only = allow_read && w.read_only;
  const Bytes envelope = shim::encode_envelope({}, fs::encode_request(w.request));
  if (f.read_only) f.read = fs_check_->oracle().begin_read(c.id, envelope, fs_read_lo(c));
  const std::uint64_t step = cluster_->next_step();
  const std::uint64_t rid = c.client->submit(envelope, f.read_only);
  fs_register(c, rid, std::move(f), step, w, w.read_only && allow_read ? " read-only" : "");
  drain_client(c);
  check_checker();
}

// The file-service side of a completion (on_completion): the read's window closes, the workload learns from the
// result, and the trace gets a summary.
std::string Simulation::fs_completed(ClientNode& c, const Completion& comp, FinalKind kind) {
  const auto it = c.fs_ops.find(comp.request_id);
  BFT_ASSERT(it != c.fs_ops.end());
  const ClientNode::FsInFlight f = std::move(it->second);
  c.fs_ops.erase(it);
  if (f.read_only) fs_end_read(c, comp, f);
  shim::ShimResult sr;
  if (!shim::decode_envelope_result(comp.result, sr)) return " not a shim result";
  fs::Result r;
  if (!fs_result_of(f, sr.status, sr.inner, r)) return describe_fs(sr.status, nullptr);
  // A first reply it learned from was either this result (a commit) or a misprediction it learns past.
  if (!f.learned || kind == FinalKind::kRollback) c.fs->on_result(f.request, r);
  return describe_fs(sr.status, &r);
}

void Simulation::fs_end_read(ClientNode& c, const Completion& comp, const ClientNode::FsInFlight& f) {
  const bool fell_back = c.spec ? c.spec->client_stats().read_only_fallbacks > f.fallbacks_before : !comp.read_only;
  if (fell_back) {
    // Ordered after all: not a read of one state in a window. A plain client's completion names the ordered
    // request it became, which the next read's lower bound may use.
    fs_check_->oracle().forget_read(f.read);
    if (!c.spec) c.fs_ordered.push_back(comp.wire_request_id);
    return;
  }
  ++fs_reads_read_only_;
  fs_check_->oracle().end_read(f.read, digest_of(comp.result), max_executed_);
  if (fs_check_->failed()) fail(fs_check_->violation());
}

// ---- speculating clients ----

void Simulation::fs_on_first(ClientNode& c, const SpecEvent& ev) {
  // Speculate only on the newest live request's first reply, and only on one that says it executed.
  if (!c.waiting_first || c.chain.empty() || c.chain.back() != ev.id) return;
  ClientNode::FsInFlight& f = c.fs_ops.at(ev.id);
  fs::Result r;
  if (!fs_result_of(f, ev.status, ev.result, r)) return;
  c.fs->on_result(f.request, r);
  f.learned = true;
  c.waiting_first = false;
  fs_spec_pump(c);
}

void Simulation::fs_spec_pump(ClientNode& c) {
  while (!c.stopped && !c.recovering && !c.waiting_first && c.fs_read_id == 0 && c.chain.size() < c.spec_window &&
         now() >= c.next_submit_tick) {
    fs_spec_submit(c, true);
  }
}

// The next request: on the read-only path when it may go there and nothing is in flight; otherwise ordered and
// predicated on the newest live request (whose first reply it learned from).
void Simulation::fs_spec_submit(ClientNode& c, bool allow_read) {
  BFT_ASSERT(!c.waiting_first);
  BFT_ASSERT(!c.recovering);
  BFT_ASSERT(c.fs_read_id == 0);
  const FsWorkRequest w = c.fs->next(c.fs_prng);
  ClientNode::FsInFlight f;
  f.request = w.request;
  f.read_only = allow_read && w.read_only && c.spec->in_flight() == 0;
  Bytes op = fs::encode_request(w.request);
  const std::uint64_t step = cluster_->next_step();
  if (f.read_only) {
    f.read = fs_check_->oracle().begin_read(c.id, shim::encode_envelope({}, op), fs_read_lo(c));
    f.fallbacks_before = c.spec->client_stats().read_only_fallbacks;
    const std::uint64_t ordered_before = c.spec->stats().reads_ordered;
    const std::uint64_t rid = c.spec->submit(std::move(op), {}, true);
    BFT_ASSERT(c.spec->stats().reads_ordered == ordered_before);  // nothing ordered was in flight
    c.fs_read_id = rid;
    fs_register(c, rid, std::move(f), step, w, " read-only");
  } else {
    std::vector<SpecDependency> deps;
    if (!c.chain.empty()) deps.push_back(SpecDependency{c.chain.back(), std::nullopt});
    const std::uint64_t rid = c.spec->submit(std::move(op), deps);
    c.chain.push_back(rid);
    c.waiting_first = true;
    fs_register(c, rid, std::move(f), step, w, deps.empty() ? "" : fmt(" on r%llu", ull(deps[0].id)));
  }
  check_checker();
}

void Simulation::fs_spec_on_final(ClientNode& c, const SpecEvent& ev) {
  if (ev.id == c.fs_read_id) {
    c.fs_read_id = 0;
    fs_spec_pump(c);
    return;
  }
  const bool executed = ev.status == shim::ShimStatus::kExecuted;
  if (c.dead.erase(ev.id) != 0) {
    // It relied on a failed prediction: the replicas must have made it a no-op (NSDI'09 §3.2).
    ++stats_.spec_dead_finals;
    if (executed) {
      fail(fmt("speculation: client %u request r%llu relied on a failed prediction but executed", c.id, ull(ev.id)));
    }
    fs_spec_resume(c);
    return;
  }
  auto it = std::find(c.chain.begin(), c.chain.end(), ev.id);
  if (it == c.chain.end()) {
    fail(fmt("speculation: client %u got a final event for r%llu, not in flight", c.id, ull(ev.id)));
  }
  if (ev.kind == SpecEventKind::kCommit && executed) {
    const bool newest = it + 1 == c.chain.end();
    c.chain.erase(it);
    if (newest) c.waiting_first = false;  // no first reply was used: the final one is learned (fs_completed)
    fs_spec_resume(c);
    return;
  }
  // A rollback or a no-op: everything after it in the chain relied on it.
  for (auto later = it + 1; later != c.chain.end(); ++later) c.dead.insert(*later);
  c.chain.erase(it, c.chain.end());
  c.recovering = true;
  c.waiting_first = false;
  fs_spec_resume(c);
}

void Simulation::fs_spec_resume(ClientNode& c) {
  // Finals may come in any order: recovery waits until the chain and the doomed requests have all ended.
  if (c.recovering && c.chain.empty() && c.dead.empty()) {
    c.recovering = false;
    event(fmt("c%u resumes", c.id));
  }
  fs_spec_pump(c);
}

}  // namespace bftfs::sim
