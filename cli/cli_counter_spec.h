// bftfs counter --spec: the PBFT-CS counter client (see cli_counter_spec.cc).
#pragma once

#include <cstdint>
#include <string>

#include "common/types.h"
#include "runtime/wan.h"

namespace bftfs::cli {

struct SpecCounterArgs {
  std::string config;
  NodeId first_id = 0;
  std::uint64_t requests = 2000;  // sequential mode: increments to commit
  std::uint64_t warmup = 10;      // sequential: first N commits excluded from the percentiles
  std::uint64_t clients = 0;      // 0: sequential mode with one client; K: closed loop with K clients
  double duration_s = 10;
  double warmup_s = 1;
  double timeout_s = 20;
  std::uint32_t window = 64;  // increments in flight per client
  bool speculate = true;      // false: wait for consensus (PBFT through the shim)
  std::uint32_t failure_window = 100;  // §3.4's n; 0: never stop speculating on a failing primary
  bool json = false;
  WanSpec wan;  // the emulated wide-area delay (the same spec as the replicas')
};

// Runs the clients; returns the process exit code.
int run_spec_counter(const SpecCounterArgs& args);

}  // namespace bftfs::cli
