// The scenario of one seed: everything the seed decides before its run starts (cluster size, service, fault
// mode and rates, Byzantine replicas and their strategies, protocol options, network, workload). Drawn from
// streams of its own (sim/mix.h), so that a seed's scenario does not depend on the run's dynamics, and every
// option added later draws from a new stream, leaving every older seed's scenario as it was (the seeds of
// sim/regression-seeds.txt keep replaying what they were found with).
//
// The seeded run (sim/simulation.h) builds its cluster, faults and clients from a Scenario; `describe()` is the
// one-line summary printed with every result.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "protocol/client.h"
#include "protocol/replica.h"
#include "shim/shim.h"
#include "services/fs/fs_service.h"
#include "sim/byzantine.h"
#include "sim/fs_epoch_client.h"
#include "sim/fs_workload.h"
#include "sim/network.h"
#include "sim/service_stack.h"
#include "sim/simulator.h"

namespace bftfs::sim {

inline constexpr std::uint32_t kPpm = 1'000'000;
inline constexpr std::uint32_t kClients = 3;          // clients of every seed (plus the pipelining one)
inline constexpr std::uint32_t kPipelineWindow = 8;   // requests in flight of the pipelining client (null variant)
inline constexpr std::uint32_t kSpecWindowMax = 8;    // increments in flight of a speculating client (1..8)
inline constexpr std::uint32_t kEpochClientWindow = 4;  // requests in flight of an epoch client (more are held)
// The overload scenario ("overload", file service): the replicas share one machine that takes in a few KiB per
// tick, and many plain clients, joining one after another, keep several requests each in flight: the cluster is
// offered far more than it executes per tick, and a backlog builds in front of every replica.
inline constexpr std::uint32_t kOverloadClients = 16;

// The fault mode of a seed: what its fault phase does besides the network's delay.
enum class Mode { kCalm, kNetwork, kCrash, kAllCrash, kByzantine };
const char* to_string(Mode m);

struct Scenario {
  Mode mode = Mode::kCalm;
  std::uint32_t f = 1;
  std::uint32_t n = 4;
  std::uint32_t clients = kClients;
  ServiceKind service = ServiceKind::kCounter;
  bool pipelining_client = false;  // null variant: the last client keeps several requests in flight
  std::vector<std::pair<NodeId, Strategy>> byzantine;
  std::uint32_t crash_ppm = 0;  // per tick
  std::uint64_t downtime_min = 20;
  std::uint64_t downtime_max = 400;
  std::uint64_t all_crash_tick = 0;  // Mode::kAllCrash
  // Mode::kAllCrash (scenario "all-crash-checkpoint", never drawn at random): every replica crashes at the first
  // tick from all_crash_tick on at which 2f+1 replicas hold a CheckpointRecord that is not durable yet (their
  // service checkpoints are in their stores, the log records of that step are not), losing every record not
  // synced; this needs the runtime's asynchronous sync, which the scenario forces. If that never happens, there
  // is no all-crash.
  bool all_crash_at_checkpoint = false;
  NetworkOptions net;
  std::uint32_t partition_ppm = 0;
  std::uint32_t slow_ppm = 0;
  std::uint32_t read_percent = 20;
  std::uint32_t think_ticks_max = 10;
  ReplicaOptions replica;
  ClientOptions client;
  // PBFT-CS (NSDI'09 §3), drawn from a stream of its own (make_scenario).
  bool shim = false;  // the replicas run the counter behind shim::Shim; the clients relay/spec_client.h
  shim::ShimOptions shim_options;
  std::vector<std::uint32_t> spec_windows;  // per client: 0 = does not speculate, else increments in flight
  std::uint32_t failure_window = 100;       // SpecClientOptions: the 1% rule of §3.4
  std::uint32_t failure_permille_max = 10;
  // The Byzantine replicas lie in their early replies when primary (Byzantine::set_early_lies).
  bool lying = false;
  std::uint32_t early_lie_ppm = 0;
  std::uint32_t fake_ppm = 0;
  // File-service seeds (service kFs), drawn from a stream of their own: the replicas' FsOptions (few partitions,
  // so that state transfer moves real ones) and the clients' workload.
  fs::FsOptions fs_options;
  FsWorkloadOptions fs_workload;
  // File-service seeds with an epoch client (sim/fs_epoch_client.h), drawn from a stream of their own: 1 + the
  // index of the client that runs epochs instead of sending its requests (0: none), and its options.
  std::uint32_t epoch_client = 0;
  EpochClientOptions epoch_options;
  // The overload scenario (kOverloadClients): a correct primary, no faults, and a load the machine cannot keep
  // up with; the run fails if a correct replica starts a view change (queueing is not a faulty primary).
  bool overload = false;
  std::uint32_t client_window = 1;              // requests each plain client keeps in flight
  std::uint32_t machine_bytes_per_tick = 0;     // the replicas' shared machine (Network::limit_receivers); 0: none
  std::uint64_t join_interval_ticks = 0;        // client j starts submitting at tick j * this

  // One line: every choice above, in a fixed order (printed with each result and in every failure report).
  std::string describe() const;
  bool counter() const { return service == ServiceKind::kCounter; }
  bool fs() const { return service == ServiceKind::kFs; }
};

// Fills `s` with the scenario `c` asks for (its seed's draws for whatever `c` leaves open). False with `error`
// set when `c` names an unknown scenario or service, or asks for a combination that cannot run.
bool make_scenario(const SimConfig& c, Scenario& s, std::string& error);

}  // namespace bftfs::sim
