// bftfs counter: the PBFT-CS counter benchmark client (NSDI'09 §6.1). Each increment presents the token of
// the previous reply, so one client's requests are strictly sequential.
//   sequential mode (default): one client, N increments, prints total time and latency percentiles;
//   closed loop (--clients K): K clients in one event loop for S seconds, prints throughput.
// With --spec the PBFT-CS client of cli_counter_spec.cc runs instead.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <vector>

#include "cli/cli_common.h"
#include "cli/cli_counter.h"
#include "common/assert.h"
#include "common/log.h"
#include "os/clock.h"
#include "runtime/client_runtime.h"
#include "runtime/status_file.h"
#include "runtime/transport.h"
#include "services/counter_service.h"

namespace bftfs::cli {

RunClock::RunClock(double warmup_s, double duration_s)
    : start_ns(mono_ns()),
      measure_ns(start_ns + static_cast<std::uint64_t>(warmup_s * 1e9)),
      end_ns(measure_ns + static_cast<std::uint64_t>(duration_s * 1e9)) {}

double RunClock::measured_s(std::uint64_t stop_ns) const {
  return static_cast<double>(std::min(stop_ns, end_ns) - measure_ns) / 1e9;
}

EverySecond::EverySecond(event_base* base, std::function<void()> fn) : fn_(std::move(fn)) {
  event_.reset(event_new(
      base, -1, EV_PERSIST, [](int, short, void* self) { static_cast<EverySecond*>(self)->fn_(); }, this));
  BFT_ASSERT(event_ != nullptr);
  const timeval one_s{1, 0};
  event_add(event_.get(), &one_s);
}

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

// One run of plain counter clients: create them, run the loops until the run ends, report.
class PlainCounterRun {
 public:
  explicit PlainCounterRun(const CounterArgs& a) : a_(a), k_(a.client_count()) {}

  int run() {
    const WanSpec wan = wan_spec(a_.wan);
    base_ = make_event_base(wan.enabled());
    if (base_ == nullptr) {
      error("counter", "cannot create an event base");
      return kExitFailure;
    }
    if (std::string err = create_clients(wan); !err.empty()) {
      error("counter", err);
      return kExitFailure;
    }
    loops_.resize(k_);
    latencies_.reserve(a_.closed_loop() ? 1u << 20 : a_.requests);
    clock_.emplace(a_.warmup_s, a_.duration_s);
    last_progress_ns_ = last_completion_ns_ = clock_->start_ns;
    for (std::uint64_t i = 0; i < k_; ++i) {
      CounterLoop& l = loops_[i];
      l.client = clients_[i].get();
      l.token = counter_initial_token(l.client->id());
      l.on_done = [this, &l](std::uint64_t lat, bool counted) { return on_done(l, lat, counted); };
    }
    EverySecond watchdog(base_.get(), [this] { on_tick(); });
    for (auto& l : loops_) l.next();
    event_base_loop(base_.get(), 0);
    const std::uint64_t t_stop = seq_end_ns_ != 0 ? seq_end_ns_ : mono_ns();
    if (failed_) {
      error("counter", failure_ + " (" + std::to_string(total_done_) + " completed)");
      return kExitFailure;
    }
    report(t_stop);
    return kExitOk;
  }

 private:
  std::string create_clients(const WanSpec& wan) {
    ReplicaAddress server;
    if (!a_.server.empty()) {
      const std::string err = parse_host_port(a_.server, server);
      BFT_ASSERT(err.empty());  // checked by the option's validator
    }
    for (std::uint64_t i = 0; i < k_; ++i) {
      const NodeId id = a_.first_id + static_cast<NodeId>(i);
      std::string err;
      if (a_.norep) {
        std::unique_ptr<DirectClient> c;
        err = DirectClient::create(base_.get(), a_.config, id, server, c, wan);
        clients_.push_back(std::move(c));
      } else {
        std::unique_ptr<ClientRuntime> c;
        ClientOptions co;
        co.first_request_id = fresh_first_request_id();
        err = ClientRuntime::create(base_.get(), a_.config, id, co, c, wan);
        clients_.push_back(std::move(c));
      }
      if (!err.empty()) return err;
    }
    return "";
  }

  // A completed increment of `l`; returns false to stop that client.
  bool on_done(const CounterLoop& l, std::uint64_t lat, bool counted) {
    const std::uint64_t now = mono_ns();
    last_completion_ns_ = now;
    if (!counted) {
      if (l.malformed == 0) return true;  // a resync: retry with the token the service told us
      failed_ = true;
      failure_ = "malformed counter result";
      event_base_loopbreak(base_.get());
      return false;
    }
    ++total_done_;
    if (a_.timeline_ms > 0) {
      // Window i counts increments completed in [start + i*W, start + (i+1)*W), warm-up included.
      const std::size_t window = static_cast<std::size_t>((now - clock_->start_ns) / (a_.timeline_ms * 1000000ull));
      if (timeline_.size() <= window) timeline_.resize(window + 1, 0);
      ++timeline_[window];
    }
    if (a_.closed_loop()) {
      if (now >= clock_->end_ns) {
        event_base_loopbreak(base_.get());
        return false;
      }
      if (now >= clock_->measure_ns) {
        ++measured_ops_;
        latencies_.push_back(lat);
      }
      return true;
    }
    if (total_done_ > a_.warmup) latencies_.push_back(lat);
    if (total_done_ < a_.requests) return true;
    seq_end_ns_ = now;
    event_base_loopbreak(base_.get());
    return false;
  }

  // Progress on stderr, and the no-progress watchdog.
  void on_tick() {
    const std::uint64_t now = mono_ns();
    if (static_cast<double>(now - last_completion_ns_) / 1e9 > a_.timeout_s) {
      failed_ = true;
      failure_ = "no request completed for " + std::to_string(static_cast<int>(a_.timeout_s)) + " s";
      event_base_loopbreak(base_.get());
      return;
    }
    if (a_.closed_loop() && now >= clock_->end_ns + 2000000000ull) {
      event_base_loopbreak(base_.get());  // every client is blocked: stop anyway
      return;
    }
    const double dt = static_cast<double>(now - last_progress_ns_) / 1e9;
    std::fprintf(stderr, "counter: %llu done, %.0f ops/s\n", static_cast<unsigned long long>(total_done_),
                 static_cast<double>(total_done_ - last_progress_done_) / dt);
    last_progress_ns_ = now;
    last_progress_done_ = total_done_;
  }

  void report(std::uint64_t t_stop) {
    std::uint64_t retrans = 0, resyncs = 0, value = 0;
    for (std::uint64_t i = 0; i < k_; ++i) {
      retrans += clients_[i]->retransmissions();
      resyncs += loops_[i].resyncs;
      value = std::max(value, loops_[i].last_value);
    }
    const double p50 = percentile_us(latencies_, 0.50);
    const double p99 = percentile_us(latencies_, 0.99);
    double mean = 0;
    for (auto v : latencies_) mean += static_cast<double>(v);
    mean = latencies_.empty() ? 0 : mean / static_cast<double>(latencies_.size()) / 1e3;
    const char* system = a_.norep ? "norep" : "pbft";
    if (!a_.closed_loop()) {
      const double total_ms = static_cast<double>(t_stop - clock_->start_ns) / 1e6;
      if (a_.json) {
        JsonObject o;
        o.add("mode", "sequential").add("system", system).add("requests", a_.requests).add("total_ms", total_ms)
            .add("p50_us", p50).add("p99_us", p99).add("mean_us", mean).add("final_value", value)
            .add("retransmissions", retrans).add("resyncs", resyncs);
        std::printf("%s\n", o.str().c_str());
      } else {
        std::printf("%s sequential: %llu increments in %.1f ms; latency p50 %.1f us, p99 %.1f us, mean %.1f us; "
                    "counter=%llu retransmissions=%llu resyncs=%llu\n",
                    system, static_cast<unsigned long long>(a_.requests), total_ms, p50, p99, mean,
                    static_cast<unsigned long long>(value), static_cast<unsigned long long>(retrans),
                    static_cast<unsigned long long>(resyncs));
      }
      return;
    }
    report_closed_loop(t_stop, system, p50, p99, mean, retrans, resyncs);
  }

  void report_closed_loop(std::uint64_t t_stop, const char* system, double p50, double p99, double mean,
                          std::uint64_t retrans, std::uint64_t resyncs) {
    const double measured_s = clock_->measured_s(t_stop);
    const double ops_s = measured_s > 0 ? static_cast<double>(measured_ops_) / measured_s : 0;
    if (a_.json) {
      JsonObject o;
      o.add("mode", "closed-loop").add("system", system).add("clients", k_).add("duration_s", measured_s)
          .add("ops", measured_ops_).add("ops_per_s", ops_s).add("p50_us", p50).add("p99_us", p99)
          .add("mean_us", mean).add("retransmissions", retrans).add("resyncs", resyncs);
      if (a_.timeline_ms > 0) {
        o.add("timeline_ms", a_.timeline_ms).add("timeline_start_mono_ns", clock_->start_ns).add("timeline", timeline_);
      }
      std::printf("%s\n", o.str().c_str());
    } else {
      std::printf("%s closed loop: %llu clients, %llu increments in %.2f s = %.0f ops/s; latency p50 %.1f us, "
                  "p99 %.1f us; retransmissions=%llu\n",
                  system, static_cast<unsigned long long>(k_), static_cast<unsigned long long>(measured_ops_),
                  measured_s, ops_s, p50, p99, static_cast<unsigned long long>(retrans));
    }
  }

  const CounterArgs& a_;
  const std::uint64_t k_;
  EventBasePtr base_;
  std::vector<std::unique_ptr<SubmitClient>> clients_;
  std::vector<CounterLoop> loops_;
  std::vector<std::uint64_t> latencies_;
  std::optional<RunClock> clock_;  // set when the clients exist (the run starts)
  std::uint64_t measured_ops_ = 0;
  std::uint64_t total_done_ = 0;
  std::uint64_t last_progress_ns_ = 0;
  std::uint64_t last_progress_done_ = 0;
  std::uint64_t last_completion_ns_ = 0;
  std::uint64_t seq_end_ns_ = 0;
  std::vector<std::uint64_t> timeline_;
  bool failed_ = false;
  std::string failure_;
};

int run_counter(const CounterArgs& a) {
  log_set_level(log_level_of(a.log_level));
  if (a.spec) return run_spec_counter(a);
  PlainCounterRun run(a);
  return run.run();
}

}  // namespace

void add_counter(CLI::App& root, Commands& out) {
  auto a = std::make_shared<CounterArgs>();
  CLI::App* app = root.add_subcommand("counter",
      "run counter clients against a cluster or a NO-REP server; prints latency or throughput\n\n"
      "Runs counter clients against the PBFT cluster of CONFIG (or, with --norep, the NO-REP server).\n"
      "Without --clients: one client performs N sequential increments and prints the total time and\n"
      "latency percentiles. With --clients K: clients ID..ID+K-1 run closed loops in one process for S\n"
      "seconds and the throughput is printed. Progress goes to stderr every second.");
  app->add_option("--config", a->config, "cluster.conf written by keygen")->type_name("FILE")->required();
  app->add_option("--id", a->first_id, "first client id to use")->type_name("CLIENT_ID")->required()
      ->transform(decimal(0, UINT32_MAX));
  app->add_option("--requests", a->requests, "sequential increments")->type_name("N")->transform(decimal(1, 100000000));
  app->add_option("--warmup", a->warmup, "sequential: first N requests excluded from the percentiles")
      ->type_name("N")->transform(decimal(0, 100000000));
  CLI::Option* norep = app->add_flag("--norep", a->norep, "talk to the NO-REP server instead of the replicas");
  app->add_option("--server", a->server, "NO-REP server address (default: replica 0's address)")
      ->type_name("HOST:PORT")->check(host_port());
  app->add_option("--clients", a->clients, "closed-loop mode with K clients")->type_name("K")->transform(decimal(1, 4096))
      ->default_str("");
  app->add_option("--duration-s", a->duration_s, "closed-loop duration in seconds")->type_name("S")->check(non_negative_number());
  app->add_option("--warmup-s", a->warmup_s, "closed-loop: seconds excluded from the measurement")
      ->type_name("S")->check(non_negative_number());
  app->add_option("--timeout-s", a->timeout_s, "give up when no request completes for this long")
      ->type_name("S")->check(non_negative_number());
  app->add_option("--timeline-ms", a->timeline_ms,
                  "closed-loop: also report successful increments per W ms window (JSON keys timeline_ms, "
                  "timeline_start_mono_ns, timeline), for measuring recovery after a fault")
      ->type_name("W")->transform(decimal(0, 60000));
  app->add_flag("--spec", a->spec, "PBFT-CS client: speculate on the primary's early replies, predicated increments "
                "(replicas need --shim and --early-replies)")->excludes(norep);
  app->add_flag("--shim", a->shim, "with --spec: do not speculate (wait for consensus) but still talk to --shim replicas");
  app->add_option("--spec-window", a->spec_window, "with --spec: increments in flight per client (PBFT-CS(W))")
      ->type_name("W")->transform(decimal(1, 64));
  app->add_option("--spec-failure-window", a->spec_failure_window,
                  "with --spec: stop speculating on a replica while more than 1% of its last N first replies "
                  "failed (0: never stop)")
      ->type_name("N")->transform(decimal(0, 100000));
  app->add_flag("--json", a->json, "print one JSON object instead of text");
  add_log_level(*app, a->log_level, "debug|info|warn|error");
  add_wan_options(*app, a->wan);
  out.push_back({app, [a] { return run_counter(*a); }});
}

}  // namespace bftfs::cli
