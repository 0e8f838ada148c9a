// bftfs counter --spec: the PBFT-CS counter client (NSDI'09 §6.1). Each increment presents the token of the
// previous reply; with speculation the client takes that token from the primary's early reply and sends the next
// increment at once, predicated on that reply (relay/spec_client.h), so up to --spec-window increments are in
// flight while agreement catches up. When a prediction fails, every later increment in flight relied on it and
// comes back from the replicas as a no-op (the shim's retry result); the client then continues from the last
// result that committed, exactly as a rolled-back process would.
//
// Checks it makes on itself (a run that breaks one fails): an increment that relied on a mispredicted reply must
// never execute (its consensus result is a retry, never a counter result), and the counter moved by exactly the
// number of increments that committed (an ordered read before and after the run; one client per counter run).
#include "cli/cli_counter_spec.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <functional>
#include <set>

#include "common/log.h"
#include "cli/cli_common.h"
#include "runtime/client_runtime.h"
#include "os/clock.h"
#include "relay/spec_client_runtime.h"
#include "runtime/status_file.h"
#include "services/counter_service.h"

namespace bftfs::cli {
namespace {

// One speculating counter client.
struct SpecCounterLoop {
  struct Op {
    std::uint64_t id = 0;
    std::uint64_t sent_ns = 0;
  };
  SpecClientRuntime* client = nullptr;
  std::uint32_t window = 64;
  std::uint64_t budget = UINT64_MAX;  // increments to commit (sequential mode); none submitted beyond it

  std::deque<Op> chain;          // live increments in flight, in submission order; each relies on the one before
  std::set<std::uint64_t> dead;  // in flight but relying on a failed prediction: they come back as no-ops
  bool waiting_first = false;    // the newest live increment has no usable reply yet: its token is unknown
  // A prediction failed: wait until every live increment up to the failed one is final, then resume. The dead
  // ones need no waiting: each carries a predicate on a result the replicas logged differently, so every
  // correct replica turns it into a no-op wherever it lands in the order, and it cannot move the token.
  bool recovering = false;
  std::uint64_t next_token = 0;  // the token for the next increment (when !waiting_first)
  // The committed state: the result of the newest increment whose consensus result executed.
  std::uint64_t committed_id = 0;
  std::uint64_t committed_token = 0;
  std::uint64_t committed_value = 0;

  std::uint64_t committed = 0;       // increments that executed with a good token
  std::uint64_t rollbacks = 0;       // consensus differed from the first reply the client acted on
  std::uint64_t retries = 0;         // increments the shim turned into no-ops
  std::uint64_t violations = 0;      // increments that executed although they relied on a failed prediction
  std::uint64_t bad_tokens = 0;      // increments the counter refused (a stale token reached the service)
  bool stopped = false;
  bool idle_reported = false;
  std::function<void(std::uint64_t commit_latency_ns)> on_commit;
  std::function<void(std::uint64_t first_latency_ns)> on_first;
  std::function<void()> on_idle;  // nothing in flight and nothing more to submit

  std::size_t live_in_flight() const { return chain.size(); }

  void pump() {
    while (!stopped && !recovering && !waiting_first && chain.size() < window && committed + chain.size() < budget) {
      submit_next();
    }
    if (chain.empty() && dead.empty() && (stopped || committed >= budget) && !idle_reported) {
      idle_reported = true;
      if (on_idle) on_idle();
    }
  }

  void submit_next() {
    std::vector<SpecDependency> deps;
    if (!chain.empty()) deps.push_back(SpecDependency{chain.back().id, std::nullopt});
    waiting_first = true;
    const std::uint64_t now = mono_ns();
    const std::uint64_t id = client->submit(counter_increment_op(next_token), deps, false,
                                            [this](const SpecEvent& e) { on_event(e); });
    chain.push_back(Op{id, now});
  }

  void on_event(const SpecEvent& e) {
    const bool final = e.kind != SpecEventKind::kFirst;
    CounterResult cr;
    const bool executed = e.status == shim::ShimStatus::kExecuted && parse_counter_result(e.result, cr);
    if (dead.count(e.id) != 0) {
      if (!final) return;
      dead.erase(e.id);
      ++retries;
      if (executed) ++violations;  // the shim let an increment through whose predicate was false
      finish_recovery();
      return;
    }
    auto it = std::find_if(chain.begin(), chain.end(), [&](const Op& o) { return o.id == e.id; });
    if (it == chain.end()) return;  // not ours any more
    if (!final) {
      // Speculate on the first reply only for the newest increment, and only on a successful increment.
      if (it + 1 == chain.end() && waiting_first && executed && cr.status == 0) {
        if (on_first) on_first(mono_ns() - it->sent_ns);
        next_token = cr.next_token;
        waiting_first = false;
        pump();
      }
      return;
    }
    const std::uint64_t latency = mono_ns() - it->sent_ns;
    const bool newest = it + 1 == chain.end();
    bool failed = e.kind == SpecEventKind::kRollback;
    if (executed) {
      if (e.id > committed_id) {
        committed_id = e.id;
        committed_token = cr.next_token;
        committed_value = cr.value;
      }
      if (cr.status == 0) {
        ++committed;
        if (on_commit) on_commit(latency);
      } else {
        ++bad_tokens;
        failed = true;
      }
    } else {
      ++retries;
      failed = true;
    }
    if (e.kind == SpecEventKind::kRollback) ++rollbacks;
    if (!failed) {
      chain.erase(it);
      if (recovering) {
        // A later increment already failed (its final came first, e.g. reordered by a view change): this one
        // may have been the last thing in flight that recovery waits for (sim finding F5).
        finish_recovery();
        return;
      }
      if (newest && waiting_first) {  // no first reply was used (speculation off or withheld): now we know
        next_token = cr.next_token;
        waiting_first = false;
      }
      pump();
      return;
    }
    // Everything in flight after it relied on it (directly or through the chain): it will be a no-op.
    for (auto later = it + 1; later != chain.end(); ++later) dead.insert(later->id);
    chain.erase(it, chain.end());
    recovering = true;
    waiting_first = false;
    finish_recovery();
  }

  // Resumes from the committed state once no live increment is in flight (the newest result that executed is
  // then known: live increments before the failed one are final, and dead ones never execute).
  void finish_recovery() {
    if (!recovering || !chain.empty()) return;
    recovering = false;
    next_token = committed_token;
    pump();
  }
};

}  // namespace

int run_spec_counter(const SpecCounterArgs& a) {
  EventBasePtr base = make_event_base(a.wan.enabled());
  if (base == nullptr) {
    error("counter", "cannot create an event base");
    return kExitFailure;
  }
  const std::uint64_t k = a.clients == 0 ? 1 : a.clients;
  std::vector<std::unique_ptr<SpecClientRuntime>> clients;
  for (std::uint64_t i = 0; i < k; ++i) {
    SpecClientOptions so;
    so.client.first_request_id = fresh_first_request_id();
    so.client.window = a.window;
    so.speculate = a.speculate;
    so.failure_window = a.failure_window;
    std::unique_ptr<SpecClientRuntime> c;
    if (std::string err =
            SpecClientRuntime::create(base.get(), a.config, a.first_id + static_cast<NodeId>(i), so, c, a.wan);
        !err.empty()) {
      error("counter", err);
      return kExitFailure;
    }
    clients.push_back(std::move(c));
  }

  bool failed = false;
  std::string failure;
  std::uint64_t last_progress_ns = mono_ns();
  std::uint64_t last_completion_ns = last_progress_ns;

  // Phase 1: an ordered read per client gives the counter's value and the token each client must present.
  std::vector<std::uint64_t> start_value(k, 0), start_token(k, 0);
  std::uint64_t reads_left = k;
  auto read_all = [&](std::vector<std::uint64_t>& values, std::vector<std::uint64_t>* tokens) {
    reads_left = k;
    for (std::uint64_t i = 0; i < k; ++i) {
      clients[i]->submit(counter_read_op(), {}, false, [&, i, tokens](const SpecEvent& e) {
        if (e.kind == SpecEventKind::kFirst) return;
        CounterResult cr;
        if (e.status != shim::ShimStatus::kExecuted || !parse_counter_result(e.result, cr) || cr.status != 0) {
          failed = true;
          failure = std::string("the counter read did not execute (shim status ") +
                    std::string(shim::to_string(e.status)) + "; do the replicas run --shim?)";
          event_base_loopbreak(base.get());
          return;
        }
        values[i] = cr.value;
        if (tokens != nullptr) (*tokens)[i] = cr.next_token;
        last_completion_ns = mono_ns();
        if (--reads_left == 0) event_base_loopbreak(base.get());
      });
    }
  };

  struct Ctx {
    std::function<void()> fn;
  } watchdog_ctx;
  std::uint64_t total_committed = 0;
  std::uint64_t last_progress_done = 0;
  bool measuring = false;
  watchdog_ctx.fn = [&] {
    const std::uint64_t now = mono_ns();
    if (static_cast<double>(now - last_completion_ns) / 1e9 > a.timeout_s) {
      failed = true;
      failure = "no request completed for " + std::to_string(static_cast<int>(a.timeout_s)) + " s";
      event_base_loopbreak(base.get());
      return;
    }
    if (!measuring) return;
    const double dt = static_cast<double>(now - last_progress_ns) / 1e9;
    std::fprintf(stderr, "counter: %llu committed, %.0f ops/s\n", static_cast<unsigned long long>(total_committed),
                 static_cast<double>(total_committed - last_progress_done) / dt);
    last_progress_ns = now;
    last_progress_done = total_committed;
  };
  EventPtr watchdog(event_new(
      base.get(), -1, EV_PERSIST, [](int, short, void* p) { static_cast<Ctx*>(p)->fn(); }, &watchdog_ctx));
  const timeval one_s{1, 0};
  event_add(watchdog.get(), &one_s);

  read_all(start_value, &start_token);
  event_base_loop(base.get(), 0);
  if (failed) {
    error("counter", failure);
    return kExitFailure;
  }

  // Phase 2: the increments.
  const bool closed_loop = a.clients != 0;
  std::vector<SpecCounterLoop> loops(k);
  std::vector<std::uint64_t> commit_lat, first_lat;
  const std::uint64_t t_start = mono_ns();
  const std::uint64_t t_measure = t_start + static_cast<std::uint64_t>(a.warmup_s * 1e9);
  const std::uint64_t t_end = t_measure + static_cast<std::uint64_t>(a.duration_s * 1e9);
  std::uint64_t measured_ops = 0;
  std::uint64_t seq_end_ns = 0;
  std::uint64_t idle = 0;
  measuring = true;
  last_completion_ns = t_start;
  for (std::uint64_t i = 0; i < k; ++i) {
    SpecCounterLoop& l = loops[i];
    l.client = clients[i].get();
    l.window = a.window;
    l.next_token = start_token[i];
    l.committed_token = start_token[i];
    l.committed_value = start_value[i];
    if (!closed_loop) l.budget = a.requests;
    l.on_commit = [&](std::uint64_t lat) {
      const std::uint64_t now = mono_ns();
      last_completion_ns = now;
      ++total_committed;
      if (closed_loop) {
        if (now >= t_measure && now < t_end) {
          ++measured_ops;
          commit_lat.push_back(lat);
        }
        if (now >= t_end) {
          for (auto& x : loops) x.stopped = true;
        }
      } else {
        if (total_committed > a.warmup) commit_lat.push_back(lat);
        if (total_committed == a.requests) seq_end_ns = now;
      }
    };
    l.on_first = [&](std::uint64_t lat) {
      if (!closed_loop || (mono_ns() >= t_measure && mono_ns() < t_end)) first_lat.push_back(lat);
    };
    l.on_idle = [&] {
      if (++idle == k) event_base_loopbreak(base.get());
    };
  }
  for (auto& l : loops) l.pump();
  event_base_loop(base.get(), 0);
  const std::uint64_t t_stop = seq_end_ns != 0 ? seq_end_ns : mono_ns();
  measuring = false;
  if (failed) {
    error("counter", failure + " (" + std::to_string(total_committed) + " committed)");
    return kExitFailure;
  }

  // Phase 3: the counter must have moved by exactly what committed (meaningful with one counter client).
  std::vector<std::uint64_t> end_value(k, 0);
  last_completion_ns = mono_ns();
  read_all(end_value, nullptr);
  event_base_loop(base.get(), 0);
  if (failed) {
    error("counter", failure);
    return kExitFailure;
  }

  SpecCounterLoop sum;
  SpecClientStats ss;
  std::uint64_t retrans = 0;
  for (std::uint64_t i = 0; i < k; ++i) {
    sum.committed += loops[i].committed;
    sum.rollbacks += loops[i].rollbacks;
    sum.retries += loops[i].retries;
    sum.violations += loops[i].violations;
    sum.bad_tokens += loops[i].bad_tokens;
    const SpecClientStats& s = clients[i]->stats();
    ss.first_delivered += s.first_delivered;
    ss.first_withheld_distrusted += s.first_withheld_distrusted;
    ss.first_withheld_doomed += s.first_withheld_doomed;
    ss.first_mismatches += s.first_mismatches;
    retrans += clients[i]->client_stats().retransmissions;
  }
  const std::uint64_t delta = end_value[0] - start_value[0];
  const bool single = k == 1;
  const bool count_ok = !single || delta == sum.committed;
  const char* system = a.speculate ? "pbftcs" : "pbft-shim";
  const double p50 = percentile_us(commit_lat, 0.5), p99 = percentile_us(commit_lat, 0.99);
  const double first_p50 = percentile_us(first_lat, 0.5);
  JsonObject o;
  o.add("system", system).add("window", std::uint64_t{a.window});
  if (!closed_loop) {
    const double total_ms = static_cast<double>(t_stop - t_start) / 1e6;
    o.add("mode", "sequential").add("requests", a.requests).add("total_ms", total_ms);
  } else {
    const double measured_s = static_cast<double>(std::min(t_stop, t_end) - t_measure) / 1e9;
    o.add("mode", "closed-loop").add("clients", k).add("duration_s", measured_s).add("ops", measured_ops)
        .add("ops_per_s", measured_s > 0 ? static_cast<double>(measured_ops) / measured_s : 0.0);
  }
  o.add("p50_us", p50).add("p99_us", p99).add("first_p50_us", first_p50).add("committed", sum.committed)
      .add("counter_delta", delta).add("final_value", end_value[0]).add("rollbacks", sum.rollbacks)
      .add("retries", sum.retries).add("violations", sum.violations).add("bad_tokens", sum.bad_tokens)
      .add("first_delivered", ss.first_delivered).add("first_mismatches", ss.first_mismatches)
      .add("first_withheld_distrusted", ss.first_withheld_distrusted)
      .add("first_withheld_doomed", ss.first_withheld_doomed).add("retransmissions", retrans);
  if (a.json) {
    std::printf("%s\n", o.str().c_str());
  } else {
    std::printf("%s %s: %llu committed; commit latency p50 %.1f us p99 %.1f us, first reply p50 %.1f us; "
                "rollbacks=%llu retries=%llu counter moved by %llu\n",
                system, closed_loop ? "closed loop" : "sequential", static_cast<unsigned long long>(sum.committed),
                p50, p99, first_p50, static_cast<unsigned long long>(sum.rollbacks),
                static_cast<unsigned long long>(sum.retries), static_cast<unsigned long long>(delta));
  }
  if (sum.violations != 0 || sum.bad_tokens != 0 || !count_ok) {
    error("counter", "PBFT-CS check failed: " + std::to_string(sum.violations) +
                         " increments executed that relied on a failed prediction, " + std::to_string(sum.bad_tokens) +
                         " stale tokens reached the counter, counter moved by " + std::to_string(delta) + " for " +
                         std::to_string(sum.committed) + " committed increments");
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace bftfs::cli
