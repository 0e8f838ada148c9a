// The file service's checks in the seeded run: what turns the executions the correct replicas report into the
// agreed history, in seq order, for the serial-order oracle (sim/fs_oracle.h), and what that history did.
//
// Why the agreed history has to be gathered: no one correct replica reports all of it. A replica that catches
// up by state transfer never executes the seqs it skipped; one that restarts re-executes from its recovered
// checkpoint; they report finals at different times. What a correct replica reports is exact, though: after
// each of its steps, its final executions (sim/recording_service.h) are every execution at every seq in
// (executed_from, min(last executed, committed through)], because the engine executes every seq above the state
// it started from or installed, in order, itself (an empty seq, such as a null request of a view change, has no
// executions). So the first correct replica to cover a seq decides its executions; the checker (property 2)
// compares them with every other correct replica's. Seqs are handed to the oracle in order as soon as every seq
// below them is known.
//
// A seq below a known one that no correct replica ever covers is a gap. It cannot happen in a correct run: a
// seq at or below a stable checkpoint was executed and finalized (by the checkpoint) at f+1 correct replicas that
// sent their CHECKPOINT messages after reporting, and one above it by every replica that committed it without a
// state transfer. finish() reports a gap as a violation, rather than let the oracle read past it.
//
// It also counts, from the agreed executions, what the history did with the file service (FsHistoryStats), and,
// in seeds with epoch clients, hands them to EpochReplay (sim/spec_audit.h: checker properties 11 and 13).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/types.h"
#include "sim/fs_oracle.h"
#include "sim/recording_service.h"
#include "sim/spec_audit.h"

namespace bftfs::sim {

// What the agreed history did (every agreed execution, decoded; plain data).
struct FsHistoryStats {
  std::uint64_t executions = 0;      // agreed executions fed to the oracle
  std::uint64_t shim_noops = 0;      // ... the shim turned into no-ops (a shim dependency did not hold)
  std::uint64_t with_dependencies = 0;  // ... carrying shim dependencies (predicates of speculating clients)
  std::uint64_t done = 0;            // executed requests whose every op passed
  std::uint64_t op_failed = 0;       // ... stopped by an op's errno (everything undone)
  std::uint64_t predicate_failed = 0;  // ... stopped by an fs Expect that did not hold
  std::uint64_t compounds_done = 0;  // done requests of two or more ops
  std::uint64_t expects_held = 0;    // fs Expect predicates in done requests
  std::uint64_t renames_done = 0;    // RENAME ops in done requests
  std::uint64_t renames_across_done = 0;  // ... between two different directories
  std::uint64_t links_done = 0;
  std::uint64_t removes_done = 0;    // REMOVE and RMDIR
  std::uint64_t writes_done = 0;
  std::uint64_t creates_done = 0;    // CREATE, MKDIR, SYMLINK, MKNOD
  std::uint64_t gaps = 0;            // seqs missing below a known one at finish (a violation)
};

class FsCheck {
 public:
  // `options` are the oracle's (the replicas' FsOptions, ShimOptions and checkpoint interval). With
  // `replay_epochs`, every agreed execution also goes to an EpochReplay.
  explicit FsCheck(FsOracleOptions options, bool replay_epochs = false);

  // Correct replica `replica` ended a step: `finals` are the executions that became final in it (in seq order),
  // and it has executed every seq in (from, through] itself (see the top of this file). Feeds the oracle every
  // seq that is now known with every seq below it.
  void on_progress(NodeId replica, std::span<const ExecRecord> finals, std::uint64_t from, std::uint64_t through);
  // A correct replica's service took or installed a checkpoint at `seq` with the service digest `digest`.
  void on_checkpoint(std::uint64_t seq, const Digest& digest);
  // The end of the run: reports a gap, else lets the oracle finish (its read and checkpoint checks settle).
  void finish();

  // The oracle, for the read-only results (begin_read, end_read, forget_read).
  FsOracle& oracle() { return oracle_; }
  const FsOracle& oracle() const { return oracle_; }
  // The largest seq below which the agreed history is complete and fed to the oracle.
  std::uint64_t complete_through() const { return complete_; }
  bool failed() const { return !violation_.empty() || oracle_.failed() || (replay_ && replay_->failed()); }
  // The first violation: a gap in the history, the epoch replay's, or the oracle's.
  std::string violation() const {
    if (!violation_.empty()) return violation_;
    return replay_ && replay_->failed() ? replay_->violation() : oracle_.violation();
  }
  const FsHistoryStats& stats() const { return stats_; }
  // The epoch replay (null without one).
  const EpochReplay* replay() const { return replay_.get(); }
  // The epoch replay's counts (zero without one).
  SpecAuditStats spec_stats() const { return replay_ ? replay_->stats() : SpecAuditStats{}; }

 private:
  void feed(std::uint64_t seq, const std::vector<ExecRecord>& execs);
  void count(const ExecRecord& rec);

  FsOracle oracle_;
  std::unique_ptr<EpochReplay> replay_;
  std::uint64_t complete_ = 0;  // every seq at or below it has been fed
  std::map<std::uint64_t, std::vector<ExecRecord>> known_;  // seqs above complete_ whose executions are known
  std::map<NodeId, std::uint64_t> reported_through_;        // per replica: the highest seq it covered
  std::string violation_;
  FsHistoryStats stats_;
};

}  // namespace bftfs::sim
