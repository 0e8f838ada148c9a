// bftfs counter: what the plain client (cli_counter.cc) and the PBFT-CS client (cli_counter_spec.cc) share:
// the options, the clock of a measured run and the once-a-second timer of progress and no-progress checks.
// Private to those two files.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "cli/cli_options.h"
#include "common/types.h"
#include "runtime/event_raii.h"

namespace bftfs::cli {

struct CounterArgs {
  std::string config;
  NodeId first_id = 0;
  std::uint64_t requests = 2000;  // sequential mode: increments
  std::uint64_t warmup = 10;      // sequential: first N requests excluded from the percentiles
  bool norep = false;
  std::string server;             // NO-REP server; empty: replica 0's address
  std::uint64_t clients = 0;      // 0: sequential mode with one client; K: closed loop with K clients
  double duration_s = 10;
  double warmup_s = 1;
  double timeout_s = 20;
  std::uint64_t timeline_ms = 0;
  bool spec = false;
  bool shim = false;              // with spec: do not speculate (wait for consensus)
  std::uint32_t spec_window = 64;
  std::uint32_t spec_failure_window = 100;
  bool json = false;
  std::string log_level = "warn";
  WanArgs wan;

  bool closed_loop() const { return clients != 0; }
  std::uint64_t client_count() const { return clients == 0 ? 1 : clients; }
};

// Runs the PBFT-CS counter clients (--spec); returns the process exit code.
int run_spec_counter(const CounterArgs& args);

// The phases of a closed-loop run in mono_ns time: warm-up from start_ns, the measurement from measure_ns to
// end_ns.
struct RunClock {
  std::uint64_t start_ns = 0;
  std::uint64_t measure_ns = 0;
  std::uint64_t end_ns = 0;

  // Starts now.
  RunClock(double warmup_s, double duration_s);
  bool measuring(std::uint64_t now_ns) const { return now_ns >= measure_ns && now_ns < end_ns; }
  // The measured seconds of a run that stopped at stop_ns.
  double measured_s(std::uint64_t stop_ns) const;
};

// Calls `fn` once a second on `base` until destroyed. Not copyable or movable (the event refers to it).
class EverySecond {
 public:
  EverySecond(event_base* base, std::function<void()> fn);
  EverySecond(const EverySecond&) = delete;
  EverySecond& operator=(const EverySecond&) = delete;

 private:
  std::function<void()> fn_;
  EventPtr event_;
};

}  // namespace bftfs::cli
