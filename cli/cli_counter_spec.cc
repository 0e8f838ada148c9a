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
#include <algorithm>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <vector>

#include "cli/cli_common.h"
#include "cli/cli_counter.h"
#include "os/clock.h"
#include "relay/spec_client_runtime.h"
#include "runtime/client_runtime.h"
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

// What the clients of a run did, summed.
struct SpecTotals {
  std::uint64_t committed = 0;
  std::uint64_t rollbacks = 0;
  std::uint64_t retries = 0;
  std::uint64_t violations = 0;
  std::uint64_t bad_tokens = 0;
  std::uint64_t retransmissions = 0;
  SpecClientStats client;
};

// One run of PBFT-CS counter clients in three phases: an ordered read of the counter, the increments, and
// another ordered read to check that the counter moved by exactly what committed.
class SpecCounterRun {
 public:
  explicit SpecCounterRun(const CounterArgs& a) : a_(a), k_(a.client_count()) {}

  int run() {
    const WanSpec wan = wan_spec(a_.wan);
    base_ = make_event_base(wan.enabled());
    if (base_ == nullptr) return fail("cannot create an event base");
    if (std::string err = create_clients(wan); !err.empty()) return fail(err);
    last_progress_ns_ = last_completion_ns_ = mono_ns();
    EverySecond watchdog(base_.get(), [this] { on_tick(); });
    std::vector<std::uint64_t> start_value(k_, 0), start_token(k_, 0);
    if (!read_all(start_value, &start_token)) return fail(failure_);
    const RunClock clock(a_.warmup_s, a_.duration_s);
    const std::uint64_t t_stop = run_increments(clock, start_value, start_token);
    if (failed_) return fail(failure_ + " (" + std::to_string(total_committed_) + " committed)");
    std::vector<std::uint64_t> end_value(k_, 0);
    last_completion_ns_ = mono_ns();
    if (!read_all(end_value, nullptr)) return fail(failure_);
    return report(clock, t_stop, end_value[0] - start_value[0], end_value[0]);
  }

 private:
  static int fail(const std::string& why) {
    error("counter", why);
    return kExitFailure;
  }

  std::string create_clients(const WanSpec& wan) {
    for (std::uint64_t i = 0; i < k_; ++i) {
      SpecClientOptions so;
      so.client.first_request_id = fresh_first_request_id();
      so.client.window = a_.spec_window;
      so.speculate = !a_.shim;
      so.failure_window = a_.spec_failure_window;
      std::unique_ptr<SpecClientRuntime> c;
      if (std::string err =
              SpecClientRuntime::create(base_.get(), a_.config, a_.first_id + static_cast<NodeId>(i), so, c, wan);
          !err.empty()) {
        return err;
      }
      clients_.push_back(std::move(c));
    }
    return "";
  }

  // An ordered read per client: the counter's value and (if `tokens`) the token each client must present.
  // Returns false if one failed.
  bool read_all(std::vector<std::uint64_t>& values, std::vector<std::uint64_t>* tokens) {
    std::uint64_t reads_left = k_;
    for (std::uint64_t i = 0; i < k_; ++i) {
      clients_[i]->submit(counter_read_op(), {}, false, [&, i, tokens](const SpecEvent& e) {
        if (e.kind == SpecEventKind::kFirst) return;
        CounterResult cr;
        if (e.status != shim::ShimStatus::kExecuted || !parse_counter_result(e.result, cr) || cr.status != 0) {
          failed_ = true;
          failure_ = std::string("the counter read did not execute (shim status ") +
                     std::string(shim::to_string(e.status)) + "; do the replicas run --shim?)";
          event_base_loopbreak(base_.get());
          return;
        }
        values[i] = cr.value;
        if (tokens != nullptr) (*tokens)[i] = cr.next_token;
        last_completion_ns_ = mono_ns();
        if (--reads_left == 0) event_base_loopbreak(base_.get());
      });
    }
    event_base_loop(base_.get(), 0);
    return !failed_;
  }

  // Runs the increments from the read state until every client is idle; returns when the run stopped.
  std::uint64_t run_increments(const RunClock& clock, const std::vector<std::uint64_t>& start_value,
                               const std::vector<std::uint64_t>& start_token) {
    loops_ = std::vector<SpecCounterLoop>(k_);
    measuring_ = true;
    last_completion_ns_ = clock.start_ns;
    for (std::uint64_t i = 0; i < k_; ++i) {
      SpecCounterLoop& l = loops_[i];
      l.client = clients_[i].get();
      l.window = a_.spec_window;
      l.next_token = l.committed_token = start_token[i];
      l.committed_value = start_value[i];
      if (!a_.closed_loop()) l.budget = a_.requests;
      l.on_commit = [this, &clock](std::uint64_t lat) { on_commit(clock, lat); };
      l.on_first = [this, &clock](std::uint64_t lat) {
        if (!a_.closed_loop() || clock.measuring(mono_ns())) first_lat_.push_back(lat);
      };
      l.on_idle = [this] {
        if (++idle_ == k_) event_base_loopbreak(base_.get());
      };
    }
    for (auto& l : loops_) l.pump();
    event_base_loop(base_.get(), 0);
    measuring_ = false;
    return seq_end_ns_ != 0 ? seq_end_ns_ : mono_ns();
  }

  void on_commit(const RunClock& clock, std::uint64_t lat) {
    const std::uint64_t now = mono_ns();
    last_completion_ns_ = now;
    ++total_committed_;
    if (!a_.closed_loop()) {
      if (total_committed_ > a_.warmup) commit_lat_.push_back(lat);
      if (total_committed_ == a_.requests) seq_end_ns_ = now;
      return;
    }
    if (clock.measuring(now)) {
      ++measured_ops_;
      commit_lat_.push_back(lat);
    }
    if (now >= clock.end_ns) {
      for (auto& x : loops_) x.stopped = true;
    }
  }

  // Progress on stderr while the increments run, and the no-progress watchdog.
  void on_tick() {
    const std::uint64_t now = mono_ns();
    if (static_cast<double>(now - last_completion_ns_) / 1e9 > a_.timeout_s) {
      failed_ = true;
      failure_ = "no request completed for " + std::to_string(static_cast<int>(a_.timeout_s)) + " s";
      event_base_loopbreak(base_.get());
      return;
    }
    if (!measuring_) return;
    const double dt = static_cast<double>(now - last_progress_ns_) / 1e9;
    std::fprintf(stderr, "counter: %llu committed, %.0f ops/s\n", static_cast<unsigned long long>(total_committed_),
                 static_cast<double>(total_committed_ - last_progress_done_) / dt);
    last_progress_ns_ = now;
    last_progress_done_ = total_committed_;
  }

  SpecTotals totals() const {
    SpecTotals t;
    for (std::uint64_t i = 0; i < k_; ++i) {
      t.committed += loops_[i].committed;
      t.rollbacks += loops_[i].rollbacks;
      t.retries += loops_[i].retries;
      t.violations += loops_[i].violations;
      t.bad_tokens += loops_[i].bad_tokens;
      const SpecClientStats& s = clients_[i]->stats();
      t.client.first_delivered += s.first_delivered;
      t.client.first_withheld_distrusted += s.first_withheld_distrusted;
      t.client.first_withheld_doomed += s.first_withheld_doomed;
      t.client.first_mismatches += s.first_mismatches;
      t.retransmissions += clients_[i]->client_stats().retransmissions;
    }
    return t;
  }

  // Prints the result and checks it; `delta` is how far the counter moved (meaningful with one client).
  int report(const RunClock& clock, std::uint64_t t_stop, std::uint64_t delta, std::uint64_t final_value) {
    const SpecTotals t = totals();
    const char* system = a_.shim ? "pbft-shim" : "pbftcs";
    const double p50 = percentile_us(commit_lat_, 0.5), p99 = percentile_us(commit_lat_, 0.99);
    const double first_p50 = percentile_us(first_lat_, 0.5);
    JsonObject o;
    o.add("system", system).add("window", std::uint64_t{a_.spec_window});
    if (!a_.closed_loop()) {
      o.add("mode", "sequential").add("requests", a_.requests).add("total_ms", static_cast<double>(t_stop - clock.start_ns) / 1e6);
    } else {
      const double measured_s = clock.measured_s(t_stop);
      o.add("mode", "closed-loop").add("clients", k_).add("duration_s", measured_s).add("ops", measured_ops_)
          .add("ops_per_s", measured_s > 0 ? static_cast<double>(measured_ops_) / measured_s : 0.0);
    }
    o.add("p50_us", p50).add("p99_us", p99).add("first_p50_us", first_p50).add("committed", t.committed)
        .add("counter_delta", delta).add("final_value", final_value).add("rollbacks", t.rollbacks)
        .add("retries", t.retries).add("violations", t.violations).add("bad_tokens", t.bad_tokens)
        .add("first_delivered", t.client.first_delivered).add("first_mismatches", t.client.first_mismatches)
        .add("first_withheld_distrusted", t.client.first_withheld_distrusted)
        .add("first_withheld_doomed", t.client.first_withheld_doomed).add("retransmissions", t.retransmissions);
    if (a_.json) {
      std::printf("%s\n", o.str().c_str());
    } else {
      std::printf("%s %s: %llu committed; commit latency p50 %.1f us p99 %.1f us, first reply p50 %.1f us; "
                  "rollbacks=%llu retries=%llu counter moved by %llu\n",
                  system, a_.closed_loop() ? "closed loop" : "sequential", static_cast<unsigned long long>(t.committed),
                  p50, p99, first_p50, static_cast<unsigned long long>(t.rollbacks),
                  static_cast<unsigned long long>(t.retries), static_cast<unsigned long long>(delta));
    }
    const bool count_ok = k_ != 1 || delta == t.committed;
    if (t.violations == 0 && t.bad_tokens == 0 && count_ok) return kExitOk;
    return fail("PBFT-CS check failed: " + std::to_string(t.violations) +
                " increments executed that relied on a failed prediction, " + std::to_string(t.bad_tokens) +
                " stale tokens reached the counter, counter moved by " + std::to_string(delta) + " for " +
                std::to_string(t.committed) + " committed increments");
  }

  const CounterArgs& a_;
  const std::uint64_t k_;
  EventBasePtr base_;
  std::vector<std::unique_ptr<SpecClientRuntime>> clients_;
  std::vector<SpecCounterLoop> loops_;
  std::vector<std::uint64_t> commit_lat_, first_lat_;
  bool failed_ = false;
  std::string failure_;
  bool measuring_ = false;  // the increments run (progress is printed)
  std::uint64_t last_progress_ns_ = 0;
  std::uint64_t last_progress_done_ = 0;
  std::uint64_t last_completion_ns_ = 0;
  std::uint64_t total_committed_ = 0;
  std::uint64_t measured_ops_ = 0;
  std::uint64_t seq_end_ns_ = 0;
  std::uint64_t idle_ = 0;  // clients with nothing in flight and nothing more to submit
};

}  // namespace

int run_spec_counter(const CounterArgs& args) {
  SpecCounterRun run(args);
  return run.run();
}

}  // namespace bftfs::cli
