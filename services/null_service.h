// The null service of the BFT paper's micro-benchmarks (a/b: a KiB argument, b KiB result). The op's first 4
// bytes (little-endian u32) give the result size in bytes (at most kNullResultBytesMax); the rest is padding. The
// state is one partition holding the number of requests executed, so checkpoints still change.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "protocol/service.h"

namespace bftfs {

// 1 MiB: below kResultBytesMax by its 4 KiB of slack, which wrappers such as the PBFT-CS shim (a 1-byte status
// header) need; a client asking for more gets the malformed-op result, never a replica that asserts.
inline constexpr std::uint32_t kNullResultBytesMax = 1u << 20;

Bytes null_op(std::uint32_t arg_bytes, std::uint32_t result_bytes);

class NullService final : public Service {
 public:
  explicit NullService(SnapshotStore* store);  // store may be null
  ~NullService() override;
  Bytes execute(const ExecContext& ctx, std::span<const std::uint8_t> op) override;
  bool execute_read_only(NodeId client, std::span<const std::uint8_t> op, Bytes& result) override;
  void commit_through(std::uint64_t seq) override;
  void rollback_to(std::uint64_t seq) override;
  CheckpointId checkpoint(std::uint64_t seq, std::span<const std::uint8_t> engine_state = {}) override;
  void discard_checkpoints_below(std::uint64_t seq) override;
  CheckpointId recovered_checkpoint() const override;
  Bytes recovered_engine_state() const override;
  std::uint64_t partition_count() const override { return 1; }
  const PartitionTree& checkpoint_tree(std::uint64_t seq) const override;
  Bytes read_partition(std::uint64_t seq, std::uint64_t index) const override;
  void begin_install(std::uint64_t target_seq) override;
  void install_partition(std::uint64_t index, std::span<const std::uint8_t> data) override;
  CheckpointId finish_install(std::uint64_t target_seq, std::span<const std::uint8_t> engine_state = {}) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// An in-memory SnapshotStore: the simulator keeps one per replica across simulated crashes.
class MemorySnapshotStore final : public SnapshotStore {
 public:
  void put(const std::string& name, std::span<const std::uint8_t> data) override;
  bool get(const std::string& name, Bytes& out) const override;

 private:
  std::map<std::string, Bytes> files_;
};

}  // namespace bftfs
