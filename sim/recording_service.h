// A Service decorator that records what the replication engine executed, for the simulator's checker.
//
// The engine executes tentatively and may roll back (protocol/service.h), so an execution is only evidence
// of the agreed history once it is final: covered by commit_through(s) or by checkpoint(s) (which the engine
// takes only at a committed seq). RecordingService keeps executions tentative until then, drops them on
// rollback_to, and hands final ones to the checker through take_final(). The checker then compares final
// executions across correct replicas and against what clients accepted (sim/checker.h).
//
// It also watches the engine's side of the Service contract (execution in seq order, no execution at or
// below a committed seq, no rollback below the last commit, checkpoints only with nothing executed past
// them) and reports a breach as text rather than asserting, so that the simulator prints the seed and trace.
//
// PBFT-CS seeds (NSDI'09 §3.2, §5) stack the services as
//   Replica -> RecordingService -> shim::Shim -> ExecutionProbe -> CounterService
// and RecordingService then audits the shim on every execution, tentative or early ones included (a breach is
// reported like a contract breach):
//   - the decision: the status the shim returns is the one its own per-client log dictates before the
//     execution (every dependency logged with the predicted digest: executed; the first one missing: retry,
//     dependency unknown; the first one different: retry, predicate failed; an envelope that does not decode:
//     malformed);
//   - the inner service ran (ExecutionProbe) exactly when the status is "executed": no request whose
//     predicate is false ever reaches the counter;
//   - the shim logged digest_of(the result it returned) for the request (unless the truncation rule or the
//     client limit of shim.h leaves it out).
// Its records then carry the envelope's dependencies and the shim status, for the checker's checks against
// the agreed history.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "protocol/forwarding_service.h"
#include "protocol/service.h"
#include "shim/envelope.h"

namespace bftfs::shim {
class Shim;
}

namespace bftfs::sim {

// One execution of an ordered request.
struct ExecRecord {
  std::uint64_t seq = 0;
  std::uint32_t index = 0;  // executions before this one at the same seq (its place in the batch, skips aside)
  NodeId client = 0;
  std::uint64_t request_id = 0;
  std::uint64_t timestamp_ns = 0;  // the batch's agreed time (ExecContext::timestamp_ns)
  // First byte of the (inner) op: counter 1 increment, 2 read; 0 if the op is empty or not a valid envelope.
  std::uint8_t op_kind = 0;
  Digest result_digest;      // digest_of(result): for a shim, of the whole result envelope (Reply::result_digest)
  Bytes result;              // the result itself when at most kRecordedResultBytesMax bytes (or kept whole)
  Bytes op;                  // the op as the engine gave it, when the recording service keeps ops
  // PBFT-CS: the op and the result are shim envelopes (shim/envelope.h).
  bool enveloped = false;
  shim::ShimStatus shim_status = shim::ShimStatus::kExecuted;
  std::vector<shim::Dependency> deps;  // the predicates the request carried
};

inline constexpr std::size_t kRecordedResultBytesMax = 64;

// A pass-through Service that counts executions: placed under the shim, it tells whether the shim let an
// operation reach the inner service.
class ExecutionProbe final : public ForwardingService {
 public:
  // `inner` must outlive this object.
  explicit ExecutionProbe(Service& inner);

  // Service interface: forwards to `inner`.
  Bytes execute(const ExecContext& ctx, std::span<const std::uint8_t> op) override;

  std::uint64_t executions() const { return executions_; }  // execute() calls so far

 private:
  std::uint64_t executions_ = 0;
};

class RecordingService final : public Service {
 public:
  // `inner` must outlive this object. Executions at or below inner.recovered_checkpoint().seq are treated as
  // already committed (a restarted replica never re-executes them). For PBFT-CS seeds, `shim` is `inner` seen
  // as the shim and `probe` the ExecutionProbe under it (both or neither; both must outlive this object).
  // With `keep_ops`, every record also carries its op and its whole result (what a serial-order oracle needs to
  // replay the history: sim/fs_check.h).
  explicit RecordingService(Service& inner, const shim::Shim* shim = nullptr, const ExecutionProbe* probe = nullptr,
                            bool keep_ops = false);

  // Service interface: forwards to `inner`, recording as described above.
  Bytes execute(const ExecContext& ctx, std::span<const std::uint8_t> op) override;
  bool execute_read_only(NodeId client, std::span<const std::uint8_t> op, Bytes& result) override;
  void commit_through(std::uint64_t seq) override;
  void rollback_to(std::uint64_t seq) override;
  CheckpointId checkpoint(std::uint64_t seq, std::span<const std::uint8_t> engine_state = {}) override;
  void discard_checkpoints_below(std::uint64_t seq) override;
  CheckpointId recovered_checkpoint() const override;
  Bytes recovered_engine_state() const override;
  std::uint64_t partition_count() const override;
  const PartitionTree& checkpoint_tree(std::uint64_t seq) const override;
  Bytes read_partition(std::uint64_t seq, std::uint64_t index) const override;
  void begin_install(std::uint64_t target_seq) override;
  void install_partition(std::uint64_t index, std::span<const std::uint8_t> data) override;
  CheckpointId finish_install(std::uint64_t target_seq, std::span<const std::uint8_t> engine_state = {}) override;

  // Executions that became final since the last call, in the order they became final (seq order).
  std::vector<ExecRecord> take_final();
  // The checkpoints the service took (checkpoint) or installed (finish_install, when accepted) since the last
  // call, as (seq, the service's CheckpointId digest), in order.
  std::vector<std::pair<std::uint64_t, Digest>> take_checkpoints();
  // The seq of the state this incarnation's executions start from: the recovered checkpoint, or the target of
  // the last install. The engine executed every seq above it, up to last_executed, itself (in seq order), so
  // its final records cover every seq in (executed_from(), min(last executed, committed_through())].
  std::uint64_t executed_from() const { return executed_from_; }
  // The first breach of the engine's side of the Service contract (or of the shim audit), or "" if none.
  const std::string& contract_error() const { return contract_error_; }

  std::uint64_t committed_through() const { return committed_through_; }
  std::size_t tentative_count() const { return tentative_.size(); }
  std::uint64_t rollbacks() const { return rollbacks_; }
  std::uint64_t rolled_back_executions() const { return rolled_back_executions_; }

 private:
  void finalize_through(std::uint64_t seq);
  void breach(std::string what);
  // The shim audit of one execution (see the top of this file); fills the record's shim fields.
  Bytes execute_audited(const ExecContext& ctx, std::span<const std::uint8_t> op, ExecRecord& rec);

  Service& inner_;
  const shim::Shim* shim_;
  const ExecutionProbe* probe_;
  std::deque<ExecRecord> tentative_;  // increasing seq (several records may share a seq: one batch)
  std::vector<ExecRecord> final_;
  std::uint64_t committed_through_ = 0;
  std::uint64_t last_executed_seq_ = 0;
  std::uint32_t executed_at_seq_ = 0;  // executions so far at last_executed_seq_
  bool installing_ = false;
  bool keep_ops_ = false;
  std::uint64_t executed_from_ = 0;
  std::vector<std::pair<std::uint64_t, Digest>> checkpoints_;
  std::uint64_t rollbacks_ = 0;
  std::uint64_t rolled_back_executions_ = 0;
  std::string contract_error_;
};

}  // namespace bftfs::sim
