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
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "protocol/service.h"

namespace bftfs::sim {

// One execution of an ordered request.
struct ExecRecord {
  std::uint64_t seq = 0;
  NodeId client = 0;
  std::uint64_t request_id = 0;
  std::uint8_t op_kind = 0;  // first byte of the op (counter: 1 increment, 2 read), 0 if the op is empty
  Digest result_digest;      // digest_of(result)
  Bytes result;              // the result itself when at most kRecordedResultBytesMax bytes, else empty
};

inline constexpr std::size_t kRecordedResultBytesMax = 64;

class RecordingService final : public Service {
 public:
  // `inner` must outlive this object. Executions at or below inner.recovered_checkpoint().seq are treated as
  // already committed (a restarted replica never re-executes them).
  explicit RecordingService(Service& inner);

  // Service interface: forwards to `inner`, recording as described above.
  Bytes execute(const ExecContext& ctx, std::span<const std::uint8_t> op) override;
  bool execute_read_only(NodeId client, std::span<const std::uint8_t> op, Bytes& result) override;
  void commit_through(std::uint64_t seq) override;
  void rollback_to(std::uint64_t seq) override;
  CheckpointId checkpoint(std::uint64_t seq) override;
  void discard_checkpoints_below(std::uint64_t seq) override;
  CheckpointId recovered_checkpoint() const override;
  std::uint64_t partition_count() const override;
  const PartitionTree& checkpoint_tree(std::uint64_t seq) const override;
  Bytes read_partition(std::uint64_t seq, std::uint64_t index) const override;
  void begin_install(std::uint64_t target_seq) override;
  void install_partition(std::uint64_t index, std::span<const std::uint8_t> data) override;
  CheckpointId finish_install(std::uint64_t target_seq) override;

  // Executions that became final since the last call, in the order they became final (seq order).
  std::vector<ExecRecord> take_final();
  // The first breach of the engine's side of the Service contract, or "" if none.
  const std::string& contract_error() const { return contract_error_; }

  std::uint64_t committed_through() const { return committed_through_; }
  std::size_t tentative_count() const { return tentative_.size(); }
  std::uint64_t rollbacks() const { return rollbacks_; }
  std::uint64_t rolled_back_executions() const { return rolled_back_executions_; }

 private:
  void finalize_through(std::uint64_t seq);
  void breach(std::string what);

  Service& inner_;
  std::deque<ExecRecord> tentative_;  // increasing seq (several records may share a seq: one batch)
  std::vector<ExecRecord> final_;
  std::uint64_t committed_through_ = 0;
  std::uint64_t last_executed_seq_ = 0;
  bool installing_ = false;
  std::uint64_t rollbacks_ = 0;
  std::uint64_t rolled_back_executions_ = 0;
  std::string contract_error_;
};

}  // namespace bftfs::sim
