// A Service that passes every call to another: the base of the decorators that change or observe a few calls
// (the simulator's probes, audits and sabotage) and forward the rest. One place to change when Service does.
#pragma once

#include <span>
#include <vector>

#include "protocol/service.h"

namespace bftfs {

class ForwardingService : public Service {
 public:
  // `inner` must outlive this object.
  explicit ForwardingService(Service& inner) : inner_(inner) {}

  Bytes execute(const ExecContext& ctx, std::span<const std::uint8_t> op) override { return inner_.execute(ctx, op); }
  bool execute_read_only(NodeId client, std::span<const std::uint8_t> op, Bytes& result) override {
    return inner_.execute_read_only(client, op, result);
  }
  void commit_through(std::uint64_t seq) override { inner_.commit_through(seq); }
  void rollback_to(std::uint64_t seq) override { inner_.rollback_to(seq); }
  CheckpointId checkpoint(std::uint64_t seq, std::span<const std::uint8_t> engine_state = {}) override {
    return inner_.checkpoint(seq, engine_state);
  }
  void discard_checkpoints_below(std::uint64_t seq) override { inner_.discard_checkpoints_below(seq); }
  CheckpointId recovered_checkpoint() const override { return inner_.recovered_checkpoint(); }
  Bytes recovered_engine_state() const override { return inner_.recovered_engine_state(); }
  std::uint64_t partition_count() const override { return inner_.partition_count(); }
  const PartitionTree& checkpoint_tree(std::uint64_t seq) const override { return inner_.checkpoint_tree(seq); }
  Bytes read_partition(std::uint64_t seq, std::uint64_t index) const override {
    return inner_.read_partition(seq, index);
  }
  void begin_install(std::uint64_t target_seq) override { inner_.begin_install(target_seq); }
  void install_partition(std::uint64_t index, std::span<const std::uint8_t> data) override {
    inner_.install_partition(index, data);
  }
  CheckpointId finish_install(std::uint64_t target_seq, std::span<const std::uint8_t> engine_state = {}) override {
    return inner_.finish_install(target_seq, engine_state);
  }
  std::vector<std::uint64_t> damaged_partitions() const override { return inner_.damaged_partitions(); }

 protected:
  Service& inner_;
};

}  // namespace bftfs
