// bftfs-sim: runs the seeded whole-cluster simulator over many seeds, or one seed with its trace.
//
//   bftfs-sim [--seeds N] [--start S] [--jobs J]    N seeds from S (default 100 from 1), J at once (default:
//                                                   one per CPU)
//   bftfs-sim --seed S [-v]                         one seed in this process (-v: every event and debug log)
//   bftfs-sim --regressions                         every seed of sim/regression-seeds.txt
//   common options: --ticks T (fault phase length), --f F, --no-byzantine, --scenario NAME,
//                   --liveness-ticks T (bound on the liveness phase), --service counter|null,
//                   --cs 0|1 (PBFT-CS: 1 forces early replies, the shim and speculating clients; 0 forbids the
//                   shim and speculating clients)
// Exit status: 0 if every seed passed, 1 if any failed, 2 on a usage error.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "protocol/wire.h"
#include "sim/byzantine.h"
#include "sim/simulator.h"

namespace {

using bftfs::sim::SimConfig;
using bftfs::sim::SimResult;
using bftfs::sim::SimStats;

void usage() {
  std::fprintf(stderr,
               "usage: bftfs-sim [--seeds N] [--start S] [--jobs J] [--seed S] [-v] [--regressions]\n"
               "                 [--ticks T] [--liveness-ticks T] [--f F] [--no-byzantine] [--scenario NAME]\n"
               "                 [--service counter|null] [--cs 0|1]\n"
               "scenarios:");
  for (const auto& s : bftfs::sim::scenario_names()) std::fprintf(stderr, " %s", s.c_str());
  for (int i = 1; i < static_cast<int>(bftfs::sim::Strategy::kCount); ++i) {
    std::fprintf(stderr, " %s", std::string(bftfs::sim::to_string(static_cast<bftfs::sim::Strategy>(i))).c_str());
  }
  std::fprintf(stderr, "\n");
}

bool parse_u64(const char* s, std::uint64_t& out) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s, &end, 10);
  if (end == s || *end != '\0' || errno != 0) return false;
  out = v;
  return true;
}

struct Totals {
  SimStats sum;
  // Coverage marks: in how many seeds a rare path ran.
  std::uint64_t seeds_with_view_change = 0;
  std::uint64_t seeds_with_state_transfer = 0;
  std::uint64_t seeds_with_rollback = 0;
  std::uint64_t seeds_with_crash = 0;
  std::uint64_t seeds_with_crash_before_send = 0;
  std::uint64_t seeds_with_all_crash = 0;
  std::uint64_t seeds_with_byzantine = 0;
  std::uint64_t seeds_with_partition = 0;
  std::uint64_t seeds_with_read_only = 0;
  std::uint64_t seeds_with_batch_hold = 0;
  std::uint64_t seeds_with_quiet = 0;
  std::uint64_t seeds_with_quiet_release = 0;
  // PBFT-CS: what the scenarios chose, and the marks of what ran.
  std::uint64_t seeds_early = 0;
  std::uint64_t seeds_shim = 0;
  std::uint64_t seeds_lying = 0;
  std::uint64_t seeds_full_cs = 0;  // early replies + shim + speculating clients + a lying primary
  std::uint64_t seeds_lied = 0;     // ... the lying primary did lie
  std::uint64_t seeds_full_cs_lied = 0;
  std::uint64_t seeds_with_early_replies = 0;
  std::uint64_t seeds_with_speculative_first = 0;
  std::uint64_t seeds_with_client_rollback = 0;
  std::uint64_t seeds_with_shim_retry = 0;
  std::uint64_t seeds_with_open_batch_discarded = 0;
  std::uint64_t seeds_with_early_lie = 0;
  std::uint64_t seeds_with_fake_early_reply = 0;
  std::uint64_t seeds_with_distrust = 0;
  // Per-client order (checker property 10).
  std::uint64_t seeds_pipelined = 0;
  std::uint64_t seeds_reorder_primary = 0;
  std::uint64_t seeds_with_order_deferral = 0;

  void add(const SimStats& s) {
    const auto* from = reinterpret_cast<const std::uint64_t*>(&s);
    auto* into = reinterpret_cast<std::uint64_t*>(&sum);
    static_assert(sizeof(SimStats) % sizeof(std::uint64_t) == 0);
    for (std::size_t i = 0; i < sizeof(SimStats) / sizeof(std::uint64_t); ++i) into[i] += from[i];
    seeds_with_view_change += s.new_views_installed > 0 ? 1 : 0;
    seeds_with_state_transfer += s.state_transfers > 0 ? 1 : 0;
    seeds_with_rollback += s.service_rollbacks > 0 ? 1 : 0;
    seeds_with_crash += s.crashes > 0 ? 1 : 0;
    seeds_with_crash_before_send += s.crashes_between_persist_and_send > 0 ? 1 : 0;
    seeds_with_all_crash += s.all_crashes > 0 ? 1 : 0;
    seeds_with_byzantine += s.byzantine_replicas > 0 ? 1 : 0;
    seeds_with_partition += s.partitions > 0 ? 1 : 0;
    seeds_with_read_only += s.read_completions > 0 ? 1 : 0;
    seeds_with_batch_hold += s.batch_holds > 0 ? 1 : 0;
    seeds_with_quiet += s.quiet_batches > 0 ? 1 : 0;
    seeds_with_quiet_release += s.quiet_releases > 0 ? 1 : 0;
    seeds_early += s.cs_early_replies;
    seeds_shim += s.cs_shim;
    seeds_lying += s.cs_lying_primary;
    const bool full = s.cs_early_replies && s.cs_shim && s.cs_speculating_clients > 0 && s.cs_lying_primary;
    const bool lied = s.early_lies + s.fake_early_replies > 0;
    seeds_full_cs += full ? 1 : 0;
    seeds_lied += lied ? 1 : 0;
    seeds_full_cs_lied += full && lied ? 1 : 0;
    seeds_with_early_replies += s.early_replies_sent > 0 ? 1 : 0;
    seeds_with_speculative_first += s.speculative_firsts > 0 ? 1 : 0;
    seeds_with_client_rollback += s.spec_rollbacks > 0 ? 1 : 0;
    seeds_with_shim_retry += s.shim_retries > 0 ? 1 : 0;
    seeds_with_open_batch_discarded += s.open_batches_discarded > 0 ? 1 : 0;
    seeds_with_early_lie += s.early_lies > 0 ? 1 : 0;
    seeds_with_fake_early_reply += s.fake_early_replies > 0 ? 1 : 0;
    seeds_with_distrust += s.first_withheld_distrusted > 0 ? 1 : 0;
    seeds_pipelined += s.pipelined_clients > 0 ? 1 : 0;
    seeds_reorder_primary += s.reorder_primary;
    seeds_with_order_deferral += s.requests_deferred_order > 0 ? 1 : 0;
  }
};

void print_stats(const SimStats& s, const char* indent) {
  auto ull = [](std::uint64_t v) { return static_cast<unsigned long long>(v); };
  std::printf("%srequests: submitted %llu, completed %llu (%llu reads), executed %llu, agreed seqs %llu\n", indent,
              ull(s.submitted), ull(s.completed), ull(s.read_completions), ull(s.requests_executed),
              ull(s.committed_seqs));
  std::printf("%sview changes: started %llu, installed %llu, deferred while lagging %llu; state transfers %llu; "
              "rollbacks %llu (service %llu)\n",
              indent, ull(s.view_changes_started), ull(s.new_views_installed), ull(s.view_changes_deferred_lagging),
              ull(s.state_transfers),
              ull(s.replica_rollbacks), ull(s.service_rollbacks));
  std::printf("%scrashes %llu (between persist and send %llu, torn %llu, lost unsynced records %llu, all at once "
              "%llu), restarts %llu; asynchronous sync: sends held %llu, lost in crashes %llu\n",
              indent, ull(s.crashes), ull(s.crashes_between_persist_and_send), ull(s.torn_persists),
              ull(s.unsynced_records_lost), ull(s.all_crashes), ull(s.restarts), ull(s.sends_held_for_sync),
              ull(s.held_sends_lost));
  std::printf("%snetwork: frames sent %llu, delivered %llu, lost %llu, duplicated %llu, partitioned %llu, to dead "
              "nodes %llu; partitions %llu, slow links %llu\n",
              indent, ull(s.frames_sent), ull(s.frames_delivered), ull(s.frames_lost), ull(s.frames_duplicated),
              ull(s.frames_partitioned), ull(s.frames_to_dead_nodes), ull(s.partitions), ull(s.slow_links));
  std::printf("%sbyzantine replicas %llu, lies %llu; replica rejections %llu; client retransmissions %llu, "
              "read-only fallbacks %llu, replies rejected %llu; log warnings %llu, errors %llu\n",
              indent, ull(s.byzantine_replicas), ull(s.byzantine_lies), ull(s.replica_rejected),
              ull(s.client_retransmissions), ull(s.read_only_fallbacks), ull(s.replies_rejected),
              ull(s.log_warnings), ull(s.log_errors));
  std::printf("%sPBFT-CS: early replies sent %llu, received %llu, open-batch requests discarded %llu; first replies "
              "delivered %llu (%llu early), withheld %llu distrusted / %llu doomed; client commits %llu, rollbacks %llu, "
              "finals of doomed increments %llu; shim no-ops %llu; early replies lied %llu, for unordered requests %llu\n",
              indent, ull(s.early_replies_sent), ull(s.early_replies_received), ull(s.open_batches_discarded),
              ull(s.first_delivered), ull(s.speculative_firsts), ull(s.first_withheld_distrusted),
              ull(s.first_withheld_doomed), ull(s.spec_commits), ull(s.spec_rollbacks), ull(s.spec_dead_finals),
              ull(s.shim_retries), ull(s.early_lies), ull(s.fake_early_replies));
  std::printf("%sliveness: %llu ticks after healing; %llu runs needed a further request because a correct replica "
              "stayed behind (%llu such replicas, sim/FINDINGS.md)\n",
              indent, ull(s.liveness_ticks), ull(s.probes), ull(s.lagging_replicas));
  std::printf("%sper-client order: pipelined clients %llu, reorder-client primaries %llu, requests skipped for order %llu\n",
              indent, ull(s.pipelined_clients), ull(s.reorder_primary), ull(s.requests_deferred_order));
  std::printf("%sframes rejected by the wire: %llu", indent, ull(s.frames_rejected));
  const char* sep = " (";
  for (std::size_t i = 1; i < bftfs::sim::kRejectSlots; ++i) {
    if (s.rejected_by_reason[i] == 0) continue;
    std::printf("%s%s %llu", sep, std::string(bftfs::to_string(static_cast<bftfs::Reject>(i))).c_str(),
                ull(s.rejected_by_reason[i]));
    sep = ", ";
  }
  std::printf("%s\n", sep[0] == ',' ? ")" : "");
}

}  // namespace

int main(int argc, char** argv) {
  SimConfig base;
  std::uint64_t seeds = 100;
  std::uint64_t start = 1;
  // Seeds are independent processes: by default one per online CPU.
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  std::uint64_t jobs = cpus > 0 ? static_cast<std::uint64_t>(cpus) : 1;
  bool one = false;
  bool regressions = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](std::uint64_t& out) {
      if (i + 1 >= argc || !parse_u64(argv[i + 1], out)) {
        std::fprintf(stderr, "bftfs-sim: %s needs a number\n", a.c_str());
        std::exit(2);
      }
      ++i;
    };
    std::uint64_t v = 0;
    if (a == "--seeds") {
      value(seeds);
    } else if (a == "--start") {
      value(start);
    } else if (a == "--seed") {
      value(base.seed);
      one = true;
    } else if (a == "--jobs" || a == "-j") {
      value(jobs);
    } else if (a == "--ticks") {
      value(base.fault_ticks);
    } else if (a == "--liveness-ticks") {
      value(base.liveness_ticks_max);
    } else if (a == "--f") {
      value(v);
      if (v < 1 || v > 21) {
        std::fprintf(stderr, "bftfs-sim: --f must be 1..21\n");
        return 2;
      }
      base.f = static_cast<std::uint32_t>(v);
    } else if (a == "--no-byzantine") {
      base.byzantine = false;
    } else if (a == "--scenario") {
      if (i + 1 >= argc) {
        usage();
        return 2;
      }
      base.scenario = argv[++i];
    } else if (a == "--service") {
      if (i + 1 >= argc) {
        usage();
        return 2;
      }
      base.service = argv[++i];
    } else if (a == "--cs") {
      value(v);
      if (v > 1) {
        std::fprintf(stderr, "bftfs-sim: --cs must be 0 or 1\n");
        return 2;
      }
      base.speculation = static_cast<int>(v);
    } else if (a == "-v" || a == "--verbose") {
      base.verbose = true;
    } else if (a == "--regressions") {
      regressions = true;
    } else {
      usage();
      return 2;
    }
  }

  if (const std::string error = bftfs::sim::check_config(base); !error.empty()) {
    std::fprintf(stderr, "bftfs-sim: %s\n", error.c_str());
    usage();
    return 2;
  }
  if (one) {
    const SimResult r = bftfs::sim::run_simulation(base);
    std::printf("seed %llu: %s\n  scenario: %s\n", static_cast<unsigned long long>(r.seed),
                r.passed ? "PASS" : "FAIL", r.scenario.c_str());
    print_stats(r.stats, "  ");
    if (!r.passed) std::printf("%s", r.failure.c_str());
    return r.passed ? 0 : 1;
  }

  std::vector<SimConfig> configs;
  if (regressions) {
    if (const std::string error = bftfs::sim::read_regression_seeds(bftfs::sim::regression_seeds_path(), configs);
        !error.empty()) {
      std::fprintf(stderr, "bftfs-sim: %s\n", error.c_str());
      return 2;
    }
  } else {
    for (std::uint64_t s = start; s < start + seeds; ++s) {
      SimConfig c = base;
      c.seed = s;
      configs.push_back(c);
    }
  }

  Totals totals;
  std::vector<std::uint64_t> failed;
  std::size_t finished = 0;
  const std::size_t total = configs.size();
  auto done = [&](const SimResult& r) {
    ++finished;
    totals.add(r.stats);
    if (!r.passed) {
      failed.push_back(r.seed);
      std::printf("%s\n", r.failure.c_str());
    }
    if (finished % 25 == 0 || finished == total) {
      std::printf("[%zu/%zu] %zu failed\n", finished, total, failed.size());
    }
    std::fflush(stdout);
  };
  bftfs::sim::run_many(configs, static_cast<unsigned>(jobs), done);

  std::printf("\nsummary: %zu seeds, %zu passed, %zu failed\n", total, total - failed.size(), failed.size());
  if (!failed.empty()) {
    std::sort(failed.begin(), failed.end());
    std::printf("failing seeds:");
    for (auto s : failed) std::printf(" %llu", static_cast<unsigned long long>(s));
    std::printf("\n");
  }
  print_stats(totals.sum, "  ");
  std::printf("  coverage (seeds where it ran): view change %llu, state transfer %llu, rollback %llu, crash %llu, "
              "crash between persist and send %llu, all-crash %llu, byzantine %llu, partition %llu, read-only %llu, batch hold %llu, quiet primary %llu (released %llu)\n",
              static_cast<unsigned long long>(totals.seeds_with_view_change),
              static_cast<unsigned long long>(totals.seeds_with_state_transfer),
              static_cast<unsigned long long>(totals.seeds_with_rollback),
              static_cast<unsigned long long>(totals.seeds_with_crash),
              static_cast<unsigned long long>(totals.seeds_with_crash_before_send),
              static_cast<unsigned long long>(totals.seeds_with_all_crash),
              static_cast<unsigned long long>(totals.seeds_with_byzantine),
              static_cast<unsigned long long>(totals.seeds_with_partition),
              static_cast<unsigned long long>(totals.seeds_with_read_only),
              static_cast<unsigned long long>(totals.seeds_with_batch_hold),
              static_cast<unsigned long long>(totals.seeds_with_quiet),
              static_cast<unsigned long long>(totals.seeds_with_quiet_release));
  auto ull = [](std::uint64_t v) { return static_cast<unsigned long long>(v); };
  std::printf("  PBFT-CS seeds: early replies %llu, shim with speculating clients %llu, lying primary %llu (it lied in "
              "%llu), all of them %llu (with lies %llu)\n",
              ull(totals.seeds_early), ull(totals.seeds_shim), ull(totals.seeds_lying), ull(totals.seeds_lied),
              ull(totals.seeds_full_cs), ull(totals.seeds_full_cs_lied));
  std::printf("  PBFT-CS coverage (seeds where it ran): early replies sent %llu, speculative first replies delivered "
              "%llu, rollbacks at a client %llu, shim retries %llu, open batches discarded %llu, lies in early "
              "replies %llu, early replies for unordered requests %llu, primary distrusted (1%% rule) %llu\n",
              ull(totals.seeds_with_early_replies), ull(totals.seeds_with_speculative_first),
              ull(totals.seeds_with_client_rollback), ull(totals.seeds_with_shim_retry),
              ull(totals.seeds_with_open_batch_discarded), ull(totals.seeds_with_early_lie),
              ull(totals.seeds_with_fake_early_reply), ull(totals.seeds_with_distrust));
  std::printf("  per-client order: seeds with pipelined clients %llu, with a reorder-client primary %llu, where "
              "replicas skipped a request ordered before its predecessor %llu (%llu requests)\n",
              ull(totals.seeds_pipelined), ull(totals.seeds_reorder_primary), ull(totals.seeds_with_order_deferral),
              ull(totals.sum.requests_deferred_order));
  return failed.empty() ? 0 : 1;
}
