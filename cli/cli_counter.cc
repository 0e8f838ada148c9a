// bftfs counter: the PBFT-CS counter benchmark client (NSDI'09 §6.1). Each increment presents the token of
// the previous reply, so one client's requests are strictly sequential.
//   sequential mode (default): one client, N increments, prints total time and latency percentiles;
//   closed loop (--clients K): K clients in one event loop for S seconds, prints throughput.
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <vector>

#include "os/clock.h"
#include "common/log.h"
#include "cli/cli_common.h"
#include "cli/cli_counter_spec.h"
#include "runtime/client_runtime.h"
#include "runtime/status_file.h"
#include "services/counter_service.h"

namespace bftfs::cli {
namespace {

// One closed-loop counter client: increments forever (until stopped), each with the previous token.
struct CounterLoop {
  SubmitClient* client = nullptr;
  std::uint64_t token = 0;
  std::uint64_t sent_ns = 0;
  std::uint64_t completed = 0;  // successful increments
  std::uint64_t resyncs = 0;    // bad-token answers (a previous run of this client id left another token)
  std::uint64_t malformed = 0;
  std::uint64_t last_value = 0;
  bool stopped = false;
  // Called with every completed increment's latency; returns false to stop this client.
  std::function<bool(std::uint64_t latency_ns, bool counted)> on_done;

  void next() {
    if (stopped) return;
    sent_ns = mono_ns();
    client->submit(counter_increment_op(token), false, [this](const Completion& c) { done(c); });
  }
  void done(const Completion& c) {
    const std::uint64_t lat = mono_ns() - sent_ns;
    CounterResult r;
    bool counted = false;
    if (!parse_counter_result(c.result, r)) {
      ++malformed;
    } else if (r.status == 0) {
      ++completed;
      counted = true;
      last_value = r.value;
      token = r.next_token;
    } else if (r.status == 1) {
      ++resyncs;
      token = r.next_token;
    } else {
      ++malformed;
    }
    if (malformed > 0) {
      stopped = true;
      if (on_done) on_done(lat, false);
      return;
    }
    if (on_done && !on_done(lat, counted)) {
      stopped = true;
      return;
    }
    next();
  }
};

}  // namespace

int cmd_counter(int argc, char** argv) {
  ArgParser p("counter",
              "Runs counter clients against the PBFT cluster of CONFIG (or, with --norep, the NO-REP server).\n"
              "Without --clients: one client performs N sequential increments and prints the total time and\n"
              "latency percentiles. With --clients K: clients ID..ID+K-1 run closed loops in one process for S\n"
              "seconds and the throughput is printed. Progress goes to stderr every second.");
  p.option("config", "FILE", "cluster.conf written by keygen").required("config");
  p.option("id", "CLIENT_ID", "first client id to use").required("id");
  p.option("requests", "N", "sequential increments", "2000");
  p.option("warmup", "N", "sequential: first N requests excluded from the percentiles", "10");
  p.flag("norep", "talk to the NO-REP server instead of the replicas");
  p.option("server", "HOST:PORT", "NO-REP server address (default: replica 0's address)");
  p.option("clients", "K", "closed-loop mode with K clients");
  p.option("duration-s", "S", "closed-loop duration in seconds", "10");
  p.option("warmup-s", "S", "closed-loop: seconds excluded from the measurement", "1");
  p.option("timeout-s", "S", "give up when no request completes for this long", "20");
  p.option("timeline-ms", "W", "closed-loop: also report successful increments per W ms window (JSON keys timeline_ms, "
           "timeline_start_mono_ns, timeline), for measuring recovery after a fault", "0");
  p.flag("spec", "PBFT-CS client: speculate on the primary's early replies, predicated increments (replicas need "
         "--shim and --early-replies)");
  p.flag("shim", "with --spec: do not speculate (wait for consensus) but still talk to --shim replicas");
  p.option("spec-window", "W", "with --spec: increments in flight per client (PBFT-CS(W))", "64");
  p.option("spec-failure-window", "N", "with --spec: stop speculating on a replica while more than 1% of its last N "
           "first replies failed (0: never stop)", "100");
  p.flag("json", "print one JSON object instead of text");
  p.option("log-level", "LEVEL", "debug|info|warn|error", "warn");
  add_wan_options(p);
  if (auto rc = p.parse(argc, argv, 2)) return *rc;
  bool ok = true;
  const auto first_id = static_cast<NodeId>(p.get_u64("id", ok, 0, UINT32_MAX));
  const auto requests = p.get_u64("requests", ok, 1, 100000000);
  const auto warmup = p.get_u64("warmup", ok, 0, 100000000);
  const bool closed_loop = p.has("clients");
  const auto k = closed_loop ? p.get_u64("clients", ok, 1, 4096) : 1;
  const double duration_s = p.get_double("duration-s", ok);
  const double warmup_s = p.get_double("warmup-s", ok);
  const double timeout_s = p.get_double("timeout-s", ok);
  const auto timeline_ms = p.get_u64("timeline-ms", ok, 0, 60000);
  const auto spec_window = p.get_u64("spec-window", ok, 1, 64);
  const auto spec_failure_window = p.get_u64("spec-failure-window", ok, 0, 100000);
  if (!ok) return kExitUsage;
  WanSpec wan;
  if (!ok || !get_wan_options(p, wan)) return kExitUsage;
  const std::string lvl = p.get("log-level");
  log_set_level(lvl == "debug" ? LogLevel::kDebug
                : lvl == "info" ? LogLevel::kInfo
                : lvl == "error" ? LogLevel::kError
                                 : LogLevel::kWarn);
  const bool norep = p.has("norep");
  if (p.has("spec")) {
    if (norep) {
      error("counter", "--spec and --norep exclude each other");
      return kExitUsage;
    }
    SpecCounterArgs a;
    a.config = p.get("config");
    a.first_id = first_id;
    a.requests = requests;
    a.warmup = warmup;
    a.clients = closed_loop ? k : 0;
    a.duration_s = duration_s;
    a.warmup_s = warmup_s;
    a.timeout_s = timeout_s;
    a.window = static_cast<std::uint32_t>(spec_window);
    a.speculate = !p.has("shim");
    a.failure_window = static_cast<std::uint32_t>(spec_failure_window);
    a.json = p.has("json");
    a.wan = wan;
    return run_spec_counter(a);
  }
  ReplicaAddress server;
  if (p.has("server")) {
    if (std::string err = parse_host_port(p.get("server"), server); !err.empty()) {
      error("counter", "--server: " + err);
      return kExitUsage;
    }
  }

  EventBasePtr base = make_event_base(wan.enabled());
  if (base == nullptr) {
    error("counter", "cannot create an event base");
    return kExitFailure;
  }
  std::vector<std::unique_ptr<SubmitClient>> clients;
  for (std::uint64_t i = 0; i < k; ++i) {
    const NodeId id = first_id + static_cast<NodeId>(i);
    std::string err;
    if (norep) {
      std::unique_ptr<DirectClient> c;
      err = DirectClient::create(base.get(), p.get("config"), id, server, c, wan);
      clients.push_back(std::move(c));
    } else {
      std::unique_ptr<ClientRuntime> c;
      ClientOptions co;
      co.first_request_id = fresh_first_request_id();
      err = ClientRuntime::create(base.get(), p.get("config"), id, co, c, wan);
      clients.push_back(std::move(c));
    }
    if (!err.empty()) {
      error("counter", err);
      return kExitFailure;
    }
  }

  std::vector<CounterLoop> loops(k);
  std::vector<std::uint64_t> latencies;
  latencies.reserve(closed_loop ? 1u << 20 : requests);
  const std::uint64_t t_start = mono_ns();
  const std::uint64_t t_measure = t_start + static_cast<std::uint64_t>(warmup_s * 1e9);
  const std::uint64_t t_end = t_measure + static_cast<std::uint64_t>(duration_s * 1e9);
  std::uint64_t measured_ops = 0;
  std::uint64_t total_done = 0;
  std::uint64_t last_progress_ns = t_start;
  std::uint64_t last_progress_done = 0;
  std::uint64_t last_completion_ns = t_start;
  std::uint64_t seq_end_ns = 0;
  // Window i counts increments completed in [t_start + i*W, t_start + (i+1)*W), warm-up included.
  std::vector<std::uint64_t> timeline;
  bool failed = false;
  std::string failure;

  for (std::uint64_t i = 0; i < k; ++i) {
    CounterLoop& l = loops[i];
    l.client = clients[i].get();
    l.token = counter_initial_token(l.client->id());
    CounterLoop* lp = &l;
    l.on_done = [&, lp, closed_loop](std::uint64_t lat, bool counted) -> bool {
      const std::uint64_t now = mono_ns();
      last_completion_ns = now;
      if (!counted) {
        if (lp->malformed > 0) {
          failed = true;
          failure = "malformed counter result";
          event_base_loopbreak(base.get());
          return false;
        }
        return true;  // a resync: retry with the token the service told us
      }
      ++total_done;
      if (timeline_ms > 0) {
        const std::size_t window = static_cast<std::size_t>((now - t_start) / (timeline_ms * 1000000ull));
        if (timeline.size() <= window) timeline.resize(window + 1, 0);
        ++timeline[window];
      }
      if (closed_loop) {
        if (now >= t_end) {
          event_base_loopbreak(base.get());
          return false;
        }
        if (now >= t_measure) {
          ++measured_ops;
          latencies.push_back(lat);
        }
        return true;
      }
      if (total_done > warmup) latencies.push_back(lat);
      if (total_done >= requests) {
        seq_end_ns = now;
        event_base_loopbreak(base.get());
        return false;
      }
      return true;
    };
  }

  // Progress and the no-progress watchdog.
  struct Ctx {
    std::function<void()> fn;
  } watchdog_ctx;
  watchdog_ctx.fn = [&] {
    const std::uint64_t now = mono_ns();
    if (static_cast<double>(now - last_completion_ns) / 1e9 > timeout_s) {
      failed = true;
      failure = "no request completed for " + std::to_string(static_cast<int>(timeout_s)) + " s";
      event_base_loopbreak(base.get());
      return;
    }
    if (closed_loop && now >= t_end + 2000000000ull) {
      event_base_loopbreak(base.get());  // every client is blocked: stop anyway
      return;
    }
    const double dt = static_cast<double>(now - last_progress_ns) / 1e9;
    std::fprintf(stderr, "counter: %llu done, %.0f ops/s\n", static_cast<unsigned long long>(total_done),
                 static_cast<double>(total_done - last_progress_done) / dt);
    last_progress_ns = now;
    last_progress_done = total_done;
  };
  EventPtr watchdog(event_new(
      base.get(), -1, EV_PERSIST, [](int, short, void* a) { static_cast<Ctx*>(a)->fn(); }, &watchdog_ctx));
  const timeval one_s{1, 0};
  event_add(watchdog.get(), &one_s);

  for (auto& l : loops) l.next();
  event_base_loop(base.get(), 0);
  const std::uint64_t t_stop = seq_end_ns != 0 ? seq_end_ns : mono_ns();

  std::uint64_t retrans = 0;
  std::uint64_t resyncs = 0;
  std::uint64_t value = 0;
  for (std::uint64_t i = 0; i < k; ++i) {
    retrans += clients[i]->retransmissions();
    resyncs += loops[i].resyncs;
    value = std::max(value, loops[i].last_value);
  }
  if (failed) {
    error("counter", failure + " (" + std::to_string(total_done) + " completed)");
    return kExitFailure;
  }
  const double p50 = percentile_us(latencies, 0.50);
  const double p99 = percentile_us(latencies, 0.99);
  double mean = 0;
  for (auto v : latencies) mean += static_cast<double>(v);
  mean = latencies.empty() ? 0 : mean / static_cast<double>(latencies.size()) / 1e3;
  const char* system = norep ? "norep" : "pbft";
  if (!closed_loop) {
    const double total_ms = static_cast<double>(t_stop - t_start) / 1e6;
    if (p.has("json")) {
      JsonObject o;
      o.add("mode", "sequential").add("system", system).add("requests", requests).add("total_ms", total_ms)
          .add("p50_us", p50).add("p99_us", p99).add("mean_us", mean).add("final_value", value)
          .add("retransmissions", retrans).add("resyncs", resyncs);
      std::printf("%s\n", o.str().c_str());
    } else {
      std::printf("%s sequential: %llu increments in %.1f ms; latency p50 %.1f us, p99 %.1f us, mean %.1f us; "
                  "counter=%llu retransmissions=%llu resyncs=%llu\n",
                  system, static_cast<unsigned long long>(requests), total_ms, p50, p99, mean,
                  static_cast<unsigned long long>(value), static_cast<unsigned long long>(retrans),
                  static_cast<unsigned long long>(resyncs));
    }
  } else {
    const double measured_s = static_cast<double>(std::min(t_stop, t_end) - t_measure) / 1e9;
    const double ops_s = measured_s > 0 ? static_cast<double>(measured_ops) / measured_s : 0;
    if (p.has("json")) {
      JsonObject o;
      o.add("mode", "closed-loop").add("system", system).add("clients", k).add("duration_s", measured_s)
          .add("ops", measured_ops).add("ops_per_s", ops_s).add("p50_us", p50).add("p99_us", p99)
          .add("mean_us", mean).add("retransmissions", retrans).add("resyncs", resyncs);
      if (timeline_ms > 0) {
        o.add("timeline_ms", timeline_ms).add("timeline_start_mono_ns", t_start).add("timeline", timeline);
      }
      std::printf("%s\n", o.str().c_str());
    } else {
      std::printf("%s closed loop: %llu clients, %llu increments in %.2f s = %.0f ops/s; latency p50 %.1f us, "
                  "p99 %.1f us; retransmissions=%llu\n",
                  system, static_cast<unsigned long long>(k), static_cast<unsigned long long>(measured_ops),
                  measured_s, ops_s, p50, p99, static_cast<unsigned long long>(retrans));
    }
  }
  return kExitOk;
}

}  // namespace bftfs::cli
