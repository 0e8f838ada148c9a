// bftfs-sim: runs the seeded whole-cluster simulator over many seeds, or one seed with its trace.
//
//   bftfs-sim [--seeds N] [--start S] [--jobs J]    N seeds from S (default 100 from 1), J at once (default:
//                                                   one per CPU)
//   bftfs-sim --seed S [-v]                         one seed in this process (-v: every event and debug log)
//   bftfs-sim --regressions                         every seed of sim/regression-seeds.txt
//   common options: --ticks T (fault phase length), --f F, --no-byzantine, --scenario NAME,
//                   --liveness-ticks T (bound on the liveness phase), --service counter|null|fs,
//                   --cs 0|1 (PBFT-CS: 1 forces early replies, the shim and speculating clients; 0 forbids the
//                   shim and speculating clients), --fingerprints (each seed's SimStats::fingerprint, one line
//                   per seed in seed order, so that two builds can be compared run for run)
// Exit status: 0 if every seed passed, 1 if any failed, 2 on a usage error. `--help` lists the options.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "protocol/wire.h"
#include "sim/byzantine.h"
#include "sim/simulator.h"

namespace {

using bftfs::sim::SimConfig;
using bftfs::sim::SimResult;
using bftfs::sim::SimStats;

struct Totals {
  SimStats sum;
  // Coverage marks: in how many seeds a rare path ran.
  std::uint64_t seeds_with_view_change = 0;
  std::uint64_t seeds_with_state_transfer = 0;
  std::uint64_t seeds_with_checkpoint_adopted = 0;
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
  // File-service seeds: in how many of them each path ran.
  std::uint64_t fs_with_state_transfer = 0;
  std::uint64_t fs_with_view_change = 0;
  std::uint64_t fs_with_client_rollback = 0;
  std::uint64_t fs_with_shim_noop = 0;
  std::uint64_t fs_with_read_only = 0;
  std::uint64_t fs_with_crash = 0;
  std::uint64_t fs_with_all_crash = 0;
  std::uint64_t fs_with_byzantine = 0;
  std::uint64_t fs_with_early_lie = 0;
  std::uint64_t fs_with_speculating_clients = 0;
  std::uint64_t fs_with_rename_across_done = 0;
  std::uint64_t fs_with_predicate_failed = 0;
  // ... and with an epoch client (sim/fs_epoch_client.h).
  std::uint64_t fs_with_epochs = 0;
  std::uint64_t fs_with_epoch_applied = 0;
  std::uint64_t fs_with_epoch_entry_failed = 0;
  std::uint64_t fs_with_epoch_chain_failed = 0;
  std::uint64_t fs_with_epoch_rollback = 0;
  std::uint64_t fs_with_epoch_staged = 0;
  std::uint64_t fs_with_epoch_first_wrong = 0;
  std::uint64_t fs_with_epoch_lines_dropped = 0;
  std::uint64_t fs_with_epoch_rollback_stopped = 0;

  void add_fs(const SimStats& s) {
    if (s.fs_seed == 0) return;
    fs_with_state_transfer += s.state_transfers > 0 ? 1 : 0;
    fs_with_view_change += s.new_views_installed > 0 ? 1 : 0;
    fs_with_client_rollback += s.spec_rollbacks > 0 ? 1 : 0;
    fs_with_shim_noop += s.fs_shim_noops > 0 ? 1 : 0;
    fs_with_read_only += s.fs_read_only_reads > 0 ? 1 : 0;
    fs_with_crash += s.crashes > 0 ? 1 : 0;
    fs_with_all_crash += s.all_crashes > 0 ? 1 : 0;
    fs_with_byzantine += s.byzantine_replicas > 0 ? 1 : 0;
    fs_with_early_lie += s.early_lies + s.fake_early_replies > 0 ? 1 : 0;
    fs_with_speculating_clients += s.cs_speculating_clients > 0 ? 1 : 0;
    fs_with_rename_across_done += s.fs_renames_across_done > 0 ? 1 : 0;
    fs_with_predicate_failed += s.fs_predicate_failed > 0 ? 1 : 0;
    fs_with_epochs += s.epoch_clients > 0 ? 1 : 0;
    fs_with_epoch_applied += s.epoch_hist_applied > 0 ? 1 : 0;
    fs_with_epoch_entry_failed += s.epoch_hist_entry > 0 ? 1 : 0;
    fs_with_epoch_chain_failed += s.epoch_hist_chain > 0 ? 1 : 0;
    fs_with_epoch_rollback += s.epoch_rollbacks > 0 ? 1 : 0;
    fs_with_epoch_staged += s.epoch_entries_staged > 0 ? 1 : 0;
    fs_with_epoch_first_wrong += s.epoch_firsts_wrong > 0 ? 1 : 0;
    fs_with_epoch_lines_dropped += s.epoch_lines_dropped > 0 ? 1 : 0;
    fs_with_epoch_rollback_stopped += s.epoch_rollbacks_stopped > 0 ? 1 : 0;
  }

  void add(const SimStats& s) {
    add_fs(s);
    const auto* from = reinterpret_cast<const std::uint64_t*>(&s);
    auto* into = reinterpret_cast<std::uint64_t*>(&sum);
    static_assert(sizeof(SimStats) % sizeof(std::uint64_t) == 0);
    for (std::size_t i = 0; i < sizeof(SimStats) / sizeof(std::uint64_t); ++i) into[i] += from[i];
    seeds_with_view_change += s.new_views_installed > 0 ? 1 : 0;
    seeds_with_state_transfer += s.state_transfers > 0 ? 1 : 0;
    seeds_with_checkpoint_adopted += s.recovered_checkpoints_adopted > 0 ? 1 : 0;
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

// The file-service lines of a run or a sweep (sums over its file-service seeds).
void print_fs_stats(const SimStats& s, const char* indent) {
  auto ull = [](std::uint64_t v) { return static_cast<unsigned long long>(v); };
  std::printf("%sfile service (%llu seeds): requests drawn %llu (compound %llu), fs predicates %llu, shim "
              "dependencies %llu; renames %llu (of directories %llu, across directories %llu, onto existing names "
              "%llu, into their own subtree %llu), links %llu, removes %llu\n",
              indent, ull(s.fs_seed), ull(s.fs_requests), ull(s.fs_compounds), ull(s.fs_expects),
              ull(s.fs_dependencies), ull(s.fs_renames), ull(s.fs_renames_of_dirs), ull(s.fs_renames_across),
              ull(s.fs_renames_replacing), ull(s.fs_renames_into_subtree), ull(s.fs_links), ull(s.fs_removes));
  std::printf("%sfile service, agreed history: executions %llu (with shim dependencies %llu, shim no-ops %llu); "
              "done %llu (compound %llu, fs predicates held %llu), stopped by an errno %llu, by an fs predicate "
              "%llu; renames done %llu (across directories %llu), links done %llu, removes done %llu\n",
              indent, ull(s.fs_executions), ull(s.fs_with_dependencies), ull(s.fs_shim_noops), ull(s.fs_done),
              ull(s.fs_compounds_done), ull(s.fs_expects_held), ull(s.fs_op_failed), ull(s.fs_predicate_failed),
              ull(s.fs_renames_done), ull(s.fs_renames_across_done), ull(s.fs_links_done), ull(s.fs_removes_done));
  std::printf("%sfile service, oracle: agreed results checked %llu, read-only results %llu (matched in their "
              "window %llu, unverifiable %llu), checkpoints compared %llu; invariant walks of correct replicas %llu\n",
              indent, ull(s.fs_executions), ull(s.fs_read_only_reads), ull(s.fs_reads_checked),
              ull(s.fs_reads_unverifiable), ull(s.fs_checkpoints_compared), ull(s.fs_invariant_checks));
  if (s.epoch_clients == 0) return;
  std::printf("%sepoch clients (%llu): program requests %llu; FETCH %llu (first replies used %llu, of them wrong "
              "%llu; inconsistent facts %llu), RESERVE %llu, STAGE %llu, EPOCH %llu; epochs committed %llu, failed "
              "%llu, rollbacks %llu (entries discarded %llu)\n",
              indent, ull(s.epoch_clients), ull(s.epoch_program_steps), ull(s.epoch_fetches), ull(s.epoch_firsts_used),
              ull(s.epoch_firsts_wrong), ull(s.epoch_inconsistent), ull(s.epoch_reserves), ull(s.epoch_stages),
              ull(s.epoch_sealed), ull(s.epoch_committed), ull(s.epoch_failed), ull(s.epoch_rollbacks),
              ull(s.epoch_discarded_entries));
  std::printf("%sepoch programs: output lines externalized %llu (checked against the serial replay), dropped by "
              "rollbacks %llu; input bytes consumed again after a rollback %llu; rollbacks after the client stopped "
              "(the program ran again to its end) %llu\n",
              indent, ull(s.epoch_lines_externalized), ull(s.epoch_lines_dropped), ull(s.epoch_input_replayed),
              ull(s.epoch_rollbacks_stopped));
  std::printf("%sepochs, agreed history: STAGE %llu, EPOCH %llu (APPLIED %llu, CHAIN %llu, STAGING %llu, ENTRY "
              "%llu); entries replayed independently %llu (staged %llu); STAGE and EPOCH executions digested at "
              "replicas %llu\n",
              indent, ull(s.epoch_hist_stages), ull(s.epoch_hist_epochs), ull(s.epoch_hist_applied),
              ull(s.epoch_hist_chain), ull(s.epoch_hist_staging), ull(s.epoch_hist_entry),
              ull(s.epoch_entries_replayed), ull(s.epoch_entries_staged), ull(s.epoch_replica_audits));
}

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
  if (s.fs_seed > 0) print_fs_stats(s, indent);
  if (s.overload > 0) {
    std::printf("%soverload (%llu seeds): requests in flight at most %llu, deliveries the replicas' machine put off "
                "%llu, frames waiting for it at most %llu (the maxima summed over the seeds)\n",
                indent, ull(s.overload), ull(s.overload_in_flight_max), ull(s.machine_frames_waited),
                ull(s.machine_backlog_max));
  }
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


// Prints the coverage marks of a sweep: in how many seeds each rare path ran.
void print_coverage(const Totals& totals) {
  std::printf("  coverage (seeds where it ran): view change %llu, state transfer %llu, recovered checkpoint ahead of the log adopted %llu, rollback %llu, crash %llu, "
              "crash between persist and send %llu, all-crash %llu, byzantine %llu, partition %llu, read-only %llu, batch hold %llu, quiet primary %llu (released %llu)\n",
              static_cast<unsigned long long>(totals.seeds_with_view_change),
              static_cast<unsigned long long>(totals.seeds_with_state_transfer),
              static_cast<unsigned long long>(totals.seeds_with_checkpoint_adopted),
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
  if (totals.sum.fs_seed == 0) return;
  std::printf("  file-service coverage (of %llu fs seeds, where it ran): speculating clients %llu, state transfer "
              "%llu, view change %llu, rollback at a client %llu, shim no-op %llu, read-only read %llu, crash %llu, "
              "all-crash %llu, byzantine %llu, lies in early replies %llu, rename across directories %llu, fs "
              "predicate failed %llu\n",
              ull(totals.sum.fs_seed), ull(totals.fs_with_speculating_clients), ull(totals.fs_with_state_transfer),
              ull(totals.fs_with_view_change), ull(totals.fs_with_client_rollback), ull(totals.fs_with_shim_noop),
              ull(totals.fs_with_read_only), ull(totals.fs_with_crash), ull(totals.fs_with_all_crash),
              ull(totals.fs_with_byzantine), ull(totals.fs_with_early_lie), ull(totals.fs_with_rename_across_done),
              ull(totals.fs_with_predicate_failed));
  if (totals.fs_with_epochs == 0) return;
  std::printf("  epoch coverage (of %llu seeds with an epoch client, where it ran): an epoch applied %llu, an EPOCH "
              "failed at an entry %llu, at the chain %llu, a rollback at the client %llu, staged entries applied or "
              "replayed %llu, a wrong first reply to a FETCH %llu, held output lines dropped %llu, a rollback after "
              "the client stopped %llu\n",
              ull(totals.fs_with_epochs), ull(totals.fs_with_epoch_applied), ull(totals.fs_with_epoch_entry_failed),
              ull(totals.fs_with_epoch_chain_failed), ull(totals.fs_with_epoch_rollback),
              ull(totals.fs_with_epoch_staged), ull(totals.fs_with_epoch_first_wrong),
              ull(totals.fs_with_epoch_lines_dropped), ull(totals.fs_with_epoch_rollback_stopped));
}

struct Options {
  SimConfig base;
  std::uint64_t seeds = 100;
  std::uint64_t start = 1;
  std::uint64_t jobs = 1;
  bool regressions = false;
  bool fingerprints = false;
};

std::string scenario_list() {
  std::string out = "scenarios:";
  for (const auto& s : bftfs::sim::scenario_names()) out += " " + s;
  for (int i = 1; i < static_cast<int>(bftfs::sim::Strategy::kCount); ++i) {
    out += " " + std::string(bftfs::sim::to_string(static_cast<bftfs::sim::Strategy>(i)));
  }
  return out;
}

// Declares every option on `app`, writing into `o`.
void declare_options(CLI::App& app, Options& o) {
  app.add_option("--seeds", o.seeds, "run N seeds (default 100)");
  app.add_option("--start", o.start, "the first of them (default 1)");
  app.add_option("-j,--jobs", o.jobs, "seeds run at once, each in a process of its own (default: one per CPU)");
  app.add_option("--seed", o.base.seed, "run this one seed in this process and print its report");
  app.add_flag("-v,--verbose", o.base.verbose, "with --seed: print every event and the debug log");
  app.add_flag("--regressions", o.regressions, "run every seed of sim/regression-seeds.txt");
  app.add_flag("--fingerprints", o.fingerprints,
               "print each seed's fingerprint (hash of its delivered frames), one line per seed in seed order");
  app.add_option("--ticks", o.base.fault_ticks, "length of the fault phase in ticks");
  app.add_option("--liveness-ticks", o.base.liveness_ticks_max, "bound on the liveness phase in ticks");
  app.add_option("--f", o.base.f, "faults tolerated (n = 3f+1); default: chosen by the seed")
      ->check(CLI::Range(1, 21));
  app.add_flag_callback("--no-byzantine", [&o] { o.base.byzantine = false; }, "never choose Byzantine replicas");
  app.add_option("--scenario", o.base.scenario, "a scenario or Byzantine strategy (listed below); default random");
  app.add_option("--service", o.base.service, "counter, null or fs (the file service); default: chosen by the seed");
  app.add_option("--cs", o.base.speculation,
                 "PBFT-CS: 1 forces early replies, the shim and speculating clients; 0 forbids the shim and "
                 "speculating clients")
      ->check(CLI::Range(0, 1));
  app.add_option("--epochs", o.base.epochs,
                 "file-service seeds: 1 makes the last client an epoch client (speculation epochs, "
                 "docs/SPECULATION.md §14), 0 never; default: half of the seeds")
      ->check(CLI::Range(0, 1));
  app.footer(scenario_list());
}

// Parses the command line into `o`: -1 to go on, else the exit status (0 after --help, 2 on a usage error).
int parse_options(int argc, char** argv, Options& o, bool& one) {
  // Seeds are independent processes: by default one per online CPU.
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  o.jobs = cpus > 0 ? static_cast<std::uint64_t>(cpus) : 1;
  CLI::App app("bftfs-sim: the seeded whole-cluster simulator", "bftfs-sim");
  declare_options(app, o);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int status = app.exit(e);
    return status == 0 ? 0 : 2;
  }
  one = app.count("--seed") > 0;
  if (const std::string error = bftfs::sim::check_config(o.base); !error.empty()) {
    std::fprintf(stderr, "bftfs-sim: %s\n%s\nRun with --help for more information.\n", error.c_str(),
                 scenario_list().c_str());
    return 2;
  }
  return -1;
}

void print_fingerprint(const SimResult& r) {
  std::printf("seed %llu fingerprint %016llx %s\n", static_cast<unsigned long long>(r.seed),
              static_cast<unsigned long long>(r.stats.fingerprint), r.passed ? "PASS" : "FAIL");
}

int run_one(const Options& o) {
  const SimResult r = bftfs::sim::run_simulation(o.base);
  std::printf("seed %llu: %s\n  scenario: %s\n", static_cast<unsigned long long>(r.seed),
              r.passed ? "PASS" : "FAIL", r.scenario.c_str());
  print_stats(r.stats, "  ");
  if (!r.passed) std::printf("%s", r.failure.c_str());
  if (o.fingerprints) print_fingerprint(r);
  return r.passed ? 0 : 1;
}

// The runs of a sweep: the regression seeds, or --seeds from --start.
int sweep_configs(const Options& o, std::vector<SimConfig>& configs) {
  if (o.regressions) {
    if (const std::string error = bftfs::sim::read_regression_seeds(bftfs::sim::regression_seeds_path(), configs);
        !error.empty()) {
      std::fprintf(stderr, "bftfs-sim: %s\n", error.c_str());
      return 2;
    }
    return -1;
  }
  for (std::uint64_t s = o.start; s < o.start + o.seeds; ++s) {
    SimConfig c = o.base;
    c.seed = s;
    configs.push_back(c);
  }
  return -1;
}

int run_sweep(const Options& o) {
  std::vector<SimConfig> configs;
  if (const int status = sweep_configs(o, configs); status >= 0) return status;
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
  const std::vector<SimResult> results = bftfs::sim::run_many(configs, static_cast<unsigned>(o.jobs), done);

  std::printf("\nsummary: %zu seeds, %zu passed, %zu failed\n", total, total - failed.size(), failed.size());
  if (!failed.empty()) {
    std::sort(failed.begin(), failed.end());
    std::printf("failing seeds:");
    for (auto s : failed) std::printf(" %llu", static_cast<unsigned long long>(s));
    std::printf("\n");
  }
  print_stats(totals.sum, "  ");
  print_coverage(totals);
  if (o.fingerprints) {
    for (const SimResult& r : results) print_fingerprint(r);
  }
  return failed.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  bool one = false;
  if (const int status = parse_options(argc, argv, o, one); status >= 0) return status;
  return one ? run_one(o) : run_sweep(o);
}
