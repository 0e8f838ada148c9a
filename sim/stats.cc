// A run's totals (SimStats) and its reports: the failure report with the trace of the last events, the dump on
// an aborting assertion, and the log lines the run counts (simulation.h).
#include "sim/simulation.h"

#include <cstdio>

#include "sim/strfmt.h"

namespace bftfs::sim {

static_assert(kRejectSlots == kRejectReasons);

void Simulation::collect_replica_stats() {
  ReplicaStats total;
  for (NodeId id = 0; id < sc_.n; ++id) {
    ReplicaHost& r = cluster_->host(id);
    add_stats(total, cluster_->replica_stats(id));
    stats_.service_rollbacks += fates_[id].past_service_rollbacks;
    if (r.up) stats_.service_rollbacks += stack(r).recording->rollbacks();
    if (r.byz) {
      stats_.byzantine_lies += r.byz->lies();
      stats_.early_lies += r.byz->early_lies();
      stats_.fake_early_replies += r.byz->fake_early_replies();
    }
  }
  stats_.requests_executed = total.requests_executed;
  stats_.view_changes_started = total.view_changes_started;
  stats_.view_changes_deferred_lagging = total.view_changes_deferred_lagging;
  stats_.new_views_installed = total.new_views_installed;
  stats_.state_transfers = total.state_transfers;
  stats_.recovered_checkpoints_adopted = total.recovered_checkpoints_adopted;
  stats_.replica_rollbacks = total.rollbacks;
  stats_.early_replies_sent = total.early_replies;
  stats_.quiet_batches = total.quiet_batches;
  stats_.quiet_releases = total.quiet_releases;
  stats_.open_batches_discarded = total.open_batches_discarded;
  stats_.requests_deferred_order = total.requests_deferred_order;
  stats_.replica_rejected = total.rejected_bad_authenticator + total.rejected_bad_signature +
                            total.rejected_out_of_window + total.rejected_wrong_view + total.rejected_conflict +
                            total.rejected_invalid;
}

void Simulation::collect_client_stats() {
  for (const auto& c : clients_) {
    const ClientStats& cs = c->core_stats();
    stats_.client_retransmissions += cs.retransmissions;
    stats_.read_only_fallbacks += cs.read_only_fallbacks;
    stats_.replies_rejected += cs.replies_rejected;
    if (c->spec) {
      const SpecClientStats& ss = c->spec->stats();
      stats_.first_delivered += ss.first_delivered;
      stats_.first_withheld_distrusted += ss.first_withheld_distrusted;
      stats_.first_withheld_doomed += ss.first_withheld_doomed;
      stats_.spec_commits += ss.commits;
      stats_.spec_rollbacks += ss.rollbacks;
    }
  }
}

// What the file-service clients drew and what the agreed history did with it (fs seeds).
void Simulation::collect_fs_stats() {
  FsWorkloadStats drawn;
  for (const auto& c : clients_) {
    if (c->fs) drawn.add(c->fs->stats());
    if (c->spec) stats_.fs_dependencies += c->spec->stats().predicates_sent;
  }
  const auto op = [&](fs::OpCode code) { return drawn.ops[static_cast<std::size_t>(code)]; };
  stats_.fs_requests = drawn.requests;
  stats_.fs_compounds = drawn.compounds;
  stats_.fs_expects = drawn.expect_errno + drawn.expect_digest;
  stats_.fs_renames = op(fs::OpCode::kRename);
  stats_.fs_renames_of_dirs = drawn.renames_of_dirs;
  stats_.fs_renames_across = drawn.renames_across_dirs;
  stats_.fs_renames_replacing = drawn.renames_onto_known;
  stats_.fs_renames_into_subtree = drawn.renames_into_subtree;
  stats_.fs_links = op(fs::OpCode::kLink);
  stats_.fs_removes = op(fs::OpCode::kRemove) + op(fs::OpCode::kRmdir);
  const FsHistoryStats& h = fs_check_->stats();
  stats_.fs_executions = h.executions;
  stats_.fs_with_dependencies = h.with_dependencies;
  stats_.fs_shim_noops = h.shim_noops;
  stats_.fs_done = h.done;
  stats_.fs_op_failed = h.op_failed;
  stats_.fs_predicate_failed = h.predicate_failed;
  stats_.fs_compounds_done = h.compounds_done;
  stats_.fs_expects_held = h.expects_held;
  stats_.fs_renames_done = h.renames_done;
  stats_.fs_renames_across_done = h.renames_across_done;
  stats_.fs_links_done = h.links_done;
  stats_.fs_removes_done = h.removes_done;
  const FsOracleStats& o = fs_check_->oracle().stats();
  stats_.fs_read_only_reads = fs_reads_read_only_;
  stats_.fs_reads_checked = o.reads_passed;
  stats_.fs_reads_unverifiable = o.reads_unverifiable;
  stats_.fs_checkpoints_compared = o.checkpoints_compared;
  stats_.fs_invariant_checks = fs_invariant_checks_;
  collect_epoch_stats();
}

void Simulation::collect_epoch_stats() {
  for (const auto& c : clients_) {
    if (!c->epochs) continue;
    const EpochClientStats& e = c->epochs->stats;
    ++stats_.epoch_clients;
    stats_.epoch_program_steps += e.program_steps;
    stats_.epoch_fetches += e.fetches;
    stats_.epoch_firsts_used += e.first_replies_used;
    stats_.epoch_firsts_wrong += e.first_replies_wrong;
    stats_.epoch_inconsistent += e.inconsistent;
    stats_.epoch_reserves += e.reserves;
    stats_.epoch_stages += e.stages;
    stats_.epoch_sealed += e.sealed;
    stats_.epoch_committed += e.committed;
    stats_.epoch_failed += e.failed;
    stats_.epoch_rollbacks += e.rollbacks;
    stats_.epoch_discarded_entries += e.discarded_entries;
    stats_.epoch_lines_externalized += e.lines_externalized;
    stats_.epoch_lines_dropped += e.lines_dropped;
    stats_.epoch_input_replayed += e.input_replayed;
    stats_.epoch_rollbacks_stopped += e.rollbacks_stopped;
  }
  const SpecAuditStats h = fs_check_->spec_stats();
  stats_.epoch_hist_stages = h.stages;
  stats_.epoch_hist_epochs = h.epochs;
  stats_.epoch_hist_applied = h.epochs_applied;
  stats_.epoch_hist_chain = h.epochs_chain;
  stats_.epoch_hist_staging = h.epochs_staging;
  stats_.epoch_hist_entry = h.epochs_entry;
  stats_.epoch_entries_replayed = h.entries_replayed;
  stats_.epoch_entries_staged = h.entries_staged;
  if (!cluster_) return;
  for (NodeId id = 0; id < sc_.n; ++id) {
    const ReplicaHost& r = cluster_->host(id);
    if (r.stack && stack(r).audit) stats_.epoch_replica_audits += stack(r).audit->audited();
  }
}

void Simulation::collect_stats() {
  stats_.ticks = now();
  stats_.steps = steps();
  if (checker_) {
    stats_.completed = checker_->completions();
    stats_.read_completions = checker_->read_completions();
    stats_.committed_seqs = checker_->max_committed_seq();
    stats_.shim_retries = checker_->shim_retries();
  }
  collect_client_stats();
  if (fs_check_) collect_fs_stats();
  if (!cluster_) return;
  collect_replica_stats();
  const ClusterStats& cs = cluster_->stats();
  stats_.crashes = cs.crashes;
  stats_.crashes_between_persist_and_send = cs.crashes_between_persist_and_send;
  stats_.torn_persists = cs.torn_persists;
  stats_.unsynced_records_lost = cs.unsynced_records_lost;
  stats_.sends_held_for_sync = cs.sends_held_for_sync;
  stats_.held_sends_lost = cs.held_sends_lost;
  stats_.frames_rejected = cs.frames_rejected;
  for (std::size_t i = 0; i < kRejectSlots; ++i) stats_.rejected_by_reason[i] = cs.rejected_by_reason[i];
  const NetworkStats& n = cluster_->network().stats();
  stats_.frames_sent = n.sent;
  stats_.frames_delivered = n.delivered;
  stats_.frames_lost = n.lost;
  stats_.frames_duplicated = n.duplicated;
  stats_.frames_partitioned = n.partitioned;
  stats_.frames_to_dead_nodes = n.to_dead_node;
  stats_.machine_frames_waited = n.waited;
  stats_.machine_backlog_max = n.backlog_max;
  stats_.fingerprint = cluster_->fingerprint();
}

std::string Simulation::failure_report(const std::string& what) const {
  std::string repro = fmt("bftfs-sim --seed %llu --ticks %llu", ull(config_.seed), ull(config_.fault_ticks));
  if (config_.f != 0) repro += fmt(" --f %u", config_.f);
  if (!config_.scenario.empty()) repro += " --scenario " + config_.scenario;
  if (!config_.service.empty()) repro += " --service " + config_.service;
  if (!config_.byzantine) repro += " --no-byzantine";
  if (config_.speculation >= 0) repro += fmt(" --cs %d", config_.speculation);
  if (config_.epochs >= 0) repro += fmt(" --epochs %d", config_.epochs);
  return fmt("FAIL seed=%llu step=%llu tick=%llu phase=%s: ", ull(config_.seed), ull(steps()), ull(now()),
             phase_name()) +
         what + "\n  scenario: " + sc_.describe() + "\n  reproduce: " + repro + " -v\n  last " +
         std::to_string(trace_.size()) + " events:\n" + trace_text();
}

std::string Simulation::trace_text() const {
  std::string out;
  for (std::size_t i = 0; i < trace_.size(); ++i) {
    out += "    ";
    out += trace_[(trace_next_ + i) % trace_.size()];
    out += '\n';
  }
  return out;
}

const char* Simulation::phase_name() const {
  switch (phase_) {
    case Phase::kSetup:
      return "setup";
    case Phase::kFault:
      return "fault";
    case Phase::kLiveness:
      return "liveness";
    case Phase::kFinish:
      return "finish";
  }
  return "?";
}

void Simulation::on_log(LogLevel level, std::string_view line) {
  if (level == LogLevel::kError) {
    ++stats_.log_errors;
    // House style: an ERROR line fails a test run unless the test expects it.
    if (log_error_.empty()) log_error_ = std::string(line);
  } else if (level == LogLevel::kWarn) {
    ++stats_.log_warnings;
  }
  event("log " + std::string(line));
}

void Simulation::dump_on_abort() const {
  std::fprintf(stderr, "ABORT seed=%llu step=%llu tick=%llu phase=%s\n  scenario: %s\n  last events:\n%s",
               ull(config_.seed), ull(steps()), ull(now()), phase_name(), sc_.describe().c_str(),
               trace_text().c_str());
  std::fflush(stderr);
}

}  // namespace bftfs::sim
