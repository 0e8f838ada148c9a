// The scenario tables (scenario.h). make_scenario draws in a fixed order from the main stream (its parts below
// are called in that order and must keep it: every draw moved or added would change every later seed's
// scenario); options added later draw from streams of their own.
#include "sim/scenario.h"

#include <algorithm>
#include <set>

#include "common/prng.h"
#include "sim/mix.h"
#include "sim/strfmt.h"

namespace bftfs::sim {

namespace {

// What the configuration's names force, before the main stream's choices fill in the rest.
struct Forced {
  Strategy strategy = Strategy::kNone;  // a strategy named as the scenario
  bool null_variant = false;            // the null service with a pipelining client
  bool fs = false;                      // the file service
};

// The file service came after the counter and the null service: a stream of its own picks it for a share of the
// seeds that leave the service to the seed, so that every other seed keeps its scenario and its run. The salt is
// one under which no seed of sim/regression-seeds.txt, nor any seed the unit tests run without naming a service
// (tests/unit/test_sim.cc), is picked: each keeps the scenario it was chosen for.
constexpr std::uint64_t kFsSalt = 0xF5000B9D;
constexpr std::uint64_t kFsShareNum = 1;  // of kFsShareDen seeds
constexpr std::uint64_t kFsShareDen = 4;

// Whether `seed`'s service is the file service when nothing names one.
bool fs_drawn(std::uint64_t seed) { return Prng(mix(seed, kFsSalt)).chance(kFsShareNum, kFsShareDen); }

// The file service's options and its clients' workload (the fs stream, every value drawn, in this order): few
// partitions, so that state transfer moves real ones; a root directory most users may write in, or one only root
// may (permission errors); shared names from a pool small enough for conflicts; writes from tiny to several KiB.
void choose_fs(const SimConfig& c, Scenario& s) {
  Prng p(mix(c.seed, 0xF5F5F5F5));
  fs::FsOptions& o = s.fs_options;
  const std::uint64_t partitions[] = {4, 8, 16};
  o.partitions = partitions[p.below(3)];
  o.capacity_bytes = 64ull << 20;
  o.inodes_max = 4096;
  o.root_mode = p.chance(3, 4) ? 0777 : 0755;
  FsWorkloadOptions& w = s.fs_workload;
  const std::uint32_t names[] = {3, 6, 12};
  w.names = names[p.below(3)];
  const std::uint32_t io[] = {256, 4096, 16384};
  w.io_bytes_max = io[p.below(3)];
  const std::uint32_t read_only[] = {20, 60, 90};
  w.read_only_percent = read_only[p.below(3)];
  w.other_users = p.chance(3, 4);
}

// Epoch clients (docs/SPECULATION.md §14) came after the file-service seeds: a stream of their own picks half of
// the file-service seeds (or all, or none, as SimConfig::epochs says) to run their last client as an epoch client,
// a plain one otherwise. Under this salt no file-service seed of sim/regression-seeds.txt, nor any seed the unit
// tests run with the file service (1 to 6, 11, 20, 21, 30, 34), is picked when the seed decides.
constexpr std::uint64_t kEpochSalt = 0xE90C0670;

void choose_epochs(const SimConfig& c, Scenario& s) {
  Prng p(mix(c.seed, kEpochSalt));
  const bool drawn = p.chance(1, 2);
  EpochClientOptions& o = s.epoch_options;
  const std::uint32_t lengths[] = {1, 4, 12, 32};
  o.entries_min = 1;
  o.entries_max = lengths[p.below(4)];
  o.pipeline = 1 + static_cast<std::uint32_t>(p.below(3));
  o.first_replies = p.chance(3, 4);
  // Parts just above the largest entry the workload draws (up to 4 WRITEs of io_bytes_max, names and the rest
  // well under 4 KiB), so that longer epochs stage parts; or as large as a request allows.
  o.part_bytes = p.chance(2, 3) ? 4 * s.fs_workload.io_bytes_max + 4096 : spec::kPartBytesMax;
  const std::uint16_t reserves[] = {4, 16, 64};
  o.reserve = reserves[p.below(3)];
  const bool on = c.epochs == 1 || (c.epochs == -1 && drawn);
  s.epoch_client = on ? s.clients : 0;
}

// The fault mode: drawn for "random", else the one named (a strategy name means the Byzantine mode).
bool choose_mode(const std::string& name, bool byzantine_allowed, Prng& p, Scenario& s, Forced& forced,
                 std::string& error) {
  if (name == "random") {
    const std::uint64_t r = p.below(100);
    if (r < 5) {
      s.mode = Mode::kCalm;
    } else if (r < 20) {
      s.mode = Mode::kNetwork;
    } else if (r < 45 || (!byzantine_allowed && r >= 55)) {
      s.mode = Mode::kCrash;
    } else if (r < 55) {
      s.mode = Mode::kAllCrash;
    } else {
      s.mode = Mode::kByzantine;
    }
    return true;
  }
  if (name == "all-crash-checkpoint") {
    s.mode = Mode::kAllCrash;
    s.all_crash_at_checkpoint = true;
    return true;
  }
  if (name == "overload") {
    s.mode = Mode::kCalm;
    forced.fs = true;
    return true;
  }
  static const std::pair<const char*, Mode> kModes[] = {{"calm", Mode::kCalm},
                                                         {"network", Mode::kNetwork},
                                                         {"crash", Mode::kCrash},
                                                         {"all-crash", Mode::kAllCrash},
                                                         {"byzantine", Mode::kByzantine}};
  for (const auto& [mode_name, mode] : kModes) {
    if (name == mode_name) {
      s.mode = mode;
      return true;
    }
  }
  if (parse_strategy(name, forced.strategy) && forced.strategy != Strategy::kNone &&
      forced.strategy != Strategy::kCount) {
    s.mode = Mode::kByzantine;
    return true;
  }
  error = "unknown scenario '" + name + "'";
  return false;
}

// f, the mode and the service (the first draws of the main stream).
bool choose_shape(const SimConfig& c, Prng& p, Scenario& s, Forced& forced, std::string& error) {
  s.f = c.f != 0 ? c.f : (p.chance(1, 5) ? 2 : 1);
  if (s.f > 21) {
    error = "f must be at most 21";
    return false;
  }
  s.n = 3 * s.f + 1;
  std::string name = c.scenario.empty() ? "random" : c.scenario;
  forced.null_variant = p.chance(1, 5);
  const bool named_by_scenario = name == "null" || name == "counter";
  if (named_by_scenario) {
    forced.null_variant = name == "null";
    name = "random";
  }
  if (!choose_mode(name, c.byzantine, p, s, forced, error)) return false;
  if (c.scenario == "overload" && !c.service.empty() && c.service != "fs") {
    error = "scenario 'overload' runs the file service";
    return false;
  }
  if (c.service == "null" || c.service == "counter") {
    forced.null_variant = c.service == "null";
  } else if (c.service == "fs") {
    if (named_by_scenario) {
      error = "scenario '" + c.scenario + "' names another service than 'fs'";
      return false;
    }
    forced.fs = true;
  } else if (!c.service.empty()) {
    error = "unknown service '" + c.service + "'";
    return false;
  }
  if (c.service.empty() && !named_by_scenario && !forced.fs) forced.fs = fs_drawn(c.seed);
  if (forced.fs) forced.null_variant = false;
  if (c.speculation == 1) {
    if (c.service == "null" || c.scenario == "null") {
      error = "cs=1 (speculation) needs the counter or the file service";
      return false;
    }
    forced.null_variant = false;  // speculating clients chain counter increments (or file-service requests)
  }
  if (s.mode == Mode::kByzantine && !c.byzantine) {
    error = "scenario '" + name + "' needs Byzantine replicas";
    return false;
  }
  s.service = forced.fs ? ServiceKind::kFs : (forced.null_variant ? ServiceKind::kNull : ServiceKind::kCounter);
  s.pipelining_client = forced.null_variant;
  s.clients = kClients + (s.pipelining_client ? 1 : 0);
  return true;
}

// Checkpoints, log window and batching (main stream), then the options that came later (streams of their own).
// Small checkpoint intervals, so that checkpoints, garbage collection and state transfer happen in a short run.
void choose_replica_options(const SimConfig& c, Prng& p, Scenario& s) {
  ReplicaOptions& ro = s.replica;
  ro.n = s.n;
  ro.f = s.f;
  ro.checkpoint_interval = std::uint64_t{8} << p.below(3);  // 8, 16, 32
  ro.log_window = ro.checkpoint_interval * (p.chance(1, 2) ? 2 : 4);
  const std::uint32_t batch_sizes[] = {1, 4, 16};
  ro.batch_requests_max = batch_sizes[p.below(3)];
  ro.batch_window = static_cast<std::uint32_t>(p.below(3));
  ro.tentative_execution = p.chance(7, 10);
  // Piggybacked commits from their own stream too (added after the regression seeds were found).
  ro.piggyback_commits = Prng(mix(c.seed, 0x9166BAC4)).chance(3, 4);
  // The batch hold likewise (its own stream, so older seeds kept their scenarios).
  ro.batch_hold = Prng(mix(c.seed, 0xB47C4401)).chance(3, 4);
  // The quiet primary likewise, with release timers from eager to patient.
  Prng qp(mix(c.seed, 0x0A1E7B07));
  ro.quiet_primary = qp.chance(3, 4);
  const std::uint32_t release_ticks[] = {2, 12, 60};
  ro.quiet_release_ticks = release_ticks[qp.below(3)];
}

// PBFT-CS options come from their own stream so that adding them left every older seed's scenario as it was.
// Every value is drawn whether it is used or not, always in this order, so that options added later keep these
// too. Returns the draw that decides (in choose_lying) whether a primary lies in its early replies.
std::uint64_t choose_cs(const SimConfig& c, Scenario& s, const Forced& forced) {
  ReplicaOptions& ro = s.replica;
  Prng cs(mix(c.seed, 0xC5EA21E5));
  ro.early_replies = cs.chance(1, 2);
  const bool shim_draw = cs.chance(2, 3);
  const bool second_speculates = cs.chance(1, 2);
  std::uint32_t windows[kClients];
  for (auto& w : windows) w = static_cast<std::uint32_t>(1 + cs.below(kSpecWindowMax));
  const std::uint64_t trust_draw = cs.below(4);
  const std::uint64_t log_draw = cs.below(10);
  const std::uint64_t lie_draw = cs.below(100);
  const std::uint32_t lie_rates[] = {50'000, 150'000, 400'000};
  s.early_lie_ppm = lie_rates[cs.below(3)];
  const std::uint32_t fake_rates[] = {0, 20'000, 60'000};
  s.fake_ppm = fake_rates[cs.below(3)];
  const bool lying_forced = forced.strategy == Strategy::kLyingEarlyReplies;
  if (lying_forced) ro.early_replies = true;  // the strategy needs them
  const bool speculating =
      c.speculation == 1 || (c.speculation == -1 && !forced.null_variant && (shim_draw || lying_forced));
  // The file service always runs behind the shim, as in production; its clients speculate as the counter's do.
  s.shim = speculating || forced.fs;
  if (c.speculation == 1) ro.early_replies = true;
  if (s.shim) {
    // Client 0 always speculates, client 1 sometimes, client 2 never (a plain client over the shim).
    s.spec_windows = {windows[0], second_speculates ? windows[1] : 0, 0};
    if (!speculating) s.spec_windows = {0, 0, 0};
    // The 1% rule as the paper has it, a looser one, or none (so that lies keep reaching the clients).
    s.failure_window = trust_draw == 1 ? 10 : 100;
    s.failure_permille_max = trust_draw == 0 ? 10 : (trust_draw == 1 ? 300 : 1000);
    // Shim logs at the smallest size allowed, larger ones, and rarely a client limit that leaves the last
    // client to appear unlogged (its dependent requests then always retry: shim.h).
    s.shim_options.log_entries_per_client = log_draw < 5 ? 64 : (log_draw < 8 ? 128 : 1024);
    s.shim_options.clients_max = log_draw == 9 ? kClients - 1 : kClients;
  }
  return lie_draw;
}

// Timers of the replicas and the clients' options (main stream).
bool choose_timers_and_client(Prng& p, Scenario& s, std::string& error) {
  ReplicaOptions& ro = s.replica;
  ro.client_window = 16;
  ro.view_change_timeout_ticks = static_cast<std::uint32_t>(p.range(80, 250));
  ro.view_change_timeout_ticks_max = ro.view_change_timeout_ticks * 8;
  ro.status_interval_ticks = static_cast<std::uint32_t>(p.range(20, 60));
  ro.fetch_retry_ticks = static_cast<std::uint32_t>(p.range(20, 50));

  ClientOptions& co = s.client;
  co.n = s.n;
  co.f = s.f;
  co.window = 1;
  co.retransmit_ticks = static_cast<std::uint32_t>(p.range(60, 200));
  co.retransmit_ticks_max = 1600;
  co.first_request_id = 1;
  co.use_reply_digests = p.chance(7, 10);
  // ClientOptions::window must not exceed the replicas' client_window (client.h): a request further ahead
  // would make a lagging one stale.
  std::uint32_t window_max = s.pipelining_client ? kPipelineWindow : co.window;
  for (std::uint32_t w : s.spec_windows) window_max = std::max(window_max, w);
  if (window_max > ro.client_window) {
    error = fmt("client window %u exceeds the replicas' client_window %u", window_max, ro.client_window);
    return false;
  }
  return true;
}

// The network's delays and, outside calm seeds, its faults; then the workload's pace (main stream).
void choose_network_and_workload(Prng& p, Scenario& s) {
  s.net.delay_min_ticks = static_cast<std::uint32_t>(p.range(1, 2));
  const std::uint32_t spreads[] = {2, 5, 10, 20};
  s.net.delay_max_ticks = s.net.delay_min_ticks + spreads[p.below(4)];
  if (s.mode != Mode::kCalm) {
    const std::uint32_t losses[] = {0, 10'000, 30'000, 100'000};
    const std::uint32_t dups[] = {0, 10'000, 50'000};
    s.net.loss_ppm = losses[p.below(4)];
    s.net.duplicate_ppm = dups[p.below(3)];
    const std::uint32_t parts[] = {0, 1'000, 3'000};
    s.partition_ppm = parts[p.below(3)];
    s.slow_ppm = p.chance(1, 2) ? 2'000 : 0;
  }
  s.read_percent = s.counter() ? static_cast<std::uint32_t>(p.range(0, 40)) : 0;
  s.think_ticks_max = static_cast<std::uint32_t>(p.range(0, 20));
}

// Crash rates and the tick at which every replica crashes at once (main stream).
void choose_crashes(const SimConfig& c, Prng& p, Scenario& s) {
  if (s.mode == Mode::kCrash || s.mode == Mode::kByzantine) {
    const std::uint32_t rates[] = {1'250, 3'000, 6'000};  // one crash per 800, 333 or 167 ticks
    s.crash_ppm = s.mode == Mode::kCrash || p.chance(1, 2) ? rates[p.below(3)] : 0;
  }
  if (s.mode == Mode::kAllCrash) {
    s.all_crash_tick = c.fault_ticks / 4 + p.below(std::max<std::uint64_t>(c.fault_ticks / 2, 1));
  }
}

// The Byzantine replicas of a Byzantine seed and their strategies (main stream).
void choose_byzantine(const SimConfig& c, Prng& p, Scenario& s, const Forced& forced) {
  if (s.mode != Mode::kByzantine) return;
  // reorder-client (a primary that puts a pipelining client's requests out of order) came later: a stream of
  // its own picks it for a quarter of the Byzantine seeds that draw at random and have a pipelining client
  // (the null variant's, or speculating ones with shim seeds). It replaces the first strategy drawn, which
  // is still drawn so that the rest of the scenario keeps its values. The salt is one under which no seed of
  // sim/regression-seeds.txt draws it, so that each keeps the scenario it was added for.
  Prng reorder_stream(mix(c.seed, 0x0DE5C158));
  const bool reorder =
      forced.strategy == Strategy::kNone && reorder_stream.chance(1, 4) && (s.pipelining_client || s.shim);
  const std::uint32_t count = s.f >= 2 && p.chance(1, 2) ? 2 : 1;
  std::set<NodeId> used;
  for (std::uint32_t i = 0; i < count; ++i) {
    Strategy st = forced.strategy;
    if (st == Strategy::kNone) {
      st = static_cast<Strategy>(1 + p.below(static_cast<std::uint64_t>(kLastClassicStrategy)));
      if (i == 0 && reorder) st = Strategy::kReorderClient;
    }
    // Primary-only strategies take the primaries of the first views, in order; others any free replica.
    NodeId id = 0;
    if (wants_primary(st)) {
      while (used.count(id) != 0) ++id;
    } else {
      do {
        id = static_cast<NodeId>(p.below(s.n));
      } while (used.count(id) != 0);
    }
    used.insert(id);
    s.byzantine.emplace_back(id, st);
  }
}

// PBFT-CS: a primary that lies in its early replies (NSDI'09 §3.4), decided by the PBFT-CS stream's `lie_draw` on
// top of what the main stream chose. In Byzantine seeds every Byzantine replica lies in early replies when it is
// primary, and replica 0 (the first primary) joins them if the budget of f allows; in other seeds replica 0
// becomes a Byzantine replica that does nothing but that (less often where crashes need the fault budget: with
// f = 1 a lying primary leaves none for crashes).
void choose_lying(const SimConfig& c, Scenario& s, const Forced& forced, std::uint64_t lie_draw) {
  const bool forced_lying = forced.strategy == Strategy::kLyingEarlyReplies;
  if (!(s.counter() || s.fs()) || !s.replica.early_replies || !c.byzantine || (c.speculation == 0 && !forced_lying)) {
    return;
  }
  const bool crashes = s.mode == Mode::kCrash || s.mode == Mode::kAllCrash;
  const std::uint64_t odds = s.mode == Mode::kByzantine ? 75 : (!crashes ? 90 : (s.f >= 2 ? 75 : 25));
  if (!forced_lying && lie_draw >= odds) return;
  s.lying = true;
  bool primary_taken = false;
  for (const auto& [id, st] : s.byzantine) primary_taken = primary_taken || id == 0;
  if (!primary_taken && s.byzantine.size() < s.f) {
    s.byzantine.insert(s.byzantine.begin(), {NodeId{0}, Strategy::kLyingEarlyReplies});
  }
}

// The overload scenario (scenario.h), after every other choice, from a stream of its own: no Byzantine or lying
// replica and no faults (a calm network, no crashes), kOverloadClients plain clients with several requests each
// in flight and no think time, joining one after another, and a machine for the replicas that takes in a few
// KiB per tick (the requests' and the batches' bytes dominate, as they do on a real one). The client retransmission and view-change timeouts stay as drawn: whether those timers take
// the backlog for a faulty primary is what the scenario checks.
bool apply_overload(const SimConfig& c, Scenario& s, std::string& error) {
  if (c.speculation == 1) {
    error = "scenario 'overload' runs plain clients (cs=1 asks for speculating ones)";
    return false;
  }
  Prng p(mix(c.seed, 0x0E1F10AD));
  s.overload = true;
  s.byzantine.clear();
  s.lying = false;
  s.crash_ppm = 0;
  s.clients = kOverloadClients;
  s.pipelining_client = false;
  s.spec_windows.assign(s.clients, 0);
  s.shim_options.clients_max = s.clients;
  s.think_ticks_max = 0;
  s.fs_workload.io_bytes_max = 16384;  // bulk writers: writes of up to 16 KiB
  const std::uint32_t windows[] = {4, 8, 16};
  s.client_window = std::min(windows[p.below(3)], s.replica.client_window);
  // Per 4 replicas (every replica receives each batch): 7 replicas get a machine 7/4 as large.
  const std::uint32_t budgets[] = {16 << 10, 24 << 10, 32 << 10};
  s.machine_bytes_per_tick = budgets[p.below(3)] / 4 * s.n;
  s.join_interval_ticks = p.range(10, 60);
  // The primary batches, as in production (batch_window 0 would pre-prepare every request on its own).
  s.replica.batch_window = std::max<std::uint32_t>(s.replica.batch_window, 1);
  s.replica.batch_requests_max = std::max<std::uint32_t>(s.replica.batch_requests_max, 4);
  return true;
}

std::string describe_overload(const Scenario& s) {
  return s.overload ? fmt(" overload: window=%u machine=%uB/tick join=%llu", s.client_window,
                          s.machine_bytes_per_tick, ull(s.join_interval_ticks))
                    : "";
}

std::string describe_lies(const Scenario& s) {
  return s.lying ? fmt(" early-lies=%uppm fake=%uppm", s.early_lie_ppm, s.fake_ppm) : "";
}

std::string describe_fs(const Scenario& s) {
  if (!s.fs()) return "";
  const FsWorkloadOptions& w = s.fs_workload;
  const EpochClientOptions& e = s.epoch_options;
  const std::string epochs = s.epoch_client == 0 ? ""
                                                 : fmt(" epochs=c%u/len%u/pipe%u/%s/part%zu/res%u", s.epoch_client - 1,
                                                       e.entries_max, e.pipeline, e.first_replies ? "first" : "final",
                                                       e.part_bytes, e.reserve);
  return fmt(" fs=P%llu/root%o names=%u io=%u ro=%u%%%s%s", ull(s.fs_options.partitions), s.fs_options.root_mode,
             w.names, w.io_bytes_max, w.read_only_percent, w.other_users ? " users" : "", epochs.c_str());
}

std::string describe_cs(const Scenario& s) {
  if (!s.shim) return describe_lies(s);
  std::string windows;
  for (std::uint32_t w : s.spec_windows) windows += fmt("%s%u", windows.empty() ? "" : ",", w);
  std::string out = fmt(" shim=%u/%u spec=[%s] trust=%u/%u", s.shim_options.log_entries_per_client,
                        s.shim_options.clients_max, windows.c_str(), s.failure_permille_max, s.failure_window);
  return out + describe_lies(s);
}

}  // namespace

const char* to_string(Mode m) {
  switch (m) {
    case Mode::kCalm:
      return "calm";
    case Mode::kNetwork:
      return "network";
    case Mode::kCrash:
      return "crash";
    case Mode::kAllCrash:
      return "all-crash";
    case Mode::kByzantine:
      return "byzantine";
  }
  return "?";
}

std::string Scenario::describe() const {
  std::string byz;
  for (const auto& [id, s] : byzantine) {
    byz += fmt("%s%u:%s", byz.empty() ? "" : ",", id, std::string(to_string(s)).c_str());
  }
  const ReplicaOptions& ro = replica;
  return fmt("mode=%s f=%u n=%u clients=%u%s service=%s byz=[%s] crash=%uppm net=delay%u-%u loss=%uppm "
             "dup=%uppm partition=%uppm slow=%uppm K=%llu L=%llu batch=%u/%u tentative=%d vc_timeout=%u "
             "status=%u digests=%d early=%d piggyback=%d hold=%d quiet=%d/%u%s",
             all_crash_at_checkpoint ? "all-crash-checkpoint" : to_string(mode), f, n, clients, pipelining_client ? "+pipelining" : "", to_string(service),
             byz.c_str(), crash_ppm, net.delay_min_ticks, net.delay_max_ticks, net.loss_ppm, net.duplicate_ppm,
             partition_ppm, slow_ppm, ull(ro.checkpoint_interval), ull(ro.log_window), ro.batch_requests_max,
             ro.batch_window, ro.tentative_execution ? 1 : 0, ro.view_change_timeout_ticks,
             ro.status_interval_ticks, client.use_reply_digests ? 1 : 0, ro.early_replies ? 1 : 0,
             ro.piggyback_commits ? 1 : 0, ro.batch_hold ? 1 : 0, ro.quiet_primary ? 1 : 0,
             ro.quiet_release_ticks, describe_cs(*this).c_str()) +
         describe_fs(*this) + describe_overload(*this);
}

bool make_scenario(const SimConfig& c, Scenario& s, std::string& error) {
  Prng p(mix(c.seed, 0x5CE7A210));
  Forced forced;
  if (!choose_shape(c, p, s, forced, error)) return false;
  choose_replica_options(c, p, s);
  const std::uint64_t lie_draw = choose_cs(c, s, forced);
  if (!choose_timers_and_client(p, s, error)) return false;
  choose_network_and_workload(p, s);
  choose_crashes(c, p, s);
  choose_byzantine(c, p, s, forced);
  choose_lying(c, s, forced, lie_draw);
  if (s.fs()) choose_fs(c, s);
  if (s.fs() && c.scenario != "overload") choose_epochs(c, s);  // overload: plain clients only
  if (c.scenario == "overload" && !apply_overload(c, s, error)) return false;
  return true;
}

std::string check_config(const SimConfig& config) {
  Scenario s;
  std::string error;
  return make_scenario(config, s, error) ? "" : error;
}

const std::vector<std::string>& scenario_names() {
  static const std::vector<std::string> names = {"random",    "calm",      "network", "crash", "all-crash",
                                                  "all-crash-checkpoint", "byzantine", "null", "counter", "overload"};
  return names;
}

}  // namespace bftfs::sim
